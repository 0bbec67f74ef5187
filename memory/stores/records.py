"""The base of the per-thread record stores (summaries, tool logs): one hash per record and a
sorted set per thread that lists the thread's records in creation order."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, ClassVar, Generic, TypeVar

from redis.asyncio import Redis

from memory.keys import tenant_key, thread_key
from memory.stores.base import decode

R = TypeVar("R")


class UnknownRecord(KeyError):
    """No record with this id in this tenant."""

    what = "record"

    def __str__(self) -> str:
        return f"No {self.what} with id {self.args[0]!r} in this workspace."


class ThreadRecordStore(Generic[R]):
    """Records are dataclasses with `id`, `thread_id` and `created_at`."""

    KIND: ClassVar[str]  # the key part of a record, e.g. "summary"
    PLURAL: ClassVar[str]  # the key part of a thread's index, e.g. "summaries"
    RECORD: ClassVar[type]
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ()
    MISSING: ClassVar[type[UnknownRecord]] = UnknownRecord

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        hints = typing.get_type_hints(self.RECORD)
        self._types = {f.name: hints[f.name] for f in dataclasses.fields(self.RECORD)}

    def key(self, tenant: str, record_id: str) -> str:
        return tenant_key(tenant, self.KIND, record_id)

    def thread_index(self, tenant: str, thread_id: str) -> str:
        return thread_key(tenant, thread_id, self.PLURAL)

    async def save(self, tenant: str, record: R) -> R:
        fields = dataclasses.asdict(record)
        for name in self.JSON_FIELDS:
            fields[name] = json.dumps(fields[name], ensure_ascii=False)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key(tenant, record.id), mapping=fields)
        pipe.zadd(self.thread_index(tenant, record.thread_id), {record.id: record.created_at})
        await pipe.execute()
        return record

    async def delete(self, tenant: str, record: R) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key(tenant, record.id))
        pipe.zrem(self.thread_index(tenant, record.thread_id), record.id)
        await pipe.execute()

    async def get(self, tenant: str, record_id: str) -> R:
        row = await self.redis.hgetall(self.key(tenant, record_id.strip()))
        if not row:
            raise self.MISSING(record_id)
        return self._decode(row)

    async def ids(
        self, tenant: str, thread_id: str, newest_first: bool = False, limit: int = 0
    ) -> list[str]:
        index, stop = self.thread_index(tenant, thread_id), (limit - 1 if limit else -1)
        rows = await (self.redis.zrevrange if newest_first else self.redis.zrange)(index, 0, stop)
        return [decode(r) for r in rows]

    async def for_thread(
        self, tenant: str, thread_id: str, newest_first: bool = False, limit: int = 0
    ) -> list[R]:
        ids = await self.ids(tenant, thread_id, newest_first, limit)
        pipe = self.redis.pipeline(transaction=False)
        for record_id in ids:
            pipe.hgetall(self.key(tenant, record_id))
        return [self._decode(row) for row in await pipe.execute() if row]

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
