"""The hand-back of held tasks (bot/held_tasks.py `HeldTasks.hand_back`), real Redis: what a
closing worker read and never started goes back at once to the group, its read's delivery
taken back, so another process (another consumer name) takes it without waiting for the claim
timeout; and when the close, or the consumer holding fetched tasks, is cancelled midway, no
task is lost or acknowledged unrun: each is run once, or stays pending for another consumer."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bot.background import BackgroundWork
from memory.keys import task_stream
from memory.tasks import Task, TaskStream

NEVER_MS = 3_600_000  # a claim timeout no test waits for: only what is handed back is claimed
BOUND = 30  # seconds: a wait that fails the test rather than hang it


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"held-{uuid.uuid4().hex[:10]}"))
    yield stream
    await stream.destroy()


async def pending(stream: TaskStream, task_id: str) -> tuple[str, int] | None:
    """The consumer holding the task and its delivery count; None when it is not pending."""
    rows = await stream.redis.xpending_range(
        stream.stream, stream.group, min=task_id, max=task_id, count=1
    )
    if not rows:
        return None
    return text(rows[0]["consumer"]), int(rows[0]["times_delivered"])


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def until(check) -> None:
    """Wait, bounded, until `check()` (awaited) is true."""
    async with asyncio.timeout(BOUND):
        while not await check():
            await asyncio.sleep(0.02)


def recorder(who: str, ran: list[tuple[str, dict]]):
    async def handler(payloads: list[dict]) -> None:
        ran.extend((who, p) for p in payloads)

    return handler


async def holding_unstarted(client, stream: TaskStream, started: asyncio.Event, slow):
    """Worker A (one worker) runs `slow` and holds two tasks read with it, waiting for its
    worker: returns A, what A ran, the slow task's id and the waiting tasks' ids."""
    ran: list[tuple[str, dict]] = []
    a = BackgroundWork(
        TaskStream(client, stream.stream, consumer="A"),
        {"slow": slow, "later": recorder("A", ran), "other": recorder("A", ran)},
        workers=1, claim_idle_ms=NEVER_MS, block_ms=100,
    )  # fmt: skip
    with a.foreground():  # all read in one batch: "later" and "other" wait for the worker
        slow_id = await a.submit("slow", {"n": 0})
        waiting = [await a.submit("later", {"n": 1}), await a.submit("other", {"n": 2})]
    async with asyncio.timeout(BOUND):
        await started.wait()
    assert [await pending(stream, i) for i in waiting] == [("A", 1), ("A", 1)]  # read, held
    return a, ran, slow_id, waiting


def other_process(client, stream: TaskStream, ran: list, **options) -> BackgroundWork:
    """Another process's worker, under a consumer name of its own."""
    return BackgroundWork(
        TaskStream(client, stream.stream, consumer="B"),
        {kind: recorder("B", ran) for kind in ("slow", "later", "other")},
        **{"claim_idle_ms": NEVER_MS, "block_ms": 100, **options},
    )


async def drained(b: BackgroundWork) -> None:
    """B started, drained (bounded: a task never run fails the test), closed."""
    b.start()
    try:
        async with asyncio.timeout(BOUND):
            await b.drain()
    finally:
        await b.close()


async def test_a_closed_worker_hands_its_unstarted_tasks_to_another_consumer_at_once(
    client, stream
):
    started, release = asyncio.Event(), asyncio.Event()
    done: list[dict] = []

    async def slow(payloads: list[dict]) -> None:
        started.set()
        await release.wait()
        done.extend(payloads)

    a, ran_a, slow_id, waiting = await holding_unstarted(client, stream, started, slow)
    async with asyncio.timeout(BOUND):
        await a.stop_reading()  # close's first half, as close_all does
    closing = asyncio.create_task(a.close())  # waits for the running batch
    # handed back, not acknowledged: still pending, the read's delivery taken back
    assert [await pending(stream, i) for i in waiting] == [("A", 0), ("A", 0)]

    ran_b: list[tuple[str, dict]] = []
    b = other_process(client, stream, ran_b)  # claims only what was idle for an hour
    b.start()

    async def both_ran() -> bool:
        return len(ran_b) == 2

    try:
        await until(both_ran)
    finally:
        release.set()
        async with asyncio.timeout(BOUND):
            await closing
        await b.close()
    assert sorted(p["n"] for _, p in ran_b) == [1, 2] and ran_a == []  # each run once, by B
    assert done == [{"n": 0}]  # the running batch finished by A
    assert await stream.pending_count() == 0  # all acknowledged
    assert await pending(stream, slow_id) is None


async def test_a_close_cancelled_midway_loses_no_task(client, stream):
    """Cancelled while it waits for the running batch: the unstarted tasks were handed back
    (B takes them at once), and the cancelled batch stays pending for another consumer."""
    started = asyncio.Event()
    cancelled: list[dict] = []

    async def slow(payloads: list[dict]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # runs until the close is cancelled
        except asyncio.CancelledError:
            cancelled.extend(payloads)
            raise

    a, ran_a, slow_id, waiting = await holding_unstarted(client, stream, started, slow)
    closing = asyncio.create_task(a.close())

    async def handed_back() -> bool:
        return [await pending(stream, i) for i in waiting] == [("A", 0), ("A", 0)]

    await until(handed_back)  # close is past its hand-back, waiting for the running batch
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(BOUND):
            await closing
    assert cancelled == [{"n": 0}]  # the batch in hand was cancelled with the close
    # not acknowledged: handed back pending, its delivery unspent and its started mark gone
    assert await pending(stream, slow_id) == ("A", 0)
    assert await stream.started_on([Task(slow_id, "slow", {"n": 0}, 1)]) == {}
    assert await handed_back()

    ran_b: list[tuple[str, dict]] = []
    b = other_process(client, stream, ran_b)
    await drained(b)  # claims only what was idle for an hour: the handed-back
    assert sorted(p["n"] for _, p in ran_b) == [0, 1, 2] and ran_a == []  # each once, by B
    assert await stream.pending_count() == 0


async def test_tasks_held_by_a_cancelled_consumer_are_handed_back_not_acknowledged(client, stream):
    """A's consumer, holding a fetch while a dead-letter hook hangs, is cancelled by close()
    (it did not stop within block_ms + 5 s): the fetched tasks are handed back, their claim's
    delivery taken back, and B takes them at once."""
    await stream.ensure_group()
    spent = await stream.add("spent", {"n": "spent"})
    later = [await stream.add("later", {"n": n}) for n in (1, 2)]
    await stream.redis.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})  # 1 delivery
    for n in range(1, 5):  # the spent task delivered 5 times, its last run began and died
        await stream.redis.xclaim(stream.stream, stream.group, f"dead-{n}", 0, [spent])
    await stream.mark_started([Task(spent, "spent", {"n": "spent"}, 5)])
    await asyncio.sleep(0.5)  # all idle past A's claim timeout: claimed in one fetch

    hooked, told_b = asyncio.Event(), []
    ran_a: list[tuple[str, dict]] = []

    async def hangs(payload: dict) -> None:
        hooked.set()
        await asyncio.Event().wait()

    a = BackgroundWork(
        TaskStream(client, stream.stream, consumer="A"), {"later": recorder("A", ran_a)},
        claim_idle_ms=200, block_ms=100, on_dead_letter={"spent": hangs},
    )  # fmt: skip
    a.start()
    async with asyncio.timeout(BOUND):
        await hooked.wait()
    assert [await pending(stream, i) for i in later] == [("A", 2), ("A", 2)]  # held by A
    async with asyncio.timeout(BOUND):
        await a.close()  # its consumer cancelled mid-step after block_ms + 5 s
    assert ran_a == []
    # handed back, not acknowledged: pending, with the delivery count they had before A
    assert [await pending(stream, i) for i in later] == [("A", 1), ("A", 1)]

    async def told(payload: dict) -> None:
        told_b.append(payload)

    ran_b: list[tuple[str, dict]] = []
    b = other_process(client, stream, ran_b, on_dead_letter={"spent": told})
    await drained(b)  # claims only what was idle for an hour: the handed-back
    assert sorted(p["n"] for _, p in ran_b) == [1, 2]  # each run once, by B
    assert told_b == [{"n": "spent"}]  # buried by B: its hook told once


async def test_a_close_cancelled_before_its_hand_back_runs_nothing_twice(client, stream):
    """Cancelled while it waits for A's consumer (held up by a dead-letter hook), before its
    hand-back: A's running batch and its consumer are cut short, not left running unkept for B
    to claim and run beside them, and what they held is handed back (the cut short batch's
    delivery unspent): B, started at once, with no second close of A, runs each task once."""
    started, hooked, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    in_a: list[str] = []  # what of A still runs: its slow task, its dead-letter hook
    ran_b: list[tuple[dict, bool]] = []  # what B ran, and whether anything of A ran meanwhile

    async def slow(payloads: list[dict]) -> None:
        in_a.append("slow")
        started.set()
        try:
            await release.wait()
        finally:
            in_a.remove("slow")

    async def hangs(payload: dict) -> None:
        in_a.append("hook")
        hooked.set()
        try:
            await asyncio.Event().wait()
        finally:
            in_a.remove("hook")

    a = BackgroundWork(
        TaskStream(client, stream.stream, consumer="A"), {"slow": slow},
        workers=2, claim_idle_ms=1000, block_ms=100, on_dead_letter={"spent": hangs},
    )  # fmt: skip
    slow_id = await a.submit("slow", {"n": 0})
    async with asyncio.timeout(BOUND):
        await started.wait()
    # Then three tasks another consumer read, the spent one delivered 5 times, its last run
    # begun and dead: all in one transaction (their ids chosen, after the slow one's), so A
    # neither reads them first nor claims any before it is all set; it claims the three
    # together once idle 1 s.
    ms = int(slow_id.split("-")[0]) + 1
    spent, *later = [f"{ms}-{n}" for n in range(3)]
    async with stream.redis.pipeline(transaction=True) as queued:
        queued.xadd(stream.stream, {"kind": "spent", "payload": '{"n":"spent"}'}, id=spent)
        for n, task_id in enumerate(later, 1):
            queued.xadd(stream.stream, {"kind": "later", "payload": f'{{"n":{n}}}'}, id=task_id)
        queued.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})
        for n in range(1, 4):
            queued.xclaim(stream.stream, stream.group, f"dead-{n}", 0, [spent])
        queued.xclaim(stream.stream, stream.group, "dead-4", 0, [spent, *later])
        # its started mark as the stream writes it (queued on the transaction)
        await TaskStream(queued, stream.stream).mark_started([Task(spent, "spent", {}, 5)])
        await queued.execute()
    async with asyncio.timeout(BOUND):
        await hooked.wait()
    assert [await pending(stream, i) for i in later] == [("A", 3), ("A", 3)]  # held by A
    closing = asyncio.create_task(a.close())
    await asyncio.sleep(0.2)  # waiting for the consumer, which stops within block_ms + 5 s
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(BOUND):
            await closing
    assert in_a == []  # its run and its hook cut short with the close, not left running unkept
    # handed back, not acknowledged: pending, their claim's (or read's) delivery taken back
    assert [await pending(stream, i) for i in later] == [("A", 2), ("A", 2)]
    assert await pending(stream, spent) == ("A", 5)
    assert await pending(stream, slow_id) == ("A", 0)

    async def record(payloads: list[dict]) -> None:
        ran_b.extend((p, bool(in_a)) for p in payloads)

    async def told(payload: dict) -> None:
        ran_b.append((payload, bool(in_a)))

    b = BackgroundWork(
        TaskStream(client, stream.stream, consumer="B"), {"slow": record, "later": record},
        claim_idle_ms=300, block_ms=100, on_dead_letter={"spent": told},
    )  # fmt: skip
    try:
        await drained(b)
    finally:
        release.set()
    assert sorted(str(p["n"]) for p, _ in ran_b) == ["0", "1", "2", "spent"]  # each once
    assert not any(beside_a for _, beside_a in ran_b)  # none while A still ran
    assert await stream.pending_count() == 0


async def test_a_batch_past_max_run_cut_short_by_a_cancelled_close_keeps_its_delivery_spent(
    client, stream
):
    """A batch running past max_run_ms is taken for hung: cut short by a cancelled close, it
    is not given back (else a handler hanging until each deploy's close is cancelled would
    get its delivery back every time and never be buried); it stays pending as it was, its
    delivery spent and its started mark kept."""
    started = asyncio.Event()

    async def hangs(payloads: list[dict]) -> None:
        started.set()
        await asyncio.Event().wait()

    a = BackgroundWork(
        TaskStream(client, stream.stream, consumer="A"), {"hung": hangs},
        claim_idle_ms=NEVER_MS, block_ms=100, max_run_ms=200,
    )  # fmt: skip
    hung_id = await a.submit("hung", {"n": 0})
    async with asyncio.timeout(BOUND):
        await started.wait()
    await asyncio.sleep(0.3)  # past its max run (at least this long: no timing window)
    closing = asyncio.create_task(a.close())
    await asyncio.sleep(0.2)  # waiting for the hung batch
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(BOUND):
            await closing
    assert await pending(stream, hung_id) == ("A", 1)
    assert await stream.started_on([Task(hung_id, "hung", {"n": 0}, 1)]) == {hung_id: 1}
