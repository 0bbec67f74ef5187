"""What every memory store shares: the segment it renders, and the RedisVL vector-index base."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from redis.asyncio import Redis
from redis.commands.search.query import Query
from redis.crc import key_slot
from redis.exceptions import ResponseError
from redisvl.index import AsyncSearchIndex
from redisvl.query import FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag
from redisvl.redis.utils import convert_bytes, make_dict
from redisvl.schema import IndexSchema

from memory.embeddings import Embedder
from memory.keys import (
    INDEX_META_KEY,
    index_name,
    index_prefix,
    upgrade_key,
)
from memory.scope import Scope

log = logging.getLogger(__name__)

# One process rebuilds a family's indexes for a new layout; others starting meanwhile wait.
REBUILD_CLAIM_SECONDS = 600  # a process that died while rebuilding frees the claim after this
REBUILD_POLL_SECONDS = 0.2


class IndexModelMismatch(RuntimeError):
    """An index was built with another embedding model than the configured one."""


class ReindexUnfinished(IndexModelMismatch):
    """`arxivscout reindex` stopped part way (or runs now): some records hold the old vectors."""


# Recorded beside a family's indexes while `reindex` re-embeds it, in place of what built them.
REINDEXING = "reindexing"

# Set hash field ARGV[1] to ARGV[3] if it still holds ARGV[2] ('' for none) or holds ARGV[3].
_RECORD_IF_STILL = """
local now = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if now ~= ARGV[2] and now ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


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


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def decode(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def stored_ids(raw: Any) -> list[str]:
    """A stored JSON list of ids (a tool log's `message_ids`, a summary's `children`): none
    for a field or record absent, from before it was kept, or unreadable."""
    try:
        ids = json.loads(decode(raw) or "[]")
    except ValueError:
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


def decoded(row: dict[bytes, Any]) -> dict[bytes, Any]:
    """A reply row with every value decoded (as `decode`) in one pass: cheaper than a call per
    field when a row's fields are all read, as recall's chosen messages' are."""
    return {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in row.items()}


class VectorStore:
    """RedisVL indexes of hashes with one embedding each: one index per tenant.

    Subclasses give the schema as plain data (`SCHEMA`, without the vector field) and say which
    text is embedded (`embedding_text`). This base adds the vector field with the embedder's
    dimensions, records model and dimensions beside the indexes, and refuses to open indexes
    built with another model. Each tenant gets an index of its own over its own keys
    (`<prefix>:<tenant>:...`), created on its first read or write: a query names its tenant's
    index, so no read can cross tenants, and none pays for filtering the other tenants out.
    """

    SCHEMA: ClassVar[dict[str, Any]]
    TENANT_SCOPED: ClassVar[bool] = True
    VECTOR_FIELD: ClassVar[str] = "embedding"
    DEFAULTS: ClassVar[dict[str, str]] = {}  # values of fields that older records lack

    def __init__(self, redis: Redis, embedder: Embedder) -> None:
        self.redis = redis
        self.embedder = embedder
        self._known: set[str] = set()  # indexes known to exist
        self._creating = asyncio.Lock()
        self._reindexing = False  # `reindex` runs in this process: it creates the new indexes
        self._record_if_still = redis.register_script(_RECORD_IF_STILL)

    # -- names and schema ----------------------------------------------------------------------

    @classmethod
    def family(cls) -> str:
        """The indexes' common name: `<family>:<tenant>` per tenant, or the one shared index."""
        return cls.SCHEMA["index"]["name"]

    @classmethod
    def prefix(cls) -> str:
        return cls.SCHEMA["index"]["prefix"]

    def index_name(self, tenant: str | None) -> str:
        return index_name(self.family(), tenant or "" if self.TENANT_SCOPED else None)

    def key_prefix(self, tenant: str | None) -> str:
        return index_prefix(self.prefix(), tenant or "" if self.TENANT_SCOPED else None)

    def key_of(self, tenant: str, record_id: str) -> str:
        """A record's key by its id: the key after the tenant's prefix (the memory page's ids)."""
        return f"{self.key_prefix(tenant)}{record_id}"

    def schema(self, tenant: str | None) -> IndexSchema:
        data = copy.deepcopy(self.SCHEMA)
        data["index"].update(
            name=self.index_name(tenant), prefix=self.key_prefix(tenant), storage_type="hash"
        )
        data["fields"].append(
            {
                "name": self.VECTOR_FIELD,
                "type": "vector",
                "attrs": {
                    "algorithm": "hnsw",
                    "dims": self.embedder.dims,
                    "distance_metric": "cosine",
                    "datatype": "float32",
                },
            }
        )
        return IndexSchema.from_dict(data)

    @property
    def signature(self) -> str:
        return f"{self.embedder.model_name}|{self.embedder.dims}"

    @classmethod
    def layout(cls) -> str:
        """A digest of the schema and the index layout: when it changes, indexes are rebuilt."""
        shape = json.dumps([cls.SCHEMA, cls.TENANT_SCOPED, cls.VECTOR_FIELD], sort_keys=True)
        return hashlib.sha1(shape.encode()).hexdigest()[:12]

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Refuse indexes built with another embedding model; rebuild those of an older layout
        (dropping only the index: the records stay, and are indexed again). Processes starting
        together rebuild once: one claims it, the others wait and look again."""
        while True:
            names = await self.existing_indexes()
            recorded = decode(await self.redis.hget(INDEX_META_KEY, self.family())) or ""
            layout = recorded.partition("#")[2]
            rebuild = bool(recorded or names) and layout != self.layout()
            if names or rebuild or recorded.startswith(REINDEXING):
                self._refuse_other_model(recorded)
            # rebuilt by what was recorded, not by the indexes found: a rebuild that failed
            # after dropping them is done again (its defaults filled) at the next start
            if rebuild:
                claim = upgrade_key(f"index-layout:{self.family()}")
                if await self.redis.set(claim, self.layout(), nx=True, ex=REBUILD_CLAIM_SECONDS):
                    try:
                        await self._rebuild(names, recorded)
                    finally:  # done (recorded) or failed: the next process looks again
                        await self.redis.delete(claim)
                else:
                    await asyncio.sleep(REBUILD_POLL_SECONDS)
                continue  # look again: rebuilt, by this process or another
            if await self._record(recorded):  # not if a reindex started or ended meanwhile
                break
        if not self.TENANT_SCOPED:
            await self._index(None)

    def _refuse_other_model(self, recorded: str) -> None:
        """Raise unless `recorded` (beside the indexes) names this process's model."""
        if recorded.startswith(REINDEXING):
            raise ReindexUnfinished(
                f"Re-embedding the {self.family()} index has not finished (`arxivscout "
                "reindex` stopped part way, or is still running): some records still hold "
                "the old model's vectors. Run `arxivscout reindex` again."
            )
        model = recorded.partition("#")[0]
        if model and model != self.signature:
            model_name, dims = model.split("|")
            raise IndexModelMismatch(
                f"The index {self.family()} was built with {model_name} ({dims} dimensions), "
                f"but the configured embeddings are {self.embedder.model_name} "
                f"({self.embedder.dims} dimensions). Run `arxivscout reindex` to re-embed "
                "everything with the configured model, or switch ARXIVSCOUT_EMBEDDINGS back."
            )

    async def _rebuild(self, names: list[str], recorded: str) -> None:
        """Index the records again under the current layout, and record it as built (unless
        what was `recorded` changed meanwhile: then `open` looks again)."""
        log.warning("rebuilding the %s indexes for their new layout", self.family())
        await self._drop(names)
        await self._fill_defaults()
        tenants = {name.partition(":")[2] for name in names if name != self.family()}
        if self.family() in names and self.TENANT_SCOPED:  # one shared index, from before
            tenants |= {self.tenant_of(decode(key)) async for key in self._keys()}
        for tenant in sorted(tenants, key=str):
            await self._index(tenant)  # Redis indexes the existing records in the background
        await self._record(recorded)

    async def _record(self, expected: str) -> bool:
        """Record this process's model and layout if the family's entry is still `expected`
        ("": none) or says so already; False when a reindex marked or recorded it meanwhile."""
        return bool(
            await self._record_if_still(
                keys=[INDEX_META_KEY], args=[self.family(), expected, self._recorded()]
            )
        )

    def _recorded(self) -> str:
        return f"{self.signature}#{self.layout()}"

    async def _fill_defaults(self) -> None:
        """Give records of an older layout the fields it added (HSETNX: nothing is replaced)."""
        if not self.DEFAULTS:
            return
        pipe = self.redis.pipeline(transaction=False)
        async for key in self._keys():
            for field_name, value in self.DEFAULTS.items():
                pipe.hsetnx(key, field_name, value)
            if len(pipe) >= 1000:
                await pipe.execute()
        await pipe.execute()

    def audience_filter(self, scope: Scope) -> FilterExpression:
        """Only records learned where `scope` may see them (see memory/scope.py)."""
        return Tag("audience") == list(scope.audiences)

    async def existing_indexes(self) -> list[str]:
        """This store's indexes in Redis (a tenant's appears on its first read or write)."""
        listed = [decode(n) for n in await self.redis.execute_command("FT._LIST")]
        return sorted(n for n in listed if n == self.family() or n.startswith(f"{self.family()}:"))

    async def _drop(self, names: list[str]) -> None:
        for name in names:
            try:
                await self.redis.execute_command("FT.DROPINDEX", name)  # keeps the records
            except ResponseError as exc:  # gone already (another process dropped it): fine
                if not unknown_index(exc):
                    raise
            self._known.discard(name)

    async def _index(self, tenant: str | None) -> str:
        """The name of the tenant's index, creating the index on first use."""
        name = self.index_name(tenant)
        if name in self._known:
            return name
        async with self._creating:
            if name not in self._known:
                if not self._reindexing:  # a bot still running the old model, or one too new
                    recorded = await self.redis.hget(INDEX_META_KEY, self.family())
                    self._refuse_other_model(decode(recorded) or "")
                index = AsyncSearchIndex(self.schema(tenant), redis_client=self.redis)
                try:
                    await index.create(overwrite=False)
                except Exception:  # another process created it first
                    if not await index.exists():
                        raise
                # recorded if nothing is: never over what `open` refused or a reindex marks
                await self.redis.hsetnx(INDEX_META_KEY, self.family(), self._recorded())
                self._known.add(name)
        return name

    async def drop_tenant(self, tenant: str) -> None:
        """Delete a tenant's index and every record under its keys."""
        name = self.index_name(tenant)
        if name in await self.existing_indexes():
            await self.redis.execute_command("FT.DROPINDEX", name, "DD")
        self._known.discard(name)
        await delete_matching(self.redis, f"{self.key_prefix(tenant)}*")

    async def info(self, tenant: str | None) -> dict[str, Any]:
        """FT.INFO of the tenant's index, as RedisVL reads it (a dict); sent as reads are."""
        reply = await self._search(tenant, "FT.INFO")
        return convert_bytes(make_dict(reply) if isinstance(reply, list) else reply)

    @property
    def record_embedder(self) -> Any:
        """What embeds this store's records when they are embedded again (`reindex`)."""
        return self.embedder

    async def reindex(self, batch_size: int = 128) -> int:
        """Rebuild the indexes for the current embedder and re-embed every record. Marked as
        under way until the last record is done: a reindex that stops part way (a quota, ^C)
        is refused at the next start (`open`) instead of losing the records not re-embedded."""
        await self.redis.hset(INDEX_META_KEY, self.family(), REINDEXING)
        self._reindexing = True
        try:
            await self._drop(await self.existing_indexes())
            await self._fill_defaults()  # fields an older layout lacked, as a rebuild gives them
            total = 0
            async for keys, texts in self._scan_texts(batch_size):
                vectors = await self.record_embedder.embed(texts)
                pipe = self.redis.pipeline(transaction=False)
                for key, vector in zip(keys, vectors, strict=True):
                    await self._index(self.tenant_of(key))
                    pipe.hset(key, self.VECTOR_FIELD, vector_bytes(vector))
                await pipe.execute()
                total += len(keys)
        finally:
            self._reindexing = False
        await self.redis.hset(INDEX_META_KEY, self.family(), self._recorded())
        return total

    def tenant_of(self, key: str) -> str | None:
        return key[len(self.prefix()) + 1 :].split(":", 1)[0] if self.TENANT_SCOPED else None

    def _keys(self) -> AsyncIterator[Any]:
        return self.redis.scan_iter(match=f"{self.prefix()}:*", count=1000)

    async def _scan_texts(self, batch_size: int) -> AsyncIterator[tuple[list[str], list[str]]]:
        keys: list[str] = []
        async for key in self._keys():
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

    async def _write(
        self, tenant: str | None, items: Iterable[tuple[str, dict[str, Any], np.ndarray]]
    ) -> list[str]:
        await self._index(tenant)  # the index exists before its records: they are indexed now
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
            filter_expression=extra,
            num_results=k,
        )
        return await self._run(tenant, query)

    async def _list(
        self,
        tenant: str | None,
        return_fields: list[str],
        limit: int = 100,
        extra: FilterExpression | None = None,
        sort_by: str | None = None,
    ) -> list[dict[str, Any]]:
        query = FilterQuery(
            filter_expression=extra if extra is not None else "*",
            return_fields=return_fields,
            num_results=limit,
            sort_by=sort_by,
        )
        return await self._run(tenant, query)

    async def _run(self, tenant: str | None, query: Query) -> list[dict[str, Any]]:
        """One FT.SEARCH, its reply read here: RedisVL's `index.query` builds a search handle
        and re-validates on every call, and redis-py's result objects cost more to build than
        a small reply takes to read. Rows are {"id": key, field: raw value}."""
        args: list[Any] = list(query.get_args())
        params = getattr(query, "params", None)
        if params:
            args += ["PARAMS", 2 * len(params), *(x for kv in params.items() for x in kv)]
        reply = await self._search(tenant, "FT.SEARCH", *args)
        return search_rows(reply, query)

    async def _search(self, tenant: str | None, command: str, *args: Any) -> Any:
        """`command` (FT.SEARCH, FT.TAGVALS, FT.INFO) on the tenant's index, created on first
        use. An index this process knew but another dropped is created again, and the command
        sent once more, when the family is still recorded as built by this process's model and
        layout and no layout rebuild runs (`_recreatable`): a tenant erasure dropped it, maybe
        long ago, and every read of the tenant would fail until a restart. A drop by a layout
        rebuild or a reindex of a newer process (`_rebuild`, `reindex`) recreates the index with
        its own layout: this process, maybe of the old one, must not create it first, so the
        read fails and the name stays known (the next read finds the rebuilt index). Writes
        need no such check: records written while the index was missing are indexed by the
        FT.CREATE (it scans the existing keys)."""
        name = await self._index(tenant)
        try:
            return await self.redis.execute_command(command, name, *args)
        except ResponseError as exc:
            if not unknown_index(exc) or not await self._recreatable(tenant):
                raise
        self._known.discard(name)
        return await self.redis.execute_command(command, await self._index(tenant), *args)

    async def _recreatable(self, tenant: str | None) -> bool:
        """Whether a missing index of the tenant may be created by this process: the family's
        entry holds exactly this process's model and layout (not REINDEXING; an older-layout
        process never matches a newer one's), and no layout rebuild holds its claim (`open`).
        A rebuild claims before it drops and records its layout before it frees the claim: the
        entry is read before the claim and again after it, so one read finds any rebuild."""
        if not self.TENANT_SCOPED or not tenant:
            return False
        claim = upgrade_key(f"index-layout:{self.family()}")
        if not await self._built_by_this() or await self.redis.exists(claim):
            return False
        return await self._built_by_this()

    async def _built_by_this(self) -> bool:
        recorded = await self.redis.hget(INDEX_META_KEY, self.family())
        return decode(recorded) == self._recorded()


def unknown_index(exc: ResponseError) -> bool:
    """Whether Redis refused a command for naming an index that does not exist."""
    return bool(re.search(r"unknown index name|no such index", str(exc), re.IGNORECASE))


async def delete_matching(redis: Redis, pattern: str) -> int:
    """Delete every key matching `pattern`, in batches (SCAN, not KEYS: Redis stays responsive)."""
    deleted, batch = 0, []
    async for key in redis.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += await delete_keys(redis, batch)
            batch = []
    if batch:
        deleted += await delete_keys(redis, batch)
    return deleted


async def delete_keys(redis: Redis, keys: Iterable[str | bytes]) -> int:
    """DEL `keys` with one DEL per hash slot, sent together: a sharded Redis refuses a DEL over
    keys of two slots (a tenant's documents spread over many). Returns how many existed."""
    by_slot: dict[int, list[str | bytes]] = {}
    for key in keys:
        by_slot.setdefault(key_slot(key.encode() if isinstance(key, str) else key), []).append(key)
    if not by_slot:
        return 0
    pipe = redis.pipeline(transaction=False)
    for group in by_slot.values():
        pipe.delete(*group)
    return sum(await pipe.execute())


def search_rows(reply: Any, query: Query) -> list[dict[str, Any]]:
    """FT.SEARCH's reply, RESP2 or RESP3, as rows."""
    if isinstance(reply, dict):  # RESP3
        results = reply.get(b"results", reply.get("results", []))
        return [_row(r.get(b"id", r.get("id")), r.get(b"extra_attributes", {})) for r in results]
    step = 1 + bool(query._with_scores) + (not query._no_content)
    rows = []
    for i in range(1, len(reply), step):
        fields = reply[i + step - 1] if not query._no_content else []
        rows.append(_row(reply[i], dict(zip(fields[::2], fields[1::2], strict=True))))
    return rows


def _row(key: Any, fields: dict[Any, Any]) -> dict[str, Any]:
    return {"id": decode(key), **{decode(k): v for k, v in fields.items()}}
