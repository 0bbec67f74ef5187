"""Locks held by one owner (a random token): only the holder may renew or release them, so a
process whose lock expired while it was stalled cannot free a lock another process now holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from redis.asyncio import Redis

log = logging.getLogger(__name__)

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class OwnedLocks:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)

    async def acquire(self, key: str, token: str, ttl_ms: int) -> bool:
        return bool(await self.redis.set(key, token, nx=True, px=ttl_ms))

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return bool(await self._renew(keys=[key], args=[token, ttl_ms]))

    async def release(self, key: str, token: str) -> bool:
        return bool(await self._release(keys=[key], args=[token]))

    @contextlib.asynccontextmanager
    async def kept(
        self,
        key: str,
        token: str,
        ttl_ms: int,
        max_ms: int | None = None,
        name: str = "",
        on_lost: Callable[[], None] | None = None,
    ) -> AsyncIterator[None]:
        """While the body runs, renew a lock already taken every third of its lifetime, and
        release it at the end however the body ends. With `max_ms`, renewals stop after that
        long: a hung holder's lock lapses, so whoever takes its work over may run it.
        `on_lost` is called once a renewal finds the lock gone (another holder may run), so a
        body that must not go on without it can stop."""
        keeper = asyncio.create_task(
            self._keep(key, token, ttl_ms, max_ms, on_lost), name=name or None
        )
        try:
            yield
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self.release(key, token)

    async def _keep(
        self,
        key: str,
        token: str,
        ttl_ms: int,
        max_ms: int | None,
        on_lost: Callable[[], None] | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        until = None if max_ms is None else loop.time() + max_ms / 1000
        while True:
            await asyncio.sleep(ttl_ms / 3000)
            if until is not None and loop.time() >= until:
                log.warning("lock %s held past its max run: it lapses", key)
                return
            try:
                if not await self.renew(key, token, ttl_ms):
                    log.warning("lock %s was lost (expired): another holder may run", key)
                    if on_lost is not None:
                        on_lost()
                    return
            except Exception as exc:  # Redis away: try again at the next beat
                log.warning("could not renew lock %s: %r", key, exc)
