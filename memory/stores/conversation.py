"""Conversation memory: every message of a thread, in a Redis list, oldest first.

Summarized messages always form a prefix of the list (a summary covers every unsummarized
message that existed when it started), so the unsummarized ones are a suffix: reading the recent
conversation is one LRANGE. Marking messages with a summary id is one Lua script that checks
each element is still what the summarizer read, so a concurrent append is never lost or marked.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from memory.keys import messages_key, summarizing_key, threads_key
from memory.locks import OwnedLocks
from memory.scope import Scope
from memory.stores.base import Segment

MAX_MESSAGE_CHARS = 200_000

# One command that appends a message and lists its thread: atomic like MULTI/EXEC, and sent
# in the same batch as whatever else the turn (or a burst of turns) is asking Redis.
_APPEND_SCRIPT = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

_MARK_SCRIPT = """
-- KEYS[1] list; ARGV[1] first index; then pairs (expected, replacement)
local first = tonumber(ARGV[1])
local n = (#ARGV - 1) / 2
for i = 0, n - 1 do
  local current = redis.call('LINDEX', KEYS[1], first + i)
  if current ~= ARGV[2 + 2 * i] then
    return redis.error_reply('CHANGED message ' .. (first + i) .. ' changed during summarization')
  end
end
for i = 0, n - 1 do
  redis.call('LSET', KEYS[1], first + i, ARGV[3 + 2 * i])
end
return n
"""


class InvalidMessage(ValueError):
    """A message that cannot be stored (empty, too long, wrong role)."""


def clean_text(text: str) -> str:
    """Drop what cannot be stored as UTF-8 (lone surrogates from bad input)."""
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass
class Message:
    role: str
    content: str
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:16]}")
    thread_id: str = ""
    timestamp: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    summary_id: str = ""
    author: str = ""  # platform user id; empty for the assistant
    author_name: str = ""
    audience: str = ""  # who may see it (Scope.audience); empty in messages from before

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Message:
        return cls(**json.loads(raw))


class ConversationStore:
    ROLES = ("user", "assistant", "system")

    def __init__(self, redis: Redis, recent: int = 20) -> None:
        self.redis = redis
        self.recent = recent
        self._mark = redis.register_script(_MARK_SCRIPT)
        self._append = redis.register_script(_APPEND_SCRIPT)
        self._locks = OwnedLocks(redis)

    @staticmethod
    def key(scope: Scope) -> str:
        return messages_key(scope.tenant, scope.thread)

    async def append(self, scope: Scope, role: str, content: str, **metadata: Any) -> Message:
        """Store a message of `scope.thread`; a user's message is by `scope.user`."""
        if role not in self.ROLES:
            raise InvalidMessage(f"role must be one of {self.ROLES}, got {role!r}")
        if not isinstance(content, str) or not content.strip():
            raise InvalidMessage("A message must not be empty.")
        if len(content) > MAX_MESSAGE_CHARS:
            raise InvalidMessage(
                f"A message is limited to {MAX_MESSAGE_CHARS:,} characters "
                f"(this one has {len(content):,}). Save long texts to the knowledge base instead."
            )
        by_user = role == "user"
        message = Message(
            role=role, content=clean_text(content), thread_id=scope.thread, metadata=metadata,
            author=scope.user if by_user else "", author_name=scope.user_name if by_user else "",
            audience=scope.audience,
        )  # fmt: skip
        await self._append(
            keys=[self.key(scope), threads_key(scope.tenant)],
            args=[message.to_json(), message.timestamp, scope.thread],
        )
        return message

    async def all(self, scope: Scope) -> list[Message]:
        rows = await self.redis.lrange(self.key(scope), 0, -1)
        return [Message.from_json(r) for r in rows]

    async def recent_unsummarized(self, scope: Scope, limit: int | None = None) -> list[Message]:
        rows = await self.redis.lrange(self.key(scope), -(limit or self.recent), -1)
        return [m for m in map(Message.from_json, rows) if not m.summary_id]

    async def unsummarized_snapshot(self, scope: Scope) -> tuple[int, list[str]]:
        """The index of the first unsummarized message and the raw JSON of all that follow."""
        rows = await self.redis.lrange(self.key(scope), 0, -1)
        first = len(rows)
        for i in range(len(rows) - 1, -1, -1):
            if Message.from_json(rows[i]).summary_id:
                break
            first = i
        return first, [r.decode() if isinstance(r, bytes) else r for r in rows[first:]]

    async def mark_summarized(
        self, scope: Scope, first: int, raw: list[str], summary_id: str
    ) -> list[str]:
        """Set `summary_id` on exactly the messages read by `unsummarized_snapshot`."""
        args: list[Any] = [first]
        ids = []
        for original in raw:
            message = Message.from_json(original)
            message.summary_id = summary_id
            ids.append(message.id)
            args += [original, message.to_json()]
        if raw:
            await self._mark(keys=[self.key(scope)], args=args)
        return ids

    async def claim_summarizing(self, scope: Scope, token: str, seconds: int) -> bool:
        """Take the thread's summary lock: one summary of a thread is written at a time."""
        key = summarizing_key(scope.tenant, scope.thread)
        return await self._locks.acquire(key, token, seconds * 1000)

    async def release_summarizing(self, scope: Scope, token: str) -> None:
        await self._locks.release(summarizing_key(scope.tenant, scope.thread), token)

    async def threads(self, tenant: str) -> list[tuple[str, float]]:
        rows = await self.redis.zrevrange(threads_key(tenant), 0, -1, withscores=True)
        return [(r.decode() if isinstance(r, bytes) else r, score) for r, score in rows]

    @staticmethod
    def segment(messages: list[Message]) -> Segment:
        items = [f"[{m.role}] {m.content}" for m in messages]
        return Segment(
            name="Conversation",
            description="the most recent messages of this thread that no summary covers yet, oldest first.",
            usage="keep continuity: resolve references like 'the paper' or 'it', and follow the user's preferences and open requests.",
            items=items,
            empty_note="(no recent messages in this thread)",
        )
