"""arXiv's one request per 3 s, kept by every process together: a slot in Redis.

Each process spaces its own requests (memory/ingest/arxiv_source.py `RateLimiter`); processes
running digests at once would still ask together. `SharedPace` is the `pace` hook of an
`ArxivSource`: before a request it takes a key that lives `delay` seconds (SET NX PX), waiting
for it while another process holds it.
"""

from __future__ import annotations

import asyncio
import uuid

from memory.keys import arxiv_slot_key


class SharedPace:
    def __init__(self, redis, delay_seconds: float, poll_seconds: float = 0.25) -> None:
        self.redis = redis
        self.delay_ms = int(delay_seconds * 1000)
        self.poll_seconds = poll_seconds

    async def __call__(self) -> None:
        """Wait until this process may send the next arXiv request."""
        if self.delay_ms <= 0:
            return
        token = uuid.uuid4().hex
        while not await self.redis.set(arxiv_slot_key(), token, nx=True, px=self.delay_ms):
            left = await self.redis.pttl(arxiv_slot_key())
            await asyncio.sleep(max(left, 10) / 1000 if left > 0 else self.poll_seconds / 10)
