"""arXiv's one request per 3 s, kept by every process together: a slot in Redis.

Each process spaces its own requests (memory/ingest/arxiv_source.py `RateLimiter`); processes
running digests at once would still ask together. `SharedPace` is the `pace` hook of an
`ArxivSource`: before a request it takes a key that lives `delay` seconds (SET NX PX), waiting
for it while another process holds it. When arXiv asks for a pause (429, or 503 with a
Retry-After), `block` records it for every process: a short one is waited out, a longer one
fails every request at once until it is over, none of them sent.
"""

from __future__ import annotations

import asyncio
import uuid

from memory.ingest.arxiv_source import MAX_RETRY_AFTER, blocked_message
from memory.ingest.errors import IngestError
from memory.keys import arxiv_blocked_key, arxiv_slot_key


class SharedPace:
    def __init__(self, redis, delay_seconds: float, poll_seconds: float = 0.25) -> None:
        self.redis = redis
        self.delay_ms = int(delay_seconds * 1000)
        self.poll_seconds = poll_seconds

    async def __call__(self) -> None:
        """Wait until this process may send the next arXiv request; IngestError while arXiv's
        long pause lasts."""
        await self._unless_blocked()
        if self.delay_ms <= 0:
            return
        token = uuid.uuid4().hex
        while not await self.redis.set(arxiv_slot_key(), token, nx=True, px=self.delay_ms):
            left = await self.redis.pttl(arxiv_slot_key())
            await asyncio.sleep(max(left, 10) / 1000 if left > 0 else self.poll_seconds / 10)

    async def block(self, status: int, seconds: float) -> None:
        """arXiv answered `status` asking for a pause of `seconds`: no process asks before it
        is over (a longer pause already recorded stays)."""
        left = await self.redis.pttl(arxiv_blocked_key())
        if seconds * 1000 > left:
            await self.redis.set(arxiv_blocked_key(), str(status), px=max(1, int(seconds * 1000)))

    async def _unless_blocked(self) -> None:
        key = arxiv_blocked_key()
        status, left = await asyncio.gather(self.redis.get(key), self.redis.pttl(key))
        if left > MAX_RETRY_AFTER * 1000:
            raise IngestError(blocked_message(int(status or 429), left / 1000))
        if left > 0:
            await asyncio.sleep(left / 1000)
