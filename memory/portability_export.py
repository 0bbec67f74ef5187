"""Export: a tenant's memory, or one thread's, as the records of an export (the format:
memory/portability.py), and `dumps`, a record as its line.

Read store by store and page by page, so a large tenant is never held in memory whole.
"""

from __future__ import annotations

import base64
import json
import time
import typing
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, fields
from typing import Any

from memory.browse import channel_of
from memory.governance import NotFound
from memory.keys import (
    dm_people_key,
    messages_key,
    papers_key,
    summarized_count_key,
    thread_channels_key,
    threads_key,
    validate_tenant,
    validate_thread,
    watch_posted_key,
)
from memory.portability_check import END, HEADER, PLURALS, VERSION
from memory.scope import legacy_audience
from memory.stores.base import VectorStore, decode
from memory.stores.records import ThreadRecordStore
from memory.stores.watches import WatchStore

PAGE = 1000  # messages read per LRANGE, records per pipeline
CHANNEL_PROBE = 20  # messages whose episodic entries may name a thread's channel


def dumps(record: dict[str, Any]) -> str:
    """One record as its line (without the newline)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _types(store: ThreadRecordStore) -> dict[str, Any]:
    hints = typing.get_type_hints(store.RECORD)
    return {f.name: hints[f.name] for f in fields(store.RECORD)}


def end_line(counts: Counter[str]) -> dict[str, Any]:
    """An export's last line: how many records of each kind it holds. An import refuses a file
    without it (cut short); `counts` are by the kinds' plurals."""
    return {"kind": END, "counts": dict(counts)}


async def ended(records: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """The records, then their end line."""
    counts: Counter[str] = Counter()
    async for record in records:
        if record["kind"] in PLURALS:
            counts[PLURALS[record["kind"]]] += 1
        yield record
    yield end_line(counts)


def _record_out(row: dict, types: dict[str, Any], json_fields: tuple[str, ...]) -> dict[str, Any]:
    """A per-thread record's hash as JSON: its JSON fields parsed, numbers as numbers, the rest
    as the strings stored. Fields the record type does not know are left out: the stores
    never read them, and an import refuses them."""
    out: dict[str, Any] = {}
    for raw_name, raw_value in row.items():
        name, value = decode(raw_name), decode(raw_value)
        if name not in types:
            continue
        if name in json_fields:
            value = json.loads(value)
        elif types.get(name) in (int, float):
            value = types[name](float(value))
        out[name] = value
    order = {name: i for i, name in enumerate(types)}  # the record type's order
    return dict(sorted(out.items(), key=lambda item: order[item[0]]))


class Exporter:
    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis

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

    def export_thread(self, tenant: str, thread: str) -> AsyncIterator[dict[str, Any]]:
        """One thread: its messages, summaries and tool logs, then the end line. `NotFound` (at
        the first record) for an unknown one."""
        return ended(self._export_thread(tenant, thread))

    def export_tenant(self, tenant: str) -> AsyncIterator[dict[str, Any]]:
        """Everything the tenant's memory holds but episodic entries (made again on import),
        then the end line."""
        return ended(self._export_tenant(tenant))

    async def _export_thread(self, tenant: str, thread: str) -> AsyncIterator[dict[str, Any]]:
        validate_thread(thread)
        score = await self.redis.zscore(threads_key(tenant), thread)
        if score is None and not await self.redis.exists(messages_key(tenant, thread)):
            raise NotFound("thread", thread)
        yield self.header(tenant, thread)
        async for record in self._thread(tenant, thread, score or 0.0):
            yield record

    async def _export_tenant(self, tenant: str) -> AsyncIterator[dict[str, Any]]:
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
        async for record in self._watches(tenant):
            yield record

    async def _watches(self, tenant: str) -> AsyncIterator[dict]:
        """The tenant's topic watches, each with its schedule (paused or not) and the papers its
        digests posted (so a digest after an import does not post them again)."""
        for watch in await WatchStore(self.redis).all(tenant):
            record = asdict(watch)
            del record["tenant"]
            posted = await self.redis.zrange(
                watch_posted_key(tenant, watch.id), 0, -1, withscores=True
            )
            yield {
                "kind": "watch",
                "watch": record,
                "posted": {decode(arxiv_id): at for arxiv_id, at in posted},
            }

    async def _thread(self, tenant: str, thread: str, score: float) -> AsyncIterator[dict]:
        key = messages_key(tenant, thread)
        summarized = decode(await self.redis.get(summarized_count_key(tenant, thread)))
        rows = await self.redis.lrange(key, 0, PAGE - 1)  # the first page names the channel too
        line = {
            "kind": "thread",
            "thread": thread,
            "last_active": score,
            "summarized": None if summarized is None else int(summarized),
            "channel": await self._channel(tenant, thread, rows[:CHANNEL_PROBE]),
        }
        if parent := await self._parent(tenant, thread):
            line["parent"] = parent
        if rows and (person := await self._dm_person(tenant, thread, rows[0])):
            line["dm_person"] = person
        yield line
        start = 0
        while rows:
            for row in rows:
                yield {"kind": "message", "thread": thread, "message": json.loads(row)}
            start += len(rows)
            rows = await self.redis.lrange(key, start, start + PAGE - 1)
        for kind, store in (
            ("summary", self.memory.summaries),
            ("tool_log", self.memory.tool_logs),
        ):
            async for record in self._records(kind, store, tenant, thread):
                yield record
        async for record in self._turns(tenant, thread):
            yield record

    async def _turns(self, tenant: str, thread: str) -> AsyncIterator[dict]:
        """The thread's turn records (with their feedback), oldest first."""
        records = self.memory.turn_records
        ids = list(reversed(await records.ids(tenant, thread)))
        for start in range(0, len(ids), PAGE):
            page = ids[start : start + PAGE]
            found = await records.get_many(tenant, page)
            for turn_id in page:
                if turn_id in found:
                    turn = {k: v for k, v in found[turn_id].to_json().items() if k != "tenant"}
                    yield {"kind": "turn", "thread": thread, "turn": turn}

    async def _dm_person(self, tenant: str, thread: str, first: bytes) -> str | None:
        """Whose DM the thread's place (its first message's) is, as appends recorded it
        (memory/keys.py `dm_people_key`): where that person's own messages are tombstones, an
        import could not tell it from them, and their erasure would leave the bot's answers."""
        place = json.loads(first).get("audience") or legacy_audience(thread)
        if not place.startswith("dm:"):
            return None
        return decode(await self.redis.hget(dm_people_key(tenant), place))

    async def _parent(self, tenant: str, thread: str) -> str | None:
        """A Discord thread's channel, as the bot noted it (memory/governance_places.py
        `note_thread`): a deleted channel's threads are found by it."""
        prefix = f"discord:{tenant}:"
        if not thread.startswith(prefix):
            return None
        return decode(await self.redis.hget(thread_channels_key(tenant), thread[len(prefix) :]))

    async def _channel(self, tenant: str, thread: str, rows: list[bytes]) -> str:
        """The channel episodic memory keeps for the thread's first messages, `rows` (the
        thread id's own, when none is indexed)."""
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
