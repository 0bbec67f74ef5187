"""Durable background work against the real Redis: batches, retries, dead letters, crashed
consumers, shutdown, and giving way to turns being prepared."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pytest
import redis.asyncio as aredis

from bot.background import BackgroundWork
from memory.tasks import TaskStream


@pytest.fixture
async def name(client):
    """A stream of the test's own, removed (with its dead letters) afterwards."""
    name = f"test:tasks:{uuid.uuid4().hex}"
    yield name
    await client.delete(name, f"{name}:dead")


class Recorder:
    """A handler that records its batches, and fails while `fail(payloads)` says so."""

    def __init__(self, fail=lambda payloads: False, delay: float = 0.0) -> None:
        self.calls: list[list[dict]] = []
        self.fail = fail
        self.delay = delay
        self.running = 0
        self.most_running = 0

    async def __call__(self, payloads: list[dict]) -> None:
        self.calls.append(payloads)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            if self.fail(payloads):
                raise ValueError(f"boom {payloads}")
        finally:
            self.running -= 1

    @property
    def payloads(self) -> list[dict]:
        return [p for call in self.calls for p in call]


def work(client, name: str, handlers, consumer: str | None = None, **options) -> BackgroundWork:
    options = {"claim_idle_ms": 200, "block_ms": 100, **options}
    return BackgroundWork(TaskStream(client, name, consumer=consumer), handlers, **options)


async def drain(bg: BackgroundWork, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        await bg.drain()


async def test_tasks_are_processed_and_acknowledged(client, name):
    handler = Recorder()
    bg = work(client, name, {"a": handler})
    for i in range(3):
        await bg.submit("a", {"i": i})
    await drain(bg)
    await bg.close()
    assert sorted(p["i"] for p in handler.payloads) == [0, 1, 2]
    assert await client.xlen(name) == 0  # acknowledged and deleted
    assert (await client.xpending(name, "workers"))["pending"] == 0


async def test_a_batch_holds_tasks_of_one_kind(client, name):
    index, summary = Recorder(), Recorder()
    bg = work(client, name, {"index": index, "summary": summary})
    with bg.foreground():  # hold the consumer so that one read sees every task
        for i in range(5):
            await bg.submit("index" if i % 2 == 0 else "summary", {"i": i})
    await drain(bg)
    await bg.close()
    assert index.calls == [[{"i": 0}, {"i": 2}, {"i": 4}]]
    assert summary.calls == [[{"i": 1}, {"i": 3}]]


async def test_workers_cap_concurrent_batches(client, name):
    handler = Recorder(delay=0.05)
    bg = work(client, name, {"a": handler}, workers=2, batch=2)
    with bg.foreground():
        for i in range(8):
            await bg.submit("a", {"i": i})
    await drain(bg)
    await bg.close()
    assert sorted(p["i"] for p in handler.payloads) == list(range(8))
    assert all(len(call) <= 2 for call in handler.calls)
    assert handler.most_running == 2  # in parallel, but never more than `workers`


async def test_a_failed_batch_is_retried(client, name):
    handler = Recorder(fail=lambda payloads: len(handler.calls) == 1)
    bg = work(client, name, {"a": handler})
    await bg.submit("a", {"x": 1})
    await drain(bg)
    await bg.close()
    assert handler.calls == [[{"x": 1}], [{"x": 1}]]
    assert await client.xlen(f"{name}:dead") == 0


async def test_a_task_that_keeps_failing_is_dead_lettered(client, name):
    handler = Recorder(fail=lambda payloads: True)
    bg = work(client, name, {"a": handler}, max_deliveries=3)
    task_id = await bg.submit("a", {"x": 1})
    await drain(bg)
    await bg.close()
    assert len(handler.calls) == 3
    assert await client.xlen(name) == 0
    [(_dead_id, fields)] = await client.xrange(f"{name}:dead")
    assert fields[b"id"].decode() == task_id
    assert fields[b"kind"] == b"a"
    assert json.loads(fields[b"payload"]) == {"x": 1}
    assert fields[b"deliveries"] == b"3"
    assert b"ValueError: boom" in fields[b"error"]


async def test_a_bad_task_does_not_take_its_batch_down(client, name):
    handler = Recorder(fail=lambda payloads: any(p.get("bad") for p in payloads))
    bg = work(client, name, {"a": handler}, max_deliveries=2)
    with bg.foreground():
        for payload in ({"i": 0}, {"i": 1, "bad": True}, {"i": 2}):
            await bg.submit("a", payload)
    await drain(bg)
    await bg.close()
    assert [{"i": 0}] in handler.calls and [{"i": 2}] in handler.calls  # tried alone at last
    [(_dead_id, fields)] = await client.xrange(f"{name}:dead")
    assert json.loads(fields[b"payload"]) == {"i": 1, "bad": True}


async def test_a_crashed_consumers_tasks_are_claimed(client, name):
    crashed = TaskStream(client, name, consumer="A")
    await crashed.ensure_group()
    for i in range(3):
        await crashed.add("a", {"i": i})
    assert len(await crashed.read(10, 100)) == 3  # read, never acknowledged: A "crashes"
    handler = Recorder()
    bg = work(client, name, {"a": handler}, consumer="B")
    bg.start()
    await drain(bg)
    await bg.close()
    assert sorted(p["i"] for p in handler.payloads) == [0, 1, 2]
    assert (await client.xpending(name, "workers"))["pending"] == 0


async def test_a_long_task_is_not_taken_over_while_it_runs(client, name):
    """A handler running twice the claim time, beside a second process claiming stale tasks
    (every 0.75 s): it is kept alive, so it runs once. (One worker: its busy slot keeps the
    first process from claiming anything, its own task included.) The claim time leaves a
    stalled event loop a second between keep-alives before B may claim."""
    handler = Recorder(delay=3.0)
    first = work(client, name, {"a": handler}, consumer="A", workers=1, claim_idle_ms=1500)
    second = work(client, name, {"a": handler}, consumer="B", claim_idle_ms=1500)
    await first.submit("a", {"i": 0})
    await asyncio.sleep(0.05)  # A has it
    second.start()
    await drain(first, 10)
    await asyncio.gather(first.close(), second.close())
    assert handler.payloads == [{"i": 0}]


async def test_a_task_waiting_for_a_worker_is_not_taken_over(client, name):
    """Read in one batch with a long task of another kind, a task waits for the only worker
    for twice the claim time: it is held all along, so it runs once."""
    slow, quick = Recorder(delay=3.0), Recorder()
    handlers = {"slow": slow, "quick": quick}
    first = work(client, name, handlers, consumer="A", workers=1, claim_idle_ms=1500)
    await first.stream.ensure_group()
    await first.stream.add("slow", {"i": 0})
    await first.stream.add("quick", {"i": 1})
    first.start()
    await asyncio.sleep(0.1)  # A read both: "quick" waits for the worker "slow" holds
    second = work(client, name, handlers, consumer="B", claim_idle_ms=1500)
    second.start()
    await drain(first, 10)
    await asyncio.gather(first.close(), second.close())
    assert slow.payloads == [{"i": 0}] and quick.payloads == [{"i": 1}]


async def test_a_hung_task_is_taken_over_after_max_run(client, name):
    """Keeping alive is bounded: a handler hung past max_run_ms loses its task to a live
    process, which runs it."""
    hung = asyncio.Event()

    async def hangs(payloads: list[dict]) -> None:
        hung.set()
        await asyncio.Event().wait()

    done = Recorder()
    first = work(client, name, {"a": hangs}, consumer="A", max_run_ms=400)
    await first.submit("a", {"i": 0})
    await hung.wait()
    second = work(client, name, {"a": done}, consumer="B")
    second.start()
    async with asyncio.timeout(5):
        while not done.payloads:
            await asyncio.sleep(0.05)
    await second.close()
    for runner in list(first._running):
        runner.cancel()
    await first.close()
    assert done.payloads == [{"i": 0}]


async def test_max_run_counts_from_when_the_handler_starts(client, name):
    """Read in one batch behind two batches of other kinds that each run within max_run_ms, a
    task waits for the only worker longer than max_run_ms: it is held all along and, once
    started, gets its own full run; nothing is taken over, nothing runs twice. (Counted from
    the read, all three would go unkept at 1.8 s, claimable from 3 s: "quick" runs to 4.2 s.)"""
    first_kind, second_kind, quick = Recorder(delay=1.4), Recorder(delay=1.4), Recorder(delay=1.4)
    handlers = {"a": first_kind, "b": second_kind, "quick": quick}
    options = {"claim_idle_ms": 1500, "max_run_ms": 1800}
    first = work(client, name, handlers, consumer="A", workers=1, **options)
    await first.stream.ensure_group()
    for kind, i in (("a", 0), ("b", 1), ("quick", 2)):
        await first.stream.add(kind, {"i": i})
    first.start()
    await asyncio.sleep(0.1)  # A read all three: "quick" waits 2.8 s for the worker
    second = work(client, name, handlers, consumer="B", **options)
    second.start()
    await drain(first, 10)
    await asyncio.gather(first.close(), second.close())
    assert first_kind.payloads == [{"i": 0}] and second_kind.payloads == [{"i": 1}]
    assert quick.payloads == [{"i": 2}]  # waited longer than max_run_ms: not taken


async def test_tasks_waiting_behind_a_hung_batch_go_to_another_process(client, name):
    """When every batch a process runs is past max_run_ms (hung), the tasks it read that wait
    for a worker are no longer kept either: another process takes them over and runs them."""
    in_b = {"slow": Recorder(delay=1.5), "quick": Recorder()}

    async def hung(payloads: list[dict]) -> None:
        """Runs past max_run_ms until B ran "quick" (or 10 s: then A runs it, and fails)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while not in_b["quick"].payloads:
                    await asyncio.sleep(0.05)

    in_a = {"slow": hung, "quick": Recorder()}
    first = work(client, name, in_a, consumer="A", workers=1, max_run_ms=400)
    await first.stream.ensure_group()
    await first.stream.add("slow", {"i": 0})
    await first.stream.add("quick", {"i": 1})
    first.start()
    await asyncio.sleep(0.1)  # A read both: "quick" waits for the worker "slow" holds
    second = work(client, name, in_b, consumer="B")
    second.start()
    await drain(first, 15)
    await asyncio.gather(first.close(), second.close())
    assert in_b["quick"].payloads == [{"i": 1}]  # B took it while A's worker was hung


async def test_keep_alive_leaves_a_task_taken_over_with_its_new_consumer(client, name):
    slow = TaskStream(client, name, consumer="A")
    await slow.ensure_group()
    await slow.add("a", {"i": 0})
    tasks = await slow.read(1, 100)
    await asyncio.sleep(0.05)
    assert await slow.keep_alive(tasks) == 1  # still A's
    other = TaskStream(client, name, consumer="B")
    await asyncio.sleep(0.05)
    assert [t.id for t in await other.claim_stale(10, 10)] == [tasks[0].id]
    assert await slow.keep_alive(tasks) == 0  # B's now: A does not take it back
    pending = await client.xpending_range(name, "workers", min="-", max="+", count=10)
    assert [row["consumer"] for row in pending] == [b"B"]


async def test_close_finishes_the_batch_in_hand_and_leaves_the_rest(client, name):
    started, release = asyncio.Event(), asyncio.Event()
    first: list[list[dict]] = []

    async def slow(payloads: list[dict]) -> None:
        started.set()
        await release.wait()
        first.append(payloads)

    later = Recorder()
    bg = work(client, name, {"slow": slow, "later": later}, workers=1)
    await bg.submit("slow", {"n": 0})
    await asyncio.wait_for(started.wait(), 2)
    await bg.submit("later", {"n": 1})
    await bg.submit("later", {"n": 2})
    closing = asyncio.create_task(bg.close())
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.wait_for(closing, 3)
    assert first == [[{"n": 0}]] and later.calls == []
    stream = TaskStream(client, name)
    assert await stream.pending_count() == 2  # still in Redis, and never delivered:
    assert (await client.xpending(name, "workers"))["pending"] == 0

    successor = work(client, name, {"slow": slow, "later": later})
    await drain(successor)
    await successor.close()
    assert later.payloads == [{"n": 1}, {"n": 2}]


async def test_tasks_wait_while_a_turn_is_prepared(client, name):
    handler = Recorder()
    bg = work(client, name, {"a": handler}, max_wait=5.0)
    with bg.foreground():
        await bg.submit("a", {"x": 1})
        await asyncio.sleep(0.3)
        assert handler.calls == []
    await drain(bg, seconds=2)
    await bg.close()
    assert handler.calls == [[{"x": 1}]]


async def test_tasks_wait_at_most_max_wait(client, name):
    handler = Recorder()
    bg = work(client, name, {"a": handler}, max_wait=0.2)
    with bg.foreground():  # a turn that never ends
        await bg.submit("a", {"x": 1})
        await drain(bg, seconds=2)
    await bg.close()
    assert handler.calls == [[{"x": 1}]]


async def test_a_redis_error_in_the_loop_is_not_fatal(client, name):
    await client.set(name, "not a stream")  # XGROUP CREATE fails with WRONGTYPE
    handler = Recorder()
    bg = work(client, name, {"a": handler})
    bg.start()
    await asyncio.sleep(0.2)
    await client.delete(name)
    await bg.submit("a", {"x": 1})
    await drain(bg)
    await bg.close()
    assert handler.calls == [[{"x": 1}]]


async def test_submit_refuses_a_kind_without_handler(client, name):
    bg = work(client, name, {"a": Recorder()})
    with pytest.raises(ValueError, match="No handler"):
        await bg.submit("b", {})
    assert await client.exists(name) == 0


async def test_stream_counts_undelivered_and_skips_deleted_entries(client, name):
    a = TaskStream(client, name, consumer="A")
    await a.ensure_group()
    await a.ensure_group()  # BUSYGROUP is fine
    first = await a.add("k", {"n": 1})
    await a.add("k", {"n": 2})
    await a.add("k", {"n": 3})
    assert await a.pending_count() == 3
    assert [t.payload for t in await a.read(2, 100)] == [{"n": 1}, {"n": 2}]
    assert await a.pending_count() == 3  # two delivered, one not: none acknowledged
    await client.xdel(name, first)
    await asyncio.sleep(0.02)
    b = TaskStream(client, name, consumer="B")
    [claimed] = await b.claim_stale(10, 10)
    assert claimed.payload == {"n": 2} and claimed.deliveries == 2
    assert await b.deliveries(claimed.id) == 2
    await b.ack([claimed])
    assert await b.pending_count() == 1
    assert await b.claim_stale(10, 10) == []


async def test_stream_recreates_a_vanished_group_and_decodes_strings(redis_url, name):
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        stream = TaskStream(client, name)
        await stream.ensure_group()
        await client.delete(name)
        assert await stream.read(10, 10) == []  # NOGROUP: recreated, not raised
        task_id = await stream.add("k", {"s": "é"})
        [task] = await stream.read(10, 10)
        assert (task.id, task.kind, task.payload, task.deliveries) == (task_id, "k", {"s": "é"}, 1)
        await stream.ack([task])
        assert await stream.pending_count() == 0
    finally:
        await client.aclose()
