"""Who was erased from a tenant, and when: a note `forget_person` leaves, so work of theirs queued
before the erasure and run after it (a shared file's task, waiting in its stream while the bot
was down) takes nothing of theirs again (adapters/shared_files.py `withdrawn`).

A person is kept as a digest of their platform id, not the id itself, for ERASED_NOTE_SECONDS:
longer than a share waits in its stream while processes run, and an erasure drops the person's
dead letters (memory/dead_letters.py), so a requeue cannot bring one back. The bound: a share
first run more than that after its sharer's erasure (the bot down for a month) would be read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable

from redis.asyncio import Redis

from memory.keys import erased_people_key
from memory.stores.base import decode

ERASED_NOTE_SECONDS = 30 * 86400


def _digest(person: str) -> str:
    return hashlib.sha256(person.encode()).hexdigest()


class ErasedPeople:
    """The tenant's note of erased people (one hash in its slot, `erased_people_key`)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def note(self, tenant: str, person: str, at: float | None = None) -> None:
        """Note `person` erased at `at` (now); entries older than the bound go as it is written."""
        key, at = erased_people_key(tenant), time.time() if at is None else at
        noted = await self.redis.hgetall(key)
        stale = [f for f, when in noted.items() if float(when) < at - ERASED_NOTE_SECONDS]
        async with self.redis.pipeline(transaction=True) as pipe:
            if stale:
                pipe.hdel(key, *stale)
            pipe.hset(key, _digest(person), repr(at))
            pipe.expire(key, ERASED_NOTE_SECONDS)
            await pipe.execute()

    async def erased_at(self, tenant: str, people: Iterable[str]) -> float | None:
        """When the latest erasure of any of `people` ran (within the bound), or None."""
        wanted = sorted({p for p in people if p})
        if not wanted:
            return None
        found = await self.redis.hmget(erased_people_key(tenant), [_digest(p) for p in wanted])
        since = time.time() - ERASED_NOTE_SECONDS  # a note not yet pruned is past its bound
        times = [float(decode(when)) for when in found if when is not None]
        return max((t for t in times if t >= since), default=None)
