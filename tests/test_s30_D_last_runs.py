"""Tasks on their last delivery (real Redis): one last-delivery group in flight per
BackgroundWork, the ones read meanwhile given back with their delivery unspent, so a hung last
run holds one worker and normal work goes on; close() hands back the unstarted ones at once;
a last run waiting behind another still gives way to turns; a last run past max_run_ms is
taken for hung, holding back no other last delivery, and its delivery count stays put."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bot.background import BackgroundWork
from memory.dead_letters import dead_letters
from memory.keys import task_stream
from memory.tasks import TaskStream
from tests.support.task_deliveries import payload_deliveries

MAX = 2
IDLE_MS = 100


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"last-runs-{uuid.uuid4().hex[:10]}"))
    await stream.ensure_group()
    yield stream
    await stream.destroy()


async def on_last_delivery(stream: TaskStream, *names: str) -> list[str]:
    """Tasks delivered MAX - 1 times to a consumer that died, idle past IDLE_MS: the live
    work's claim is their last delivery."""
    ids = [await stream.add("k", {"n": name}) for name in names]
    await stream.redis.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})
    for n in range(1, MAX - 1):
        await stream.redis.xclaim(stream.stream, stream.group, f"dead-{n}", 0, ids)
    await asyncio.sleep(IDLE_MS / 1000 * 2)
    return ids


async def delivered(stream: TaskStream, task_id: str) -> int | None:
    """The task's delivery count in the group, None when it is not pending."""
    rows = await stream.redis.xpending_range(
        stream.stream, stream.group, min=task_id, max=task_id, count=1
    )
    return int(rows[0]["times_delivered"]) if rows else None


def live_work(stream: TaskStream, handler, **options) -> BackgroundWork:
    return BackgroundWork(
        TaskStream(stream.redis, stream.stream, consumer="live"), {"k": handler},
        claim_idle_ms=IDLE_MS, block_ms=50, max_deliveries=MAX, **options,
    )  # fmt: skip


async def test_a_hung_last_run_holds_one_worker_and_normal_tasks_still_run(stream):
    await on_last_delivery(stream, "hung", "next")
    hung, release = asyncio.Event(), asyncio.Event()
    ran: list[tuple[str, int]] = []

    async def handler(payloads: list[dict]) -> None:
        for payload in payloads:
            # read as it starts: past its wait, a claim of it (its keep-alive late, the loop
            # stalled) may have counted a delivery that is not yet given back
            deliveries = await payload_deliveries(stream, payload)
            if payload["n"] == "hung":
                hung.set()
                await release.wait()
            ran.append((payload["n"], deliveries))

    # one task a fetch: "next" is a last-delivery group of its own, read while "hung" runs
    work = live_work(stream, handler, workers=2, batch=1)
    work.start()
    try:
        async with asyncio.timeout(10):
            await hung.wait()
            await work.submit("k", {"n": "normal"})  # its first delivery
            while ("normal", 1) not in ran:
                await asyncio.sleep(0.02)
        assert [n for n, _ in ran] == ["normal"]  # "next" waits for the hung run's end
        release.set()
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        release.set()
        await work.close()
    # "next" went back unspent each time it was read meanwhile: run on its last delivery
    assert sorted(ran) == [("hung", MAX), ("next", MAX), ("normal", 1)]
    assert await dead_letters(stream) == []


async def test_close_hands_back_the_unstarted_last_run_before_the_running_one_ends(stream):
    running_id, waiting_id = await on_last_delivery(stream, "running", "waiting")
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def handler(payloads: list[dict]) -> None:
        ran.extend(p["n"] for p in payloads)
        started.set()
        await release.wait()

    work = live_work(stream, handler)  # both claimed at once: "waiting" runs after "running"
    work.start()
    close = None
    try:
        async with asyncio.timeout(10):
            await started.wait()
        assert await delivered(stream, waiting_id) == MAX  # claimed: its last delivery
        close = asyncio.create_task(work.close())
        async with asyncio.timeout(15):  # close() waits up to ~5 s for its consumer
            while await delivered(stream, waiting_id) != MAX - 1:
                await asyncio.sleep(0.02)
        assert not close.done()  # "running" still runs: handed back before it ended
    finally:
        release.set()
        if close is None:
            await work.close()
    async with asyncio.timeout(10):
        await close
    assert ran == ["running"]
    assert await delivered(stream, waiting_id) == MAX - 1  # its delivery unspent
    assert await delivered(stream, running_id) is None  # done, acknowledged


async def test_a_last_run_read_behind_a_long_one_gives_way_to_a_turn(stream):
    await on_last_delivery(stream, "long", "behind")
    long_started, release, long_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def handler(payloads: list[dict]) -> None:
        for payload in payloads:
            order.append(payload["n"])
            if payload["n"] == "long":
                long_started.set()
                await release.wait()
                long_done.set()

    work = live_work(stream, handler, max_wait=1.0)  # one group: "behind" waits in it
    work.start()
    try:
        async with asyncio.timeout(10):
            await long_started.wait()
        await asyncio.sleep(1.5)  # longer than max_wait: "behind" was claimed that long ago
        with work.foreground():  # a turn is prepared as "long" ends
            release.set()
            async with asyncio.timeout(10):
                await long_done.wait()
            await asyncio.sleep(0.3)  # "behind" is free to go, but for the turn
            order.append("turn prepared")
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        release.set()
        await work.close()
    assert order == ["long", "turn prepared", "behind"]


async def idle_ms(stream: TaskStream, task_id: str) -> int:
    rows = await stream.redis.xpending_range(
        stream.stream, stream.group, min=task_id, max=task_id, count=1
    )
    return int(rows[0]["time_since_delivered"])


@pytest.mark.parametrize("batch", [16, 1])  # "next" waits in the hung group, or comes later
async def test_a_last_run_past_max_run_ms_holds_back_no_other_last_delivery(stream, batch):
    hung_id, _ = await on_last_delivery(stream, "hung", "next")
    hung, release = asyncio.Event(), asyncio.Event()
    ran: list[tuple[str, int]] = []

    async def handler(payloads: list[dict]) -> None:
        for payload in payloads:
            if payload["n"] == "hung":
                hung.set()
                await release.wait()  # never, while the test looks
            ran.append((payload["n"], await payload_deliveries(stream, payload)))

    work = live_work(stream, handler, workers=2, batch=batch, max_run_ms=300)
    work.start()
    try:
        async with asyncio.timeout(15):
            await hung.wait()
            while not ran:
                await asyncio.sleep(0.02)
            assert ran == [("next", MAX)]  # run here, on its last delivery
            # the hung task is no longer kept alive: wait for a claim of it (its idle restarts)
            before = await idle_ms(stream, hung_id)
            while (now := await idle_ms(stream, hung_id)) >= before:
                before = now
                await asyncio.sleep(0.02)
            # this process's own claims of it spend no delivery: each one (counted by
            # XAUTOCLAIM) is given back, a step later, and it is still on its last
            while await delivered(stream, hung_id) != MAX:
                await asyncio.sleep(0.02)
    finally:
        release.set()
        await work.close()
    assert await dead_letters(stream) == []
