"""Toolbox memory: one record per tool, so each turn offers the model only the relevant tools."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from memory.stores.base import VectorStore, decode


class ToolboxStore(VectorStore):
    TENANT_SCOPED = False  # tools are code, the same for every tenant
    SCHEMA = {
        "index": {"name": "arxivscout_toolbox", "prefix": "arxivscout:tool"},
        "fields": [
            {"name": "name", "type": "tag"},
            {"name": "description", "type": "text"},
            {"name": "signature", "type": "text"},
        ],
    }

    def embedding_text(self, record: dict[str, Any]) -> str:
        return f"{record.get('name', '')}{record.get('signature', '')}: {record.get('description', '')}"

    async def register(self, records: list[dict[str, str]]) -> int:
        """Index tool records (name, description, signature); unchanged ones are not re-embedded."""
        pipe = self.redis.pipeline(transaction=False)
        for record in records:
            pipe.hget(f"{self.prefix()}:{record['name']}", "digest")
        stored = await pipe.execute()
        changed = []
        for record, digest in zip(records, stored, strict=True):
            fresh = hashlib.sha1(self.embedding_text(record).encode()).hexdigest()
            if decode(digest) != fresh:
                changed.append({**record, "digest": fresh})
        if changed:
            vectors = await self.embedder.embed([self.embedding_text(r) for r in changed])
            await self._write(
                (f"{self.prefix()}:{r['name']}", r, v)
                for r, v in zip(changed, vectors, strict=True)
            )
        return len(changed)

    async def similar(self, vector: np.ndarray, k: int = 5) -> list[str]:
        rows = await self._nearest(None, vector, k, ["name"])
        return [decode(r["name"]) for r in rows]
