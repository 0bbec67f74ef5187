"""Summary memory: durable notes that replace older messages of a thread, expandable again.

A summary is a hash (id, thread, description, text, the ids of the messages it covers); each
thread keeps a sorted set of its summary ids in creation order.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from redis.asyncio import Redis

from memory.keys import tenant_key, thread_key
from memory.stores.base import Segment, decode


class UnknownSummary(KeyError):
    def __str__(self) -> str:
        return f"No summary with id {self.args[0]!r} in this workspace."


@dataclass
class Summary:
    thread_id: str
    description: str
    text: str
    message_ids: list[str]
    id: str = field(default_factory=lambda: f"sum_{uuid.uuid4().hex[:10]}")
    created_at: float = field(default_factory=time.time)


class SummaryStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @staticmethod
    def key(tenant: str, summary_id: str) -> str:
        return tenant_key(tenant, "summary", summary_id)

    @staticmethod
    def thread_index(tenant: str, thread_id: str) -> str:
        return thread_key(tenant, thread_id, "summaries")

    async def save(self, tenant: str, summary: Summary) -> Summary:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            self.key(tenant, summary.id),
            mapping={
                "id": summary.id,
                "thread_id": summary.thread_id,
                "description": summary.description,
                "text": summary.text,
                "message_ids": json.dumps(summary.message_ids),
                "created_at": summary.created_at,
            },
        )
        pipe.zadd(self.thread_index(tenant, summary.thread_id), {summary.id: summary.created_at})
        await pipe.execute()
        return summary

    async def delete(self, tenant: str, summary: Summary) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key(tenant, summary.id))
        pipe.zrem(self.thread_index(tenant, summary.thread_id), summary.id)
        await pipe.execute()

    async def get(self, tenant: str, summary_id: str) -> Summary:
        row = await self.redis.hgetall(self.key(tenant, summary_id.strip()))
        if not row:
            raise UnknownSummary(summary_id)
        data = {decode(k): decode(v) for k, v in row.items()}
        return Summary(
            id=data["id"],
            thread_id=data["thread_id"],
            description=data["description"],
            text=data["text"],
            message_ids=json.loads(data["message_ids"]),
            created_at=float(data["created_at"]),
        )

    async def for_thread(self, tenant: str, thread_id: str) -> list[Summary]:
        ids = await self.redis.zrange(self.thread_index(tenant, thread_id), 0, -1)
        return [await self.get(tenant, decode(i)) for i in ids]

    async def descriptions(self, tenant: str, thread_id: str) -> list[tuple[str, str]]:
        """(id, description) of a thread's summaries, in one round trip."""
        ids = [
            decode(i) for i in await self.redis.zrange(self.thread_index(tenant, thread_id), 0, -1)
        ]
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for summary_id in ids:
            pipe.hget(self.key(tenant, summary_id), "description")
        descriptions = await pipe.execute()
        return [(i, decode(d) or "") for i, d in zip(ids, descriptions, strict=True)]

    @staticmethod
    def segment(entries: list[tuple[str, str]]) -> Segment:
        return Segment(
            name="Summary",
            description="compressed older parts of this thread; each line is a summary id and what it covers.",
            usage="when a detail you need is only here, call expand_summary(summary_id) to get the summary and its original messages.",
            items=[f"[Summary ID: {sid}] {description}" for sid, description in entries],
            empty_note="(no summaries in this thread)",
        )
