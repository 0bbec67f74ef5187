"""The base of the per-thread record stores (summaries, tool logs): one hash per record and a
sorted set per thread that lists the thread's records in creation order."""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from redis.asyncio import Redis

from memory.keys import record_key, thread_records_key
from memory.scope import Scope, legacy_audience, narrowest
from memory.shorten import shortened
from memory.stores.base import decode

R = TypeVar("R")


ID_SHOWN = 50  # of an id that names no record, what the answer echoes


class UnknownRecord(KeyError):
    """No record with this id in this tenant. Its words are said to whoever asked, on any
    platform: the id they typed is echoed cut (a Discord option holds up to 6,000
    characters, an answer 2,000)."""

    what = "record"

    def __str__(self) -> str:
        typed = str(self.args[0])
        return f"No {self.what} with id {shortened(typed, ID_SHOWN)!r} here."


class ThreadRecordStore(Generic[R]):
    """Records are dataclasses with `id`, `thread_id`, `created_at` and `audience` (who may
    see them: `Scope.audience` of the place they were written in, or narrower for what they
    hold: `save`)."""

    KIND: ClassVar[str]  # the key part of a record, e.g. "summary"
    PLURAL: ClassVar[str]  # the key part of a thread's index, e.g. "summaries"
    RECORD: ClassVar[type]
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ()
    MISSING: ClassVar[type[UnknownRecord]] = UnknownRecord
    # whether whoever asks in a thread may read its records whatever their audience
    # (`Scope.may_show`): only for a kind that holds nothing but its own thread's words (a
    # summary); any other (a tool log holds what a tool read across the team) is read by
    # `Scope.can_see` alone
    OWN_THREAD_SHOWN: ClassVar[bool] = False

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        hints = typing.get_type_hints(self.RECORD)
        self._types = {f.name: hints[f.name] for f in dataclasses.fields(self.RECORD)}

    def key(self, tenant: str, record_id: str) -> str:
        return record_key(tenant, self.KIND, record_id)

    def thread_index(self, scope: Scope) -> str:
        return thread_records_key(scope.tenant, scope.thread, self.PLURAL)

    def fields(self, record: R) -> dict[str, Any]:
        """A record as its hash stores it."""
        data = dataclasses.asdict(record)
        for name in self.JSON_FIELDS:
            data[name] = json.dumps(data[name], ensure_ascii=False)
        return data

    async def save(self, scope: Scope, record: R) -> R:
        """Store a record of `scope.thread` for `scope.audience`, or for the narrower audience
        the record was given for what it holds (`narrowest`: a summary of a walled person's
        words in a public channel is that channel's private memory)."""
        pipe = self.redis.pipeline(transaction=True)
        self._stored(pipe, scope, record)
        await pipe.execute()
        return record

    def _stored(self, pipe: Any, scope: Scope, record: R) -> None:
        """`save`'s writes, queued on a transaction `pipe` (a store may add its own to it)."""
        record.audience = narrowest([scope.audience, record.audience])
        pipe.hset(self.key(scope.tenant, record.id), mapping=self.fields(record))
        pipe.zadd(self.thread_index(scope), {record.id: record.created_at})

    async def delete(self, scope: Scope, record: R) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key(scope.tenant, record.id))
        pipe.zrem(self.thread_index(scope), record.id)
        await pipe.execute()

    async def listed(
        self, tenant: str, threads: Iterable[str]
    ) -> dict[str, list[tuple[str, float]]]:
        """Each thread's record ids with their scores (creation times), in one pipeline."""
        threads = list(threads)
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.zrange(thread_records_key(tenant, thread, self.PLURAL), 0, -1, withscores=True)
        rows = await pipe.execute()
        return {
            t: [(decode(i), float(score)) for i, score in row]
            for t, row in zip(threads, rows, strict=True)
        }

    async def remove(self, tenant: str, by_thread: dict[str, Iterable[str]]) -> int:
        """Delete records (hash and index entry), in one pipeline; how many existed."""
        pipe = self.redis.pipeline(transaction=False)
        for thread, ids in by_thread.items():
            ids = list(ids)
            if ids:
                pipe.delete(*(self.key(tenant, i) for i in ids))
                pipe.zrem(thread_records_key(tenant, thread, self.PLURAL), *ids)
        replies = await pipe.execute() if len(pipe) else []
        return sum(int(n) for n in replies[::2])

    async def get(self, scope: Scope, record_id: str) -> R:
        """The record, if `scope` may see it (or it is of the asker's own thread, for a kind
        that holds only its thread's words: `OWN_THREAD_SHOWN`); otherwise it is not found,
        whatever exists."""
        row = await self.redis.hgetall(self.key(scope.tenant, record_id.strip()))
        if not row:
            raise self.MISSING(record_id)
        record = self._decode(row)
        audience = record.audience or legacy_audience(record.thread_id)
        shown = (
            scope.may_show(audience, record.thread_id)
            if self.OWN_THREAD_SHOWN
            else scope.can_see(audience)
        )
        if not shown:
            raise self.MISSING(record_id)
        return record

    async def exists_in(self, scope: Scope) -> bool:
        """True when `scope.thread` has at least one record of this kind."""
        return bool(await self.redis.exists(self.thread_index(scope)))

    async def ids(self, scope: Scope, newest_first: bool = False, limit: int = 0) -> list[str]:
        index, stop = self.thread_index(scope), (limit - 1 if limit else -1)
        rows = await (self.redis.zrevrange if newest_first else self.redis.zrange)(index, 0, stop)
        return [decode(r) for r in rows]

    async def for_thread(self, scope: Scope, newest_first: bool = False, limit: int = 0) -> list[R]:
        ids = await self.ids(scope, newest_first, limit)
        return list((await self.get_many(scope.tenant, ids)).values())

    async def get_many(self, tenant: str, ids: Iterable[str]) -> dict[str, R]:
        """Records by id, in the order asked, those that exist (no audience check: for
        governance and the thread's own reads)."""
        ids = list(dict.fromkeys(ids))
        pipe = self.redis.pipeline(transaction=False)
        for record_id in ids:
            pipe.hgetall(self.key(tenant, record_id))
        rows = await pipe.execute()
        return {i: self._decode(row) for i, row in zip(ids, rows, strict=True) if row}

    def _decode(self, row: dict) -> R:
        data: dict[str, Any] = {}
        for raw_name, raw_value in row.items():
            name, value = decode(raw_name), decode(raw_value)
            kind = self._types.get(name)
            if kind is None:
                continue
            if name in self.JSON_FIELDS:
                value = json.loads(value)
            elif kind in (float, int):
                value = kind(float(value))
            data[name] = value
        return self.RECORD(**data)
