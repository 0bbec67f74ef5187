"""The lock a shared PDF's task holds while it runs, against the real Redis: renewed however long
a read takes (so a second copy of the share waits), never for another copy's token, released
however the share ends, and let lapse after the task's max run."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapters.shared_files import ShareBusy
from memory.ingest.shared_pdf import ShareProgress
from memory.keys import shared_pdf_lock_key
from memory.scope import Scope, Visibility
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

LOCK_SECONDS = 1.5  # renewed every 0.5 s: a loaded machine may stall the loop a few 100 ms


class HeldEnd(StubEnd):
    """A platform whose first download waits until the test lets it go: a read that runs as
    long as the test wants. Later copies download at once."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.fetching, self.go = asyncio.Event(), asyncio.Event()
        self.fetches = 0

    async def fetch(self, file, max_bytes):
        self.fetches += 1
        if self.fetches == 1:
            self.fetching.set()
            await self.go.wait()
        return await super().fetch(file, max_bytes)


def dm(tenant: str) -> Scope:
    return Scope(tenant, "t", channel="D1", visibility=Visibility.DM)


def keepers(share: str) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"share-lock:{share}"]


async def test_a_share_running_past_its_lock_lifetime_keeps_its_lock(memory, tenant):
    end = HeldEnd(shared_pdf("Long Read"))
    files = stub_files(memory, end, lock_seconds=LOCK_SECONDS)
    payload = share_payload(dm(tenant), f"slack:D1:{time.time_ns()}")
    lock = shared_pdf_lock_key(tenant, payload["share"])
    reading = asyncio.create_task(files.one(payload))
    await end.fetching.wait()
    await asyncio.sleep(2 * LOCK_SECONDS)  # the read outlasts the lock's lifetime
    assert await memory.redis.exists(lock)
    with pytest.raises(ShareBusy):
        await files.one(payload)  # Slack's retry, as its own task: not run twice
    end.go.set()
    await reading
    assert not await memory.redis.exists(lock)  # released at the end
    assert not keepers(payload["share"])  # and no longer renewed
    assert end.fetches == 1 and end.posts == ["_Reading x.pdf…_"]
    assert end.edits[0][1].startswith("Saved *Long Read*")


async def test_renewal_never_extends_a_lock_another_token_holds(memory, tenant):
    progress = ShareProgress(memory.redis)
    share = f"slack:D1:{time.time_ns()}"
    lock = shared_pdf_lock_key(tenant, share)
    assert await progress.lock(tenant, share, "ours", 60)
    assert not await progress.renew(tenant, share, "theirs", 600)
    assert 0 < await memory.redis.pttl(lock) <= 60_000
    assert await progress.renew(tenant, share, "ours", 600)
    assert await memory.redis.pttl(lock) > 60_000
    await progress.unlock(tenant, share, "ours")
    assert not await progress.renew(tenant, share, "ours", 600)  # gone: not made again
    assert not await memory.redis.exists(lock)


async def test_a_cancelled_share_stops_renewing_and_releases_its_lock(memory, tenant):
    end = HeldEnd(shared_pdf())
    files = stub_files(memory, end, lock_seconds=LOCK_SECONDS)
    payload = share_payload(dm(tenant), f"slack:D1:{time.time_ns()}")
    reading = asyncio.create_task(files.one(payload))
    await end.fetching.wait()
    assert keepers(payload["share"])
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert not keepers(payload["share"])
    assert not await memory.redis.exists(shared_pdf_lock_key(tenant, payload["share"]))
    await files.one(payload)  # the next delivery takes the lock and reads it


async def test_a_share_hung_past_its_max_run_lets_its_lock_lapse(memory, tenant):
    """After the task's max run it may be taken over (bot/background.py): the lock no longer
    stands in the way of whoever takes it."""
    end = HeldEnd(shared_pdf("Hung"))
    files = stub_files(memory, end, lock_seconds=LOCK_SECONDS, max_run_ms=600)
    payload = share_payload(dm(tenant), f"slack:D1:{time.time_ns()}")
    hung = asyncio.create_task(files.one(payload))
    await end.fetching.wait()
    await asyncio.sleep(3 * LOCK_SECONDS)  # renewals stop at 0.6 s: the lock lapses by 2.1 s
    await files.one(payload)  # taken over: runs, not ShareBusy
    assert end.fetches == 2
    end.go.set()
    await hung
