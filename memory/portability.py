"""Export and import of a tenant's memory (or one thread's) as JSON Lines.

One JSON object per line, each with a `kind`. The first line is the header:
`{"kind": "arxivscout-export", "version": 1, "tenant": ..., "thread": ... (null for a whole
tenant), "exported_at": ..., "embeddings": {"model": ..., "dims": ...}}`. Then:

- `retention` (a whole tenant's own setting, if it has one): `days`, null for "kept for ever";
- `thread`: `thread`, `last_active` (its score in the thread list), `summarized` (the
  summarized-prefix counter), `channel` (where its messages were said, for episodic memory);
  then its `message`s (each as stored, tombstones included), `summary`s and `tool_log`s (each
  `listed` at its score in the thread's index, or null: a merged child);
- `paper` (the papers-hash record), then its `chunk`s, then `entity` and `workflow`: `id` (the
  key after the tenant's prefix), `fields` as stored, `vector` (base64 of float32).

Exports are read store by store and page by page, so a large tenant is never held in memory
whole. An import checks every line first and writes only a file that is whole: a malformed line
is a `BadExportLine` naming it, and nothing is written. It refuses a tenant that holds anything
(`TenantNotEmpty`), writes the same keys the stores write (thread scores, summarized-prefix
counters, the thread indexes of summaries and tool logs, papers after their chunks), and indexes
the messages for episodic recall. Vectors are reused when the export's embedding model is the
configured one, and embedded again otherwise. An import that was interrupted leaves a marker:
the next import into that tenant clears what it wrote and starts again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import time
import typing
import uuid
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from redis.exceptions import ResponseError

from memory.browse import channel_of
from memory.embeddings import background_embedding
from memory.governance import NotFound
from memory.keys import (
    InvalidName,
    import_lock_key,
    import_partial_key,
    messages_key,
    papers_key,
    retention_key,
    summarized_count_key,
    threads_key,
    validate_tenant,
    validate_thread,
)
from memory.locks import OwnedLocks
from memory.retention import InvalidRetention, check_days
from memory.scope import Scope, legacy_audience
from memory.stores.base import VectorStore, decode
from memory.stores.conversation import ConversationStore
from memory.stores.episodic import Episode
from memory.stores.records import ThreadRecordStore

HEADER = "arxivscout-export"
VERSION = 1
PAGE = 1000  # messages read per LRANGE, records per pipeline
BATCH = 256  # records written (and embedded) together
CHANNEL_PROBE = 20  # messages whose episodic entries may name a thread's channel
MAX_ID = 1024
LOCK_TTL_MS = 120_000
VECTOR_KINDS = ("chunk", "entity", "workflow")
PLURALS = {"thread": "threads", "message": "messages", "summary": "summaries",
           "tool_log": "tool_logs", "paper": "papers", "chunk": "chunks", "entity": "entities",
           "workflow": "workflows", "retention": "retention"}  # fmt: skip


class BadExportLine(ValueError):
    """A line of an export that cannot be imported; nothing was written."""

    def __init__(self, line_no: int, why: str) -> None:
        super().__init__(line_no, why)
        self.line_no, self.why = line_no, why

    def __str__(self) -> str:
        return f"Line {self.line_no} of the export: {self.why} Nothing was imported."


class TenantNotEmpty(ValueError):
    """An import into a tenant that already holds memory (it would mix two memories)."""

    def __init__(self, tenant: str) -> None:
        super().__init__(tenant)

    def __str__(self) -> str:
        return (
            f"The tenant {self.args[0]!r} already holds memory: an export is imported into an "
            "empty tenant only. Choose another tenant (--tenant). Nothing was imported."
        )


class ImportBusy(ValueError):
    """Another import into the same tenant is running."""

    def __str__(self) -> str:
        return f"Another import into the tenant {self.args[0]!r} is running; try again later."


def dumps(record: dict[str, Any]) -> str:
    """One record as its line (without the newline)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _types(store: ThreadRecordStore) -> dict[str, Any]:
    hints = typing.get_type_hints(store.RECORD)
    return {f.name: hints[f.name] for f in fields(store.RECORD)}


def _record_out(row: dict, types: dict[str, Any], json_fields: tuple[str, ...]) -> dict[str, Any]:
    """A per-thread record's hash as JSON: its JSON fields parsed, numbers as numbers, the rest
    (fields the record type does not know included) as the strings stored."""
    out: dict[str, Any] = {}
    for raw_name, raw_value in row.items():
        name, value = decode(raw_name), decode(raw_value)
        if name in json_fields:
            value = json.loads(value)
        elif types.get(name) in (int, float):
            value = types[name](float(value))
        out[name] = value
    order = {name: i for i, name in enumerate(types)}  # the record type's order, then the rest
    return dict(sorted(out.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def _record_in(record: dict[str, Any], json_fields: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: json.dumps(value, ensure_ascii=False)
        if name in json_fields or not isinstance(value, str | int | float) or value is True
        or value is False else value
        for name, value in record.items()
    }  # fmt: skip


class Portability:
    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._locks = OwnedLocks(memory.redis)

    # -- export ---------------------------------------------------------------------------------

    def header(self, tenant: str, thread: str | None) -> dict[str, Any]:
        embedder = self.memory.embedder
        return {
            "kind": HEADER,
            "version": VERSION,
            "tenant": tenant,
            "thread": thread,
            "exported_at": time.time(),
            "embeddings": {"model": embedder.model_name, "dims": embedder.dims},
        }

    async def export_thread(self, tenant: str, thread: str) -> AsyncIterator[dict[str, Any]]:
        """One thread: its messages, summaries and tool logs. `NotFound` for an unknown one."""
        validate_thread(thread)
        score = await self.redis.zscore(threads_key(tenant), thread)
        if score is None and not await self.redis.exists(messages_key(tenant, thread)):
            raise NotFound("thread", thread)
        yield self.header(tenant, thread)
        async for record in self._thread(tenant, thread, score or 0.0):
            yield record

    async def export_tenant(self, tenant: str) -> AsyncIterator[dict[str, Any]]:
        """Everything the tenant's memory holds but episodic entries (made again on import)."""
        validate_tenant(tenant)
        yield self.header(tenant, None)
        has_own, days = await self.memory.retention.own(tenant)
        if has_own:
            yield {"kind": "retention", "days": days}
        for thread, score in await self.memory.conversation.threads(tenant):
            async for record in self._thread(tenant, thread, score):
                yield record
        async for record in self._papers(tenant):
            yield record
        for kind, store in (("entity", self.memory.entities), ("workflow", self.memory.workflows)):
            prefix = store.key_prefix(tenant)
            keys = sorted(
                [decode(k) async for k in self.redis.scan_iter(match=f"{prefix}*", count=PAGE)]
            )
            async for record in self._vectors(kind, store, tenant, keys):
                yield record

    async def _thread(self, tenant: str, thread: str, score: float) -> AsyncIterator[dict]:
        key = messages_key(tenant, thread)
        summarized = decode(await self.redis.get(summarized_count_key(tenant, thread)))
        yield {
            "kind": "thread",
            "thread": thread,
            "last_active": score,
            "summarized": None if summarized is None else int(summarized),
            "channel": await self._channel(tenant, thread),
        }
        start = 0
        while rows := await self.redis.lrange(key, start, start + PAGE - 1):
            for row in rows:
                yield {"kind": "message", "thread": thread, "message": json.loads(row)}
            start += len(rows)
        for kind, store in (
            ("summary", self.memory.summaries),
            ("tool_log", self.memory.tool_logs),
        ):
            async for record in self._records(kind, store, tenant, thread):
                yield record

    async def _channel(self, tenant: str, thread: str) -> str:
        """The channel episodic memory keeps for the thread's first messages (the thread id's
        own, when none is indexed)."""
        rows = await self.redis.lrange(messages_key(tenant, thread), 0, CHANNEL_PROBE - 1)
        ids = [json.loads(r).get("id", "") for r in rows]
        pipe = self.redis.pipeline(transaction=False)
        for message_id in ids:
            pipe.hget(self.memory.episodes.key(tenant, message_id), "channel")
        found = [decode(c) for c in await pipe.execute()] if ids else []
        return next((c for c in found if c is not None), channel_of(thread))

    async def _records(
        self, kind: str, store: ThreadRecordStore, tenant: str, thread: str
    ) -> AsyncIterator[dict]:
        """A thread's summaries or tool logs: those its index lists, then (level by level) the
        summaries merged into them."""
        index = await store.listed(tenant, [thread])
        listed = dict(index[thread])
        types, json_fields = _types(store), store.JSON_FIELDS
        pending, seen = list(listed), set(listed)
        while pending:
            batch, pending = pending[:PAGE], pending[PAGE:]
            pipe = self.redis.pipeline(transaction=False)
            for record_id in batch:
                pipe.hgetall(store.key(tenant, record_id))
            for record_id, row in zip(batch, await pipe.execute(), strict=True):
                if not row:
                    continue
                record = _record_out(row, types, json_fields)
                yield {
                    "kind": kind,
                    "thread": thread,
                    "listed": listed.get(record_id),
                    kind: record,
                }
                children = [c for c in record.get("children") or [] if c not in seen]
                seen.update(children)
                pending += children

    async def _papers(self, tenant: str) -> AsyncIterator[dict]:
        kb = self.memory.knowledge_base
        rows = await self.redis.hgetall(papers_key(tenant))
        papers = {decode(k): v for k, v in rows.items()}
        for arxiv_id in sorted(papers):
            record = json.loads(papers[arxiv_id])
            yield {"kind": "paper", "paper": record}
            keys = [kb.chunk_key(tenant, arxiv_id, i) for i in range(int(record.get("chunks", 0)))]
            async for chunk in self._vectors("chunk", kb, tenant, keys):
                yield chunk

    async def _vectors(
        self, kind: str, store: VectorStore, tenant: str, keys: list[str]
    ) -> AsyncIterator[dict]:
        prefix, vector_field = store.key_prefix(tenant), store.VECTOR_FIELD.encode()
        for start in range(0, len(keys), PAGE):
            batch = keys[start : start + PAGE]
            pipe = self.redis.pipeline(transaction=False)
            for key in batch:
                pipe.hgetall(key)
            for key, row in zip(batch, await pipe.execute(), strict=True):
                if not row:
                    continue
                vector = row.pop(vector_field, b"")
                values = {decode(k): decode(v) for k, v in sorted(row.items())}
                values.pop("tenant", None)
                yield {
                    "kind": kind,
                    "id": key[len(prefix) :],
                    "fields": values,
                    "vector": base64.b64encode(vector).decode("ascii"),
                }

    # -- import ---------------------------------------------------------------------------------

    async def import_records(
        self, tenant: str, records: AsyncIterable[dict] | Iterable[dict]
    ) -> dict[str, int]:
        """Import an export's records (in file order; record n is line n) into an empty tenant;
        returns how many of each kind were written."""
        many = isinstance(records, AsyncIterable)
        rows = [r async for r in records] if many else list(records)
        return await self._import(tenant, lambda: enumerate(rows, 1))

    async def import_lines(self, tenant: str, lines: Callable[[], Iterable[str]]) -> dict[str, int]:
        """Import JSON Lines; `lines` opens them afresh for each of the two passes (a check,
        then the writes), so a large file is never held in memory."""

        def parsed() -> Iterable[tuple[int, Any]]:
            for number, line in enumerate(lines(), 1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except ValueError:
                    raise BadExportLine(number, "it is not JSON.") from None

        return await self._import(tenant, parsed)

    async def _import(
        self, tenant: str, source: Callable[[], Iterable[tuple[int, Any]]]
    ) -> dict[str, int]:
        validate_tenant(tenant)
        check = _Check(self.memory.embedder)
        for number, record in source():
            check.line(number, record)
        check.done()
        async with self._importing(tenant) as renew:
            writer = _Writer(self.memory, tenant, check.reembed)
            for _, record in source():
                await writer.write(record)
                await renew()
            await writer.finish()
        return dict(writer.counts)

    @contextlib.asynccontextmanager
    async def _importing(self, tenant: str) -> AsyncIterator[Callable[[], Any]]:
        """One import per tenant at a time, into an empty tenant (or over what an interrupted
        import left); the marker stays if this one fails."""
        lock, token = import_lock_key(tenant), uuid.uuid4().hex
        if not await self._locks.acquire(lock, token, LOCK_TTL_MS):
            raise ImportBusy(tenant)
        renewed = time.monotonic()

        async def renew() -> None:
            nonlocal renewed
            if time.monotonic() - renewed > LOCK_TTL_MS / 3000:
                renewed = time.monotonic()
                await self._locks.renew(lock, token, LOCK_TTL_MS)

        try:
            if await self.redis.exists(import_partial_key(tenant)):
                await self.memory.drop_tenant(tenant)  # what an interrupted import wrote
            elif not await self.is_empty(tenant):
                raise TenantNotEmpty(tenant)
            await self.redis.set(import_partial_key(tenant), token)
            yield renew
            await self.redis.delete(import_partial_key(tenant))
        finally:
            await self._locks.release(lock, token)

    async def is_empty(self, tenant: str) -> bool:
        """True when the tenant holds no threads, papers, retention setting or indexed records."""
        keys = (threads_key(tenant), papers_key(tenant), retention_key(tenant))
        if await self.redis.exists(*keys):
            return False
        listed = {decode(n) for n in await self.redis.execute_command("FT._LIST")}
        for store in self.memory.vector_stores:
            name = store.index_name(tenant)
            if not store.TENANT_SCOPED or name not in listed:
                continue
            try:
                reply = await self.redis.execute_command("FT.SEARCH", name, "*", "LIMIT", 0, 0)
            except ResponseError:  # dropped meanwhile
                continue
            total = reply.get("total_results", 0) if isinstance(reply, dict) else reply[0]
            if int(total):
                return False
        return True


# -- checking an export ---------------------------------------------------------------------------


class _Bad(Exception):
    """Why a record is malformed (the line number is added by `_Check.line`)."""


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise _Bad(why)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _id(value: Any, what: str) -> str:
    _need(
        isinstance(value, str) and 0 < len(value) <= MAX_ID, f"its {what} is missing or too long."
    )
    _need(not any(ord(c) < 32 for c in value), f"its {what} holds control characters.")
    return value


def _object(record: dict, name: str) -> dict:
    value = record.get(name)
    _need(isinstance(value, dict), f"its {name!r} must be a JSON object.")
    return value


class _Check:
    """Reads every record before anything is written: the header first, known kinds with their
    fields, threads declared before their messages and records, no id twice."""

    def __init__(self, embedder: Any) -> None:
        self.model = (embedder.model_name, embedder.dims)
        self.header: dict | None = None
        self.reembed = False
        self.threads: set[str] = set()
        self.ids: dict[str, set[str]] = {}

    def line(self, number: int, record: Any) -> None:
        try:
            self._record(record)
        except _Bad as bad:
            raise BadExportLine(number, str(bad)) from None

    def done(self) -> None:
        if self.header is None:
            raise BadExportLine(1, "the file is empty.")

    def _record(self, record: Any) -> None:
        _need(isinstance(record, dict), "it is not a JSON object.")
        kind = record.get("kind")
        if self.header is None:
            _need(
                kind == HEADER,
                f"this is not an ArxivScout export (its first line must be "
                f'the header, {{"kind": "{HEADER}", ...}}).',
            )
            version = record.get("version")
            _need(
                version == VERSION,
                f"export version {version!r} cannot be read (this version reads {VERSION}).",
            )
            embeddings = record.get("embeddings") or {}
            self.reembed = (embeddings.get("model"), embeddings.get("dims")) != self.model
            self.header = record
            return
        _need(kind != HEADER, "a second header: two exports joined?")
        _need(kind in PLURALS, f"unknown kind {kind!r}.")
        getattr(self, f"_{kind}")(record)

    def _unique(self, kind: str, item_id: str) -> None:
        seen = self.ids.setdefault(kind, set())
        _need(item_id not in seen, f"the {kind} {item_id!r} appears twice.")
        seen.add(item_id)

    def _declared(self, record: dict) -> str:
        thread = record.get("thread")
        _need(thread in self.threads, f"its thread {thread!r} has no thread line before it.")
        return thread

    def _retention(self, record: dict) -> None:
        days = record.get("days")
        if days is not None:
            try:
                check_days(days)
            except InvalidRetention as exc:
                raise _Bad(str(exc)) from None
        self._unique("retention", "")

    def _thread(self, record: dict) -> None:
        try:
            thread = validate_thread(record.get("thread"))
        except InvalidName as exc:
            raise _Bad(str(exc)) from None
        _need(thread not in self.threads, f"the thread {thread!r} appears twice.")
        _need(_is_number(record.get("last_active")), "its 'last_active' must be a number.")
        summarized = record.get("summarized")
        _need(
            summarized is None or (type(summarized) is int and summarized >= 0),
            "its 'summarized' must be a count or null.",
        )
        _need(isinstance(record.get("channel", ""), str), "its 'channel' must be a string.")
        self.threads.add(thread)

    def _message(self, record: dict) -> None:
        self._declared(record)
        message = _object(record, "message")
        self._unique("message", _id(message.get("id"), "message id"))
        _need(
            message.get("role") in ConversationStore.ROLES,
            f"its role is not one of {', '.join(ConversationStore.ROLES)}.",
        )
        _need(isinstance(message.get("content"), str), "its content must be a string.")
        _need(_is_number(message.get("timestamp")), "its timestamp must be a number.")

    def _thread_record(self, kind: str, record: dict) -> None:
        self._declared(record)
        _need(
            record.get("listed") is None or _is_number(record.get("listed")),
            "its 'listed' must be a number or null.",
        )
        self._unique(kind, _id(_object(record, kind).get("id"), f"{kind} id"))

    def _summary(self, record: dict) -> None:
        self._thread_record("summary", record)
        for name in ("message_ids", "children"):
            _need(isinstance(record["summary"].get(name, []), list), f"its {name} is not a list.")

    def _tool_log(self, record: dict) -> None:
        self._thread_record("tool_log", record)

    def _paper(self, record: dict) -> None:
        paper = _object(record, "paper")
        self._unique("paper", _id(paper.get("arxiv_id"), "arxiv_id"))
        _need(type(paper.get("chunks", 0)) is int, "its chunk count must be a whole number.")

    def _vector_record(self, kind: str, record: dict) -> None:
        self._unique(kind, _id(record.get("id"), "id"))
        values = _object(record, "fields")
        _need(all(isinstance(v, str) for v in values.values()), "its fields must be strings.")
        vector = record.get("vector")
        _need(isinstance(vector, str), "its vector must be base64 text.")
        if not self.reembed:
            try:
                size = len(base64.b64decode(vector, validate=True))
            except (binascii.Error, ValueError):
                raise _Bad("its vector is not base64.") from None
            _need(size == 4 * self.model[1], f"its vector does not have {self.model[1]} floats.")

    def _chunk(self, record: dict) -> None:
        self._vector_record("chunk", record)

    def _entity(self, record: dict) -> None:
        self._vector_record("entity", record)

    def _workflow(self, record: dict) -> None:
        self._vector_record("workflow", record)


# -- writing a checked export ---------------------------------------------------------------------


@dataclass
class _ThreadState:
    channel: str
    count: int = 0  # messages written: the next one's position
    last_ts: float | None = None  # the previous message's timestamp (tombstones' too)
    episodes: list[Episode] = field(default_factory=list)


class _Writer:
    """Writes checked records through the stores' key layout, in batches."""

    def __init__(self, memory: Any, tenant: str, reembed: bool) -> None:
        self.memory, self.redis, self.tenant, self.reembed = memory, memory.redis, tenant, reembed
        self.counts: Counter[str] = Counter()
        self.pipe = self.redis.pipeline(transaction=False)
        self.threads: dict[str, _ThreadState] = {}
        self.papers: dict[str, str] = {}
        self.vectors: dict[str, list[dict]] = {kind: [] for kind in VECTOR_KINDS}
        self.stores: dict[str, Any] = {
            "chunk": memory.knowledge_base, "entity": memory.entities,
            "workflow": memory.workflows, "summary": memory.summaries,
            "tool_log": memory.tool_logs,
        }  # fmt: skip

    async def write(self, record: dict) -> None:
        kind = record["kind"]
        if kind == HEADER:
            return
        self.counts[PLURALS[kind]] += 1
        if kind == "retention":
            await self.memory.retention.set(self.tenant, record.get("days"))
        elif kind == "thread":
            self._thread(record)
        elif kind == "message":
            await self._message(record["thread"], record["message"])
        elif kind in ("summary", "tool_log"):
            store, item = self.stores[kind], record[kind]
            self.pipe.hset(
                store.key(self.tenant, item["id"]), mapping=_record_in(item, store.JSON_FIELDS)
            )
            if record.get("listed") is not None:
                index = store.thread_index(Scope(self.tenant, record["thread"]))
                self.pipe.zadd(index, {item["id"]: record["listed"]})
        elif kind == "paper":
            self.papers[record["paper"]["arxiv_id"]] = json.dumps(record["paper"])
        else:
            self.vectors[kind].append(record)
            if len(self.vectors[kind]) >= BATCH:
                await self._vectors(kind)
        if len(self.pipe) >= PAGE:
            await self.pipe.execute()

    def _thread(self, record: dict) -> None:
        thread = record["thread"]
        self.threads[thread] = _ThreadState(record.get("channel") or "")
        self.pipe.zadd(threads_key(self.tenant), {thread: record["last_active"]})
        if record.get("summarized") is not None:
            self.pipe.set(summarized_count_key(self.tenant, thread), record["summarized"])

    async def _message(self, thread: str, message: dict) -> None:
        state = self.threads[thread]
        self.pipe.rpush(messages_key(self.tenant, thread), dumps(message))
        seq, previous, state.last_ts = state.count, state.last_ts, float(message["timestamp"])
        state.count += 1
        if message.get("forgotten") or not message["content"].strip():
            return
        state.episodes.append(
            Episode(
                message["id"],
                thread,
                state.channel,
                audience=message.get("audience") or legacy_audience(thread),
                author=message.get("author") or "",
                author_name=message.get("author_name") or "",
                role=message["role"],
                text=message["content"],
                ts=state.last_ts,
                seq=seq,
                previous_ts=previous,
            )
        )
        if len(state.episodes) >= BATCH:
            await self._episodes(thread)

    async def _episodes(self, thread: str) -> None:
        state = self.threads[thread]
        if not state.episodes:
            return
        await self.pipe.execute()  # the messages before their episodic entries
        scope = Scope(self.tenant, thread, channel=state.channel)
        with background_embedding():
            await self.memory.episodes.add(scope, state.episodes)
        self.counts["episodes"] += len(state.episodes)
        state.episodes = []

    async def _vectors(self, kind: str) -> None:
        records, self.vectors[kind] = self.vectors[kind], []
        if not records:
            return
        store: VectorStore = self.stores[kind]
        prefix = store.key_prefix(self.tenant)
        values = [{**r["fields"], "tenant": self.tenant} for r in records]
        if self.reembed:
            vectors = await store.embedder.embed([store.embedding_text(v) for v in values])
            self.counts["re-embedded"] += len(records)
        else:
            vectors = [
                np.frombuffer(base64.b64decode(r["vector"]), dtype=np.float32) for r in records
            ]
        await store._write(
            self.tenant,
            [
                (prefix + r["id"], v, vector)
                for r, v, vector in zip(records, values, vectors, strict=True)
            ],
        )

    async def finish(self) -> None:
        for thread in self.threads:
            await self._episodes(thread)
        for kind in VECTOR_KINDS:
            await self._vectors(kind)
        if self.papers:  # last: a paper counts as present once its chunks are searchable
            self.pipe.hset(papers_key(self.tenant), mapping=self.papers)
        await self.pipe.execute()
