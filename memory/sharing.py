"""A channel's sharing changed (Slack's `channel_shared` / `channel_unshared`, sent to one
process): a new token per channel in Redis, so every process drops what it cached of that
channel's walls when the token is not the one it last saw (adapters/slack_walls.py)."""

from __future__ import annotations

import logging
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from memory.keys import sharing_changed_key

log = logging.getLogger(__name__)

TOKENS_SECONDS = 86_400  # a channel's token outlives any process's cache of its walls


class SharingChanges:
    """Tells and reads, per channel, the token of its last sharing change."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._seen: dict[str, bytes] = {}  # channel -> the last token this process saw

    async def changed(self, channel: str) -> None:
        """Say the channel's sharing changed (this process has forgotten its cache of it)."""
        token = uuid.uuid4().hex.encode()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(sharing_changed_key(), channel, token)
            pipe.expire(sharing_changed_key(), TOKENS_SECONDS)
            await pipe.execute()
        self._seen[channel] = token

    async def changed_since_seen(self, channel: str) -> bool:
        """True once per change another process told since this one last looked. Redis
        unreachable: False (the turn can neither read nor store memory then either)."""
        try:
            token = await self.redis.hget(sharing_changed_key(), channel)
        except (RedisError, OSError) as exc:
            log.info("could not read %s's sharing token (%r): cached walls kept", channel, exc)
            return False
        if token is None or self._seen.get(channel) == token:
            return False
        self._seen[channel] = token
        return True
