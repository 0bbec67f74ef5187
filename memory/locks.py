"""Locks held by one owner (a random token): only the holder may renew or release them, so a
process whose lock expired while it was stalled cannot free a lock another process now holds."""

from __future__ import annotations

from redis.asyncio import Redis

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
