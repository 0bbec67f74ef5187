"""Tool log memory: the full input and output of every tool call, kept out of the context.

The model gets a truncated result that names the log id; `read_tool_log` brings the rest back.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from memory.keys import tenant_key, thread_key
from memory.stores.base import decode


class UnknownToolLog(KeyError):
    def __str__(self) -> str:
        return f"No tool log with id {self.args[0]!r} in this workspace."


@dataclass
class ToolLogEntry:
    thread_id: str
    tool_name: str
    tool_input: dict[str, Any] | str
    output: str
    status: str  # success | error | timeout
    error: str = ""
    duration_ms: float = 0.0
    iteration: int = 0
    id: str = field(default_factory=lambda: f"log_{uuid.uuid4().hex[:12]}")
    created_at: float = field(default_factory=time.time)


class ToolLogStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @staticmethod
    def key(tenant: str, log_id: str) -> str:
        return tenant_key(tenant, "toollog", log_id)

    @staticmethod
    def thread_index(tenant: str, thread_id: str) -> str:
        return thread_key(tenant, thread_id, "toollogs")

    async def write(self, tenant: str, entry: ToolLogEntry) -> str:
        fields = asdict(entry)
        fields["tool_input"] = json.dumps(entry.tool_input, ensure_ascii=False)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key(tenant, entry.id), mapping=fields)
        pipe.zadd(self.thread_index(tenant, entry.thread_id), {entry.id: entry.created_at})
        await pipe.execute()
        return entry.id

    async def get(self, tenant: str, log_id: str) -> ToolLogEntry:
        row = await self.redis.hgetall(self.key(tenant, log_id.strip()))
        if not row:
            raise UnknownToolLog(log_id)
        data = {decode(k): decode(v) for k, v in row.items()}
        return ToolLogEntry(
            id=data["id"],
            thread_id=data["thread_id"],
            tool_name=data["tool_name"],
            tool_input=json.loads(data["tool_input"]),
            output=data["output"],
            status=data["status"],
            error=data.get("error", ""),
            duration_ms=float(data.get("duration_ms", 0)),
            iteration=int(data.get("iteration", 0)),
            created_at=float(data["created_at"]),
        )

    async def for_thread(
        self, tenant: str, thread_id: str, limit: int = 50, failed_only: bool = False
    ) -> list[ToolLogEntry]:
        ids = await self.redis.zrevrange(self.thread_index(tenant, thread_id), 0, limit - 1)
        entries = [await self.get(tenant, decode(i)) for i in ids]
        return [e for e in entries if e.status != "success"] if failed_only else entries
