"""arXiv's one request per 3 s, kept by every process together: a slot in Redis.

Each process spaces its own requests (memory/ingest/arxiv_source.py `RateLimiter`); processes
running digests at once would still ask together. `SharedPace` is the `pace` hook of an
`ArxivSource`: before a request, `take` waits for a key and holds it (SET NX, a token as value)
while the request runs; after it, `release` lets it live `delay` seconds more, if it is still
ours. So the spacing is counted from the end of a request in every process, as arXiv asks (a
PDF download or a 100-entry page takes longer than 3 s). A holder that dies mid-request blocks
the others for `hold_seconds` at most; so does a release that fails twice (Redis away). A PDF
download longer than `hold_seconds` lets the slot lapse while it runs: another process may then
ask beside it (left so: a stuck holder must not block every process for long). When arXiv asks
for a pause (429, or 503 with a Retry-After), `block` records it for every process, before the
asker releases the slot: a short one is waited out, a longer one fails every request at once
until it is over, none of them sent, even one that was already waiting for the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from memory.ingest.arxiv_source import MAX_RETRY_AFTER, blocked_message
from memory.ingest.errors import IngestError
from memory.keys import arxiv_blocked_key, arxiv_slot_key

HOLD_SECONDS = 60.0  # longest a request holds the slot: a crashed holder's slot lapses then

# The request ended: the slot lives `delay` ms more, only if still held by this token (a slot
# that lapsed and was taken by another process is theirs).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class SharedPace:
    def __init__(
        self, redis, delay_seconds: float, poll_seconds: float = 0.25,
        hold_seconds: float = HOLD_SECONDS,
    ) -> None:  # fmt: skip
        self.redis = redis
        self.delay_ms = int(delay_seconds * 1000)
        self.poll_seconds = poll_seconds
        self.hold_seconds = hold_seconds
        self._release = redis.register_script(_RELEASE)

    async def __call__(self) -> None:
        """Wait for the slot and start the spacing now (a caller with no request to time)."""
        await self.release(await self.take())

    async def take(self, token: str | None = None) -> str | None:
        """Wait until this process may send the next arXiv request and hold the slot while it
        runs, under `token` (made here if not given; the caller's own lets it release a take
        it gave up on): the token for `release`, None when no spacing is asked. IngestError
        while arXiv's long pause lasts, checked again once the slot is ours: the pause may
        have been recorded while this waited (by the holder, before its release)."""
        await self._unless_blocked()
        if self.delay_ms <= 0:
            return None
        token = token or uuid.uuid4().hex
        hold_ms = max(self.delay_ms, int(self.hold_seconds * 1000))
        try:
            while not await self.redis.set(arxiv_slot_key(), token, nx=True, px=hold_ms):
                left = await self.redis.pttl(arxiv_slot_key())  # polled: a release shortens it
                await asyncio.sleep(self._poll_wait(left))
            await self._unless_blocked()
        except BaseException:  # blocked, or given up on (cancelled) maybe once the SET ran
            with contextlib.suppress(Exception):
                await self.release(token)
            raise
        return token

    async def release(self, token: str | None) -> None:
        """The request of `token` ended: the next one (of any process) goes `delay` after now.
        Tried twice (a slot left held stalls every process for `hold_seconds`); harmless for a
        token that never took the slot, or lost it."""
        if token is None:
            return
        try:
            await self._release(keys=[arxiv_slot_key()], args=[token, self.delay_ms])
        except Exception:
            await self._release(keys=[arxiv_slot_key()], args=[token, self.delay_ms])

    def _poll_wait(self, left_ms: int) -> float:
        """Seconds to wait before trying the slot again, `left_ms` of it left (or none)."""
        if left_ms > 0:
            return min(max(left_ms, 10) / 1000, self.poll_seconds)
        return self.poll_seconds / 10

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
