"""A graceful close spends no delivery (real Redis): tasks a process read but never started
go back with their count as before the read, and another process runs them at once with the
delivery count they had; a task whose handler started keeps its count."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bot.background import BackgroundWork
from memory.dead_letters import dead_letters
from memory.keys import task_stream
from memory.tasks import TaskStream
from tests.support.task_deliveries import payload_deliveries


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"hand-back-{uuid.uuid4().hex[:10]}"))
    yield stream
    await stream.destroy()


async def delivered(stream: TaskStream, task_id: str) -> int | None:
    """The task's delivery count in the group, None when it is not pending."""
    rows = await stream.redis.xpending_range(
        stream.stream, stream.group, min=task_id, max=task_id, count=1
    )
    return int(rows[0]["times_delivered"]) if rows else None


@pytest.mark.parametrize("freed", ["at once", "after the consumer gave up waiting"])
async def test_a_graceful_close_hands_back_unstarted_tasks_with_their_count(client, stream, freed):
    started, release = asyncio.Event(), asyncio.Event()
    ran_late: list[dict] = []

    async def slow(payloads: list[dict]) -> None:
        started.set()
        await release.wait()
        raise ValueError("the deploy's SIGTERM cut it short")  # stays pending, as it was

    async def later(payloads: list[dict]) -> None:
        ran_late.extend(payloads)

    closing = BackgroundWork(
        TaskStream(client, stream.stream, consumer="closing"), {"slow": slow, "later": later},
        workers=1, claim_idle_ms=200, block_ms=100,
    )  # fmt: skip
    with closing.foreground():  # both read at once: "later" waits for the only worker
        slow_id = await closing.submit("slow", {"n": 1})
        later_id = await closing.submit("later", {"n": 2})
    async with asyncio.timeout(10):
        await started.wait()
    assert await stream.deliveries(later_id) == 1  # read: a delivery counted
    close = asyncio.create_task(closing.close())
    await asyncio.sleep(0)  # close() has begun: no more reads
    if freed != "at once":
        async with asyncio.timeout(20):  # close() stops waiting for its consumer after ~5 s
            while closing._consumer is not None:
                await asyncio.sleep(0.05)
    release.set()
    async with asyncio.timeout(30):
        await close
    assert ran_late == []  # never started here
    assert await delivered(stream, later_id) == 0  # its read's delivery taken back
    assert await delivered(stream, slow_id) == 1  # started: it keeps its count

    seen: list[tuple[dict, int]] = []

    async def later_elsewhere(payloads: list[dict]) -> None:
        seen.extend([(payload, await payload_deliveries(stream, payload)) for payload in payloads])

    # another process, which claims only what was idle for a minute: it takes it at once
    other = BackgroundWork(
        TaskStream(client, stream.stream, consumer="other"), {"later": later_elsewhere},
        claim_idle_ms=60_000, block_ms=100,
    )  # fmt: skip
    other.start()
    async with asyncio.timeout(10):
        while not seen:
            await asyncio.sleep(0.02)
    await other.close()
    assert seen == [({"n": 2}, 1)]  # the count it had before the close, not one more
    assert await delivered(stream, later_id) is None  # acknowledged
    assert await delivered(stream, slow_id) == 1  # still the closed process's, not handed back


async def test_a_closing_process_keeps_its_unstarted_tasks_until_it_hands_them_back(client, stream):
    """The reviewer's case: A closes while two batches run longer than claim_idle_ms; the task
    it read but never started (on its last delivery) is kept alive and handed back before A
    waits for them, so B runs it with the delivery it had, and buries nothing."""
    await stream.ensure_group()
    for kind in ("slow", "other", "last"):  # delivered once to a process that died
        dead = await stream.add(kind, {"n": kind})
    await client.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})
    await client.xclaim(stream.stream, stream.group, "dead-1", 0, [dead])  # "last": twice
    release, running = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    async def slow(payloads: list[dict]) -> None:
        started.extend(p["n"] for p in payloads)
        if len(started) >= 2:
            running.set()
        await release.wait()

    a = BackgroundWork(  # keeps its tasks alive every 0.1 s (a third of claim_idle_ms)
        TaskStream(client, stream.stream, consumer="A"), {"slow": slow, "other": slow},
        workers=2, claim_idle_ms=300, block_ms=50, max_deliveries=3,
    )  # fmt: skip
    a.start()  # claims all three (their last delivery): "last" waits for a worker
    async with asyncio.timeout(10):
        await running.wait()
        while dead not in a._held:
            await asyncio.sleep(0.02)
    assert await delivered(stream, dead) == 3
    closing = asyncio.create_task(a.close())
    ran: list[tuple[dict, int]] = []
    told: list[dict] = []

    async def last(payloads: list[dict]) -> None:
        ran.extend([(p, await payload_deliveries(stream, p)) for p in payloads])

    async def hook(payload: dict) -> None:
        told.append(payload)

    b = BackgroundWork(
        TaskStream(client, stream.stream, consumer="B"), {"last": last},
        workers=2, claim_idle_ms=1500, block_ms=50, max_deliveries=3, on_dead_letter={"last": hook},
    )  # fmt: skip
    b.start()
    async with asyncio.timeout(10):
        while not ran:
            await asyncio.sleep(0.02)
    # two of B's claim_idle_ms while A's batches still run: unkept since A claimed them, B
    # (looking every 0.75 s) would claim them past their last delivery. B's 1.5 s leaves a
    # stalled event loop well over a second between A's keep-alives.
    await asyncio.sleep(3.0)
    release.set()
    async with asyncio.timeout(30):
        await closing
    await b.close()
    assert "last" not in started
    assert ran == [({"n": "last"}, 3)] and told == []  # its last delivery, run once
    assert await dead_letters(stream) == []
    assert await delivered(stream, dead) is None
