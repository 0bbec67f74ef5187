"""Workflow memory: how past questions were answered with tools (QUERY / STEPS / OUTCOME).

Retrieved by similarity to the new question, so a known procedure is reused, not re-derived.
Each keeps its provenance: the `thread` it was learned in and the `authors` of its turn (a
comma-separated tag field), so erasing a person finds what came from them. Records from before
have neither.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from redisvl.query.filter import Num, Tag

from memory.keys import WORKFLOW_INDEX, WORKFLOW_PREFIX
from memory.scope import PUBLIC, Scope
from memory.stores.base import Segment, VectorStore, decode, vector_bytes
from memory.stores.entity import joined

_STEP = re.compile(r"^\s*\d+\.\s", re.MULTILINE)


def workflow_text(query: str, steps: list[str], outcome: str) -> str:
    lines = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    return f"QUERY: {query}\nSTEPS:\n{lines}\nOUTCOME: {outcome[:500]}"


class WorkflowStore(VectorStore):
    SCHEMA = {
        "index": {"name": WORKFLOW_INDEX, "prefix": WORKFLOW_PREFIX},
        "fields": [
            {"name": "text", "type": "text"},
            {"name": "num_steps", "type": "numeric"},
            {"name": "created_at", "type": "numeric", "attrs": {"sortable": True}},
            {"name": "audience", "type": "tag"},
            {"name": "thread", "type": "tag"},
            {"name": "authors", "type": "tag"},
            {"name": "rejected", "type": "tag"},  # "1": its turn got a 👎, never reused
        ],
    }
    DEFAULTS = {"audience": PUBLIC}  # workflows from before scopes were learned team-wide

    def __init__(self, redis: Any, embedder: Any) -> None:
        super().__init__(redis, embedder)
        self._reject = redis.register_script(  # never re-creates a forgotten workflow's hash;
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end "  # un-rejects only for
            "if ARGV[1] == '0' and ARGV[2] ~= '' "  # the turn it is (another's 👎 may hold it)
            "and redis.call('HGET', KEYS[1], 'turn') ~= ARGV[2] then return 1 end "
            "redis.call('HSET', KEYS[1], 'rejected', ARGV[1]) return 1"
        )
        self._requery = redis.register_script(  # only the workflow as read, still its question's
            "if redis.call('HGET', KEYS[1], 'text') ~= ARGV[1] "
            "or redis.call('HGET', KEYS[1], 'question') ~= ARGV[2] then return 0 end "
            "redis.call('HSET', KEYS[1], 'text', ARGV[3], ARGV[5], ARGV[4]) return 1"
        )

    def embedding_text(self, record: dict[str, Any]) -> str:
        return record.get("text", "")

    async def add(
        self,
        scope: Scope,
        query: str,
        steps: list[str],
        outcome: str,
        vector: np.ndarray | None = None,
        authors: Iterable[str] | None = None,
        turn: str = "",
        rejected: bool = False,
        question: str = "",
        keyed_by: str = "",
    ) -> str:
        """Store the workflow of a turn in `scope.thread` by `authors` (default: `scope.user`);
        `turn`: the turn's id; `rejected`: its turn got a 👎 (kept, never reused); `question`:
        the stored question's id (forgetting it takes the workflow: memory/governance_learned.py);
        `keyed_by`: the query its key is made from, when not `query` (a question edited before
        its turn's workflow was written keeps the key of the text it was asked as)."""
        authors = [scope.user] if authors is None else list(authors)
        text = workflow_text(query, steps, outcome)
        if vector is None:
            vector = (await self.embedder.embed([text]))[0]
        key = self.key_for(scope, keyed_by or query, steps, outcome)
        if decode(await self.redis.hget(key, "rejected")) == "1":
            rejected = True  # another turn sharing the record got a 👎: it stays rejected
        fields = {
            "tenant": scope.tenant,
            "text": text,
            "num_steps": len(steps),
            "created_at": time.time(),
            "audience": scope.audience,
            "thread": scope.thread,
            "authors": joined("", authors),
            "turn": turn,
            "question": question,
            "rejected": "1" if rejected else "0",
        }
        await self._write(scope.tenant, [(key, fields, vector)])
        return key

    def key_for(self, scope: Scope, query: str, steps: list[str], outcome: str) -> str:
        """The key `add` stores this workflow under: the same workflow written twice (a retried
        background task), or the same question asked again in the thread with the same steps
        (worded differently), is one record; the latest outcome overwrites."""
        text = workflow_text(query, steps, "")
        digest = hashlib.sha1(f"{scope.thread}\n{text}".encode()).hexdigest()[:16]
        return f"{self.key_prefix(scope.tenant)}{digest}"

    async def rewrite(self, tenant: str, workflow_id: str, text: str) -> str:
        """Replace a workflow's text and re-embed it; returns the old text. KeyError when there
        is no such workflow. Its step count follows the new text's numbered lines, if any."""
        key = self.key_of(tenant, workflow_id)
        old = decode(await self.redis.hget(key, "text"))
        if old is None:
            raise KeyError(workflow_id)
        vector = (await self.embedder.embed([text]))[0]
        fields: dict[str, Any] = {"text": text}
        if steps := len(_STEP.findall(text)):
            fields["num_steps"] = steps
        await self._write(tenant, [(key, fields, vector)])
        return old

    async def requery(self, key: str, question: str, old: str, text: str) -> bool:
        """Give the workflow at `key` the text `text` (re-embedded) only if it still says `old`
        and is still `question`'s: a background rewrite never brings back a workflow deleted
        meanwhile, nor overwrites another's change. False when it changed."""
        vector = (await self.embedder.embed([text]))[0]
        args = [old, question, text, vector_bytes(vector), self.VECTOR_FIELD]
        return bool(await self._requery(keys=[key], args=args))

    async def similar(self, scope: Scope, vector: np.ndarray, k: int = 3) -> list[str]:
        """Workflows nearest the question among those `scope` may see (never rejected ones)."""
        return [text for _, text in await self.nearest(scope, vector, k)]

    async def nearest(self, scope: Scope, vector: np.ndarray, k: int = 3) -> list[tuple[str, str]]:
        """(id, text) of the workflows `similar` returns."""
        where = (Num("num_steps") > 0) & self.audience_filter(scope) & (Tag("rejected") != "1")
        rows = await self._nearest(scope.tenant, vector, k, ["text"], where)
        prefix = self.key_prefix(scope.tenant)
        return [(r["id"].removeprefix(prefix), decode(r["text"])) for r in rows]

    async def reject(self, key: str, rejected: bool = True, turn: str = "") -> bool:
        """Mark a workflow (by its key) rejected, or no longer; False when it is gone. With
        `turn`, it is un-rejected only while it is that turn's (turns asking the same share a
        record: one's 👍 does not offer again what another's 👎 rejected)."""
        args = ["1" if rejected else "0", turn]
        return bool(await self._reject(keys=[key], args=args))

    async def all(self, scope: Scope, limit: int = 100, everywhere: bool = False) -> list[str]:
        """Those `scope` may see; `everywhere`: the whole tenant's (for its operator)."""
        where = None if everywhere else self.audience_filter(scope)
        fields = ["text", "created_at"]
        rows = await self._list(scope.tenant, fields, limit, where, sort_by="created_at")
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
