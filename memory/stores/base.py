"""What every memory store shares: the segment it renders, and the RedisVL vector-index base."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from redis.asyncio import Redis
from redisvl.index import AsyncSearchIndex
from redisvl.query import BaseQuery, FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag
from redisvl.schema import IndexSchema

from memory.embeddings import Embedder
from memory.keys import INDEX_META_KEY, validate_tenant


class IndexModelMismatch(RuntimeError):
    """An index was built with another embedding model than the configured one."""


@dataclass
class Segment:
    """One `## <Name> Memory` block of the context window."""

    name: str
    description: str
    usage: str
    items: list[str] = field(default_factory=list)
    empty_note: str = "(nothing stored yet)"

    @property
    def heading(self) -> str:
        return f"## {self.name} Memory"

    def render(self) -> str:
        body = "\n\n".join(self.items) if self.items else self.empty_note
        return (
            f"{self.heading}\nWhat it is: {self.description}\nHow to use it: {self.usage}\n\n{body}"
        )


@lru_cache(maxsize=1024)
def tenant_filter(tenant: str) -> str:
    return str(Tag("tenant") == tenant)


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def decode(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class VectorStore:
    """A tenant-scoped RedisVL index of hashes with one embedding each.

    Subclasses give the schema as plain data (`SCHEMA`, without the vector field) and say which
    text is embedded (`embedding_text`). This base adds the vector field with the embedder's
    dimensions, records model and dimensions beside the index, refuses to open an index built
    with another model, and puts the tenant filter on every query so no read crosses tenants.
    """

    SCHEMA: ClassVar[dict[str, Any]]
    TENANT_SCOPED: ClassVar[bool] = True
    VECTOR_FIELD: ClassVar[str] = "embedding"

    def __init__(self, redis: Redis, embedder: Embedder) -> None:
        self.redis = redis
        self.embedder = embedder
        self.index = AsyncSearchIndex(self.schema(embedder.dims), redis_client=redis)
        self._ft = redis.ft(self.index_name())

    # -- schema and lifecycle -----------------------------------------------------------------

    @classmethod
    def index_name(cls) -> str:
        return cls.SCHEMA["index"]["name"]

    @classmethod
    def prefix(cls) -> str:
        return cls.SCHEMA["index"]["prefix"]

    @classmethod
    def schema(cls, dims: int) -> IndexSchema:
        data = copy.deepcopy(cls.SCHEMA)
        data["index"].setdefault("storage_type", "hash")
        data["fields"].append(
            {
                "name": cls.VECTOR_FIELD,
                "type": "vector",
                "attrs": {
                    "algorithm": "hnsw",
                    "dims": dims,
                    "distance_metric": "cosine",
                    "datatype": "float32",
                },
            }
        )
        return IndexSchema.from_dict(data)

    @property
    def signature(self) -> str:
        return f"{self.embedder.model_name}|{self.embedder.dims}"

    async def open(self) -> None:
        """Create the index if needed; refuse one built with another embedding model."""
        recorded = decode(await self.redis.hget(INDEX_META_KEY, self.index_name()))
        if await self.index.exists():
            if recorded and recorded != self.signature:
                model, dims = recorded.split("|")
                raise IndexModelMismatch(
                    f"The index {self.index_name()} was built with {model} ({dims} dimensions), "
                    f"but the configured embeddings are {self.embedder.model_name} "
                    f"({self.embedder.dims} dimensions). Run `arxivscout reindex` to re-embed "
                    "everything with the configured model, or switch ARXIVSCOUT_EMBEDDINGS back."
                )
        else:
            await self.index.create(overwrite=False)
        await self.redis.hset(INDEX_META_KEY, self.index_name(), self.signature)

    async def reindex(self, batch_size: int = 128) -> int:
        """Rebuild the index for the current embedder and re-embed every record."""
        await self.index.delete(drop=False)
        await self.index.create(overwrite=True, drop=False)
        total = 0
        async for keys, texts in self._scan_texts(batch_size):
            vectors = await self.embedder.embed(texts)
            pipe = self.redis.pipeline(transaction=False)
            for key, vector in zip(keys, vectors, strict=True):
                pipe.hset(key, self.VECTOR_FIELD, vector_bytes(vector))
            await pipe.execute()
            total += len(keys)
        await self.redis.hset(INDEX_META_KEY, self.index_name(), self.signature)
        return total

    async def _scan_texts(self, batch_size: int) -> AsyncIterator[tuple[list[str], list[str]]]:
        keys: list[str] = []
        async for key in self.redis.scan_iter(match=f"{self.prefix()}:*", count=1000):
            keys.append(decode(key))
            if len(keys) >= batch_size:
                yield keys, await self._texts(keys)
                keys = []
        if keys:
            yield keys, await self._texts(keys)

    async def _texts(self, keys: list[str]) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        rows = await pipe.execute()
        return [self.embedding_text({decode(k): decode(v) for k, v in row.items()}) for row in rows]

    def embedding_text(self, record: dict[str, Any]) -> str:
        """The text of a stored record that its vector embeds."""
        raise NotImplementedError

    # -- writes and reads ---------------------------------------------------------------------

    def _scope(self, tenant: str | None, extra: FilterExpression | None = None) -> str | None:
        """The query filter: the tenant's, and `extra`; as text (built once per tenant)."""
        if not self.TENANT_SCOPED:
            return str(extra) if extra is not None else None
        scope = tenant_filter(validate_tenant(tenant or ""))
        return f"({scope} {extra})" if extra is not None else scope

    async def _write(self, items: Iterable[tuple[str, dict[str, Any], np.ndarray]]) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        keys = []
        for key, fields, vector in items:
            mapping = {
                k: (json.dumps(v) if isinstance(v, list | dict) else v) for k, v in fields.items()
            }
            mapping = {k: v for k, v in mapping.items() if v is not None}
            mapping[self.VECTOR_FIELD] = vector_bytes(vector)
            pipe.hset(key, mapping=mapping)
            keys.append(key)
        await pipe.execute()
        return keys

    async def _nearest(
        self,
        tenant: str | None,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        extra: FilterExpression | None = None,
    ) -> list[dict[str, Any]]:
        query = VectorQuery(
            vector=vector_bytes(vector),
            vector_field_name=self.VECTOR_FIELD,
            return_fields=return_fields,
            filter_expression=self._scope(tenant, extra),
            num_results=k,
        )
        return await self._run(query)

    async def _list(
        self,
        tenant: str | None,
        return_fields: list[str],
        limit: int = 100,
        extra: FilterExpression | None = None,
        sort_by: str | None = None,
    ) -> list[dict[str, Any]]:
        scope = self._scope(tenant, extra)
        query = FilterQuery(
            filter_expression=scope if scope is not None else "*",
            return_fields=return_fields,
            num_results=limit,
            sort_by=sort_by,
        )
        return await self._run(query)

    async def _run(self, query: BaseQuery) -> list[dict[str, Any]]:
        """One FT.SEARCH on a handle made once: RedisVL's `index.query` builds a new search
        handle and re-validates on every call, which a turn's five reads pay five times."""
        result = await self._ft.search(query.query, query_params=query.params)
        if isinstance(result, dict):  # RESP3
            return [
                {"id": r["id"], **r.get("extra_attributes", {})} for r in result.get("results", [])
            ]
        return [{k: v for k, v in vars(doc).items() if k != "payload"} for doc in result.docs]
