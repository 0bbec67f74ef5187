"""The answers of the Save button (bot/watch_saves.py): each said once, and said again by the
task's next run when the platform did not take it.

An answer is claimed before it is posted (two copies of a task never both say it), for a day
as an answer has been since Save buttons were added, under the same key. A post that failed gives the claim back, keeping
the answer's text for the next run, so it says what happened the first time ("Saved", where a
second save would find the paper already there).
"""

from __future__ import annotations

from redis.asyncio import Redis

from memory.keys import watch_answer_pending_key, watch_answered_key
from memory.stores.base import decode

DAY = 86_400  # how long an answer is remembered


class SaveAnswers:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def answered(self, marker: str) -> bool:
        """True when a run of the task said (or is saying) this answer."""
        return bool(await self.redis.exists(watch_answered_key(marker)))

    async def claim(self, marker: str) -> bool:
        """True for the one run that is to post this answer now."""
        return bool(await self.redis.set(watch_answered_key(marker), "1", nx=True, ex=DAY))

    async def kept(self, marker: str) -> str | None:
        """The text a run worked out and could not post, if any."""
        return decode(await self.redis.get(watch_answer_pending_key(marker)))

    async def drop_kept(self, marker: str) -> None:
        """The kept text is said (or given up): it goes."""
        await self.redis.delete(watch_answer_pending_key(marker))

    async def give_back(self, marker: str, text: str) -> None:
        """Not posted: the next run says `text` as it is."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(watch_answer_pending_key(marker), text, ex=DAY)
            pipe.delete(watch_answered_key(marker))
            await pipe.execute()
