"""Workflow memory: how past questions were answered with tools (QUERY / STEPS / OUTCOME).

Retrieved by similarity to the new question, so a known procedure is reused, not re-derived.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from redisvl.query.filter import Num

from memory.stores.base import Segment, VectorStore, decode


def workflow_text(query: str, steps: list[str], outcome: str) -> str:
    lines = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    return f"QUERY: {query}\nSTEPS:\n{lines}\nOUTCOME: {outcome[:500]}"


class WorkflowStore(VectorStore):
    SCHEMA = {
        "index": {"name": "arxivscout_workflow", "prefix": "arxivscout:workflow"},
        "fields": [
            {"name": "text", "type": "text"},
            {"name": "num_steps", "type": "numeric"},
            {"name": "created_at", "type": "numeric", "attrs": {"sortable": True}},
        ],
    }

    def embedding_text(self, record: dict[str, Any]) -> str:
        return record.get("text", "")

    async def add(
        self,
        tenant: str,
        query: str,
        steps: list[str],
        outcome: str,
        vector: np.ndarray | None = None,
    ) -> str:
        text = workflow_text(query, steps, outcome)
        if vector is None:
            vector = (await self.embedder.embed([text]))[0]
        key = f"{self.key_prefix(tenant)}{uuid.uuid4().hex[:16]}"
        fields = {
            "tenant": tenant,
            "text": text,
            "num_steps": len(steps),
            "created_at": time.time(),
        }
        await self._write(tenant, [(key, fields, vector)])
        return key

    async def similar(self, tenant: str, vector: np.ndarray, k: int = 3) -> list[str]:
        rows = await self._nearest(tenant, vector, k, ["text"], Num("num_steps") > 0)
        return [decode(r["text"]) for r in rows]

    async def all(self, tenant: str, limit: int = 100) -> list[str]:
        rows = await self._list(tenant, ["text", "created_at"], limit, sort_by="created_at")
        return [decode(r["text"]) for r in rows]

    @staticmethod
    def segment(texts: list[str]) -> Segment:
        return Segment(
            name="Workflow",
            description="procedures that answered similar questions before: the query, the tool steps, the outcome.",
            usage="plan your tool calls from them; adapt the steps to this question, do not copy them blindly.",
            items=texts,
            empty_note="(no similar past workflows)",
        )
