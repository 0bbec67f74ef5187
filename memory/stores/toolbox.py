"""Toolbox memory: one record per tool, so each turn offers the model only the relevant tools.

Tools are code: their records change only when a new version registers them. So each process
reads the toolbox index once (again after `CATALOG_SECONDS`, or when it registers tools) and
ranks the tools against the question's vector in memory: the same cosine ranking as a KNN
query, without a Redis query on every turn.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from memory.keys import TOOLBOX_INDEX, TOOLBOX_PREFIX
from memory.stores.base import VectorStore, decode

CATALOG_SECONDS = 300.0


class ToolboxStore(VectorStore):
    TENANT_SCOPED = False  # tools are code, the same for every tenant
    SCHEMA = {
        "index": {"name": TOOLBOX_INDEX, "prefix": TOOLBOX_PREFIX},
        "fields": [
            {"name": "name", "type": "tag"},
            {"name": "description", "type": "text"},
            {"name": "signature", "type": "text"},
        ],
    }

    _loaded: tuple[float, list[str], np.ndarray] | None = None

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
        self._loaded = None  # read the catalog again on the next question
        if changed:
            vectors = await self.embedder.embed([self.embedding_text(r) for r in changed])
            await self._write(
                None,
                [
                    (f"{self.prefix()}:{r['name']}", r, v)
                    for r, v in zip(changed, vectors, strict=True)
                ],
            )
        return len(changed)

    async def similar(self, vector: np.ndarray, k: int = 5) -> list[str]:
        names, matrix = await self._catalog()
        if not names:
            return []
        order = np.argsort(-(matrix @ np.asarray(vector, dtype=np.float32)), kind="stable")
        return [names[i] for i in order[:k]]

    async def _catalog(self) -> tuple[list[str], np.ndarray]:
        if self._loaded is None or time.monotonic() - self._loaded[0] > CATALOG_SECONDS:
            rows = await self._list(None, ["name"], limit=1000)
            keys = [r["id"] for r in rows]
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.hget(key, self.VECTOR_FIELD)
            blobs = await pipe.execute()
            found = [(decode(r["name"]), b) for r, b in zip(rows, blobs, strict=True) if b]
            matrix = np.array(
                [np.frombuffer(b, dtype=np.float32) for _, b in found], dtype=np.float32
            )
            self._loaded = (time.monotonic(), [n for n, _ in found], matrix.reshape(len(found), -1))
        return self._loaded[1], self._loaded[2]
