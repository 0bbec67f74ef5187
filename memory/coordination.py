"""What bot processes share to serve one workspace together: which events were taken, each
thread's queue of jobs and who drains it, and which threads the bot takes part in.

The adapters' pipeline (`adapters/spine.py`) decides what to do; this module only keeps the
state in Redis, so it holds across processes and restarts.
"""

from __future__ import annotations

from redis.asyncio import Redis

from memory.keys import (
    joined_key,
    last_thread_key,
    seen_event_key,
    turn_lock_key,
    turn_queue_key,
    upgrade_key,
)
from memory.locks import OwnedLocks
from memory.scope import Scope
from memory.stores.base import decode

SEEN_TTL_SECONDS = 3600
JOINED_TTL_SECONDS = 90 * 24 * 3600


class EventLog:
    """Platforms redeliver events (Slack retries what was not acknowledged in time; a gateway
    resumes): the first delivery of an id goes through, the others are recognised."""

    def __init__(self, redis: Redis, ttl: int = SEEN_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    async def first_time(self, event_id: str) -> bool:
        return bool(await self.redis.set(seen_event_key(event_id), 1, nx=True, ex=self.ttl))


class TurnQueue:
    """Each thread's jobs in a Redis list; whichever process holds the thread's lock runs them,
    one at a time, in arrival order."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._locks = OwnedLocks(redis)

    async def push(self, scope: Scope, job: str) -> None:
        await self.redis.rpush(turn_queue_key(scope.tenant, scope.thread), job)

    async def pop(self, scope: Scope) -> str | None:
        return decode(await self.redis.lpop(turn_queue_key(scope.tenant, scope.thread)))

    async def length(self, scope: Scope) -> int:
        return int(await self.redis.llen(turn_queue_key(scope.tenant, scope.thread)))

    async def lock(self, scope: Scope, token: str, ttl_ms: int) -> bool:
        return await self._locks.acquire(turn_lock_key(scope.tenant, scope.thread), token, ttl_ms)

    async def renew(self, scope: Scope, token: str, ttl_ms: int) -> bool:
        return await self._locks.renew(turn_lock_key(scope.tenant, scope.thread), token, ttl_ms)

    async def unlock(self, scope: Scope, token: str) -> None:
        await self._locks.release(turn_lock_key(scope.tenant, scope.thread), token)


class ThreadPresence:
    """Threads the bot takes part in (answered there without a new mention), and each person's
    latest thread with the bot per channel (Slack's `/summarize` defaults to it)."""

    def __init__(self, redis: Redis, ttl: int = JOINED_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    async def join(self, scope: Scope, reference: str | None = None) -> None:
        """The bot is in `scope.thread`; `reference` is what the platform needs to find the
        thread again for this person (e.g. Slack's thread_ts)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(joined_key(scope.tenant, scope.thread), 1, ex=self.ttl)
        if reference is not None and scope.user and scope.channel:
            pipe.hset(last_thread_key(scope.tenant, scope.channel), scope.user, reference)
        await pipe.execute()

    async def joined(self, scope: Scope) -> bool:
        return bool(await self.redis.exists(joined_key(scope.tenant, scope.thread)))

    async def last_thread(self, scope: Scope) -> str | None:
        """The reference given with this person's latest thread in `scope.channel`."""
        return decode(
            await self.redis.hget(last_thread_key(scope.tenant, scope.channel), scope.user)
        )


class Upgrades:
    """One-time steps on upgrade (e.g. back-filling a new index): done once, by one process."""

    DONE = "done"

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def claim(self, name: str, ttl_seconds: int = 3600) -> bool:
        """True for the one process that should run step `name` now (not done, not running)."""
        return bool(await self.redis.set(upgrade_key(name), "running", nx=True, ex=ttl_seconds))

    async def done(self, name: str) -> bool:
        return decode(await self.redis.get(upgrade_key(name))) == self.DONE

    async def finish(self, name: str) -> None:
        await self.redis.set(upgrade_key(name), self.DONE)
