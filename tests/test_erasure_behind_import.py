"""Erasures behind an import (memory/portability.py holds the tenant's erasure lock while it
writes, maybe for many minutes): an erasure fails at once (`ImportRunning`), and a background
one, a message deleted on the platform, is put back with its delivery unspent, holding no
worker, however long the import lasts; once the import ends it runs. Real Redis throughout."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import DELETED, Upkeep
from memory.errors import Deferred
from memory.governance import ImportRunning
from memory.governance_tenants import TenantErasures
from memory.keys import forgetting_key, import_lock_key, task_stream
from memory.retention import SWEEP, Retention
from memory.scope import Scope
from memory.stores.conversation import Message
from memory.tasks import Task, TaskStream

MAX_DELIVERIES = 2
CLAIM_IDLE_MS = 200  # a put-back task is claimed again this long after: many tries per second
WAIT = 30.0  # seconds: bounds every wait below (an erasure waiting for the lock takes 60)
NOOP = "noop"


@pytest.fixture
async def stream(memory):
    stream = TaskStream(memory.redis, task_stream(f"behind-import-{uuid.uuid4().hex[:8]}"))
    yield stream
    await stream.destroy()


async def importing(memory, tenant: str) -> Callable[[], Awaitable[None]]:
    """Hold the locks an import holds while it writes (its own, and the tenant's erasure
    lock); returns what ends it."""
    token = uuid.uuid4().hex
    keys = [import_lock_key(tenant), forgetting_key(tenant)]
    for key in keys:
        assert await memory.redis.set(key, token, px=600_000, nx=True)

    async def end() -> None:
        for key in keys:  # one slot each
            await memory.redis.delete(key)

    return end


async def deleted_message(memory, tenant: str) -> tuple[Scope, Message, str]:
    """A person's message, stored from the platform (its `source`), that they then delete."""
    scope = Scope(tenant, "C1:1.1", user="U1")
    source = f"C1:{uuid.uuid4().hex[:6]}"
    said = await memory.conversation.append(scope, "user", "the walrus budget", source=source)
    await memory.conversation.append(scope, "assistant", "Noted.")
    return scope, said, source


async def forgotten(memory, scope: Scope, message: Message) -> bool:
    stored = await memory.conversation.all(scope, forgotten=True)
    return next(m for m in stored if m.id == message.id).forgotten


def counted(handler: Callable[[list[dict]], Awaitable[None]], runs: list[list[dict]]):
    """The handler, each of its runs recorded (the payloads it was given)."""

    async def run(payloads: list[dict]) -> None:
        runs.append(payloads)
        await handler(payloads)

    return run


async def until(check: Callable[[], Awaitable[bool] | bool]) -> None:
    async def poll() -> None:
        while True:
            ready = check()
            if not isinstance(ready, bool):
                ready = await ready
            if ready:
                return
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), WAIT)


def background(
    stream: TaskStream, handlers: dict[str, Any], max_deliveries: int = MAX_DELIVERIES
) -> BackgroundWork:
    return BackgroundWork(
        stream,
        handlers,
        workers=1,
        claim_idle_ms=CLAIM_IDLE_MS,
        max_deliveries=max_deliveries,
        block_ms=100,
    )


async def drain_then_close(work: BackgroundWork) -> None:
    """Wait (at most WAIT) for every task queued to have run, then close the workers: also
    when that wait fails, so no worker outlives the test."""
    try:
        await asyncio.wait_for(work.drain(), WAIT)
    finally:
        await work.close()


def deletions(memory, stream: TaskStream) -> Upkeep:
    """The upkeep whose `forget_deleted` a deleted message's task runs (its own queue, on the
    test's stream)."""
    queue = BackgroundWork(TaskStream(memory.redis, stream.stream))
    return Upkeep(memory, Consolidator(memory, None), queue)


async def one_pending(stream: TaskStream) -> bool:
    """Only the task held back by the import is left unacknowledged."""
    return await stream.pending_count() == 1


async def test_an_erasure_behind_an_import_fails_at_once_saying_so(memory, tenant):
    scope, said, _ = await deleted_message(memory, tenant)
    end = await importing(memory, tenant)
    try:
        with pytest.raises(ImportRunning, match="import is running"):
            await asyncio.wait_for(
                memory.governance.forget_message(tenant, scope.thread, said.id), WAIT / 3
            )
    finally:
        await end()
    assert not await forgotten(memory, scope, said)


async def test_a_deletion_behind_an_import_waits_for_it_unspent_and_holds_no_worker(
    memory, tenant, stream
):
    upkeep = deletions(memory, stream)
    runs: list[list[dict]] = []
    others: list[dict] = []

    async def noop(payloads: list[dict]) -> None:
        others.extend(payloads)

    work = background(stream, {DELETED: counted(upkeep.forget_deleted, runs), NOOP: noop})
    scope, said, source = await deleted_message(memory, tenant)
    end = await importing(memory, tenant)
    try:
        task_id = await work.submit(
            DELETED, {"tenant": tenant, "threads": [scope.thread], "source": source}
        )
        await until(lambda: len(runs) >= 1)
        # the single worker is free meanwhile: other work runs
        await work.submit(NOOP, {"n": 1})
        await until(lambda: others == [{"n": 1}])
        # tried again and again, well past its deliveries: never dead-lettered nor spent
        await until(lambda: len(runs) > 2 * MAX_DELIVERIES + 1)
        assert await memory.redis.xlen(stream.dead_stream) == 0
        assert await stream.deliveries(task_id) <= 1
        assert not await forgotten(memory, scope, said)
    finally:
        await end()
    # the import ended: the deletion runs, and the message is forgotten
    await drain_then_close(work)
    await memory.governance.settle()
    assert await forgotten(memory, scope, said)
    assert await memory.redis.xlen(stream.dead_stream) == 0


@pytest.mark.parametrize("free_first", [False, True])
async def test_one_tenants_import_holds_back_no_other_tenants_deletion_in_its_batch(
    memory, stream, free_first
):
    importing_tenant, other = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(2))
    upkeep = deletions(memory, stream)
    work = background(stream, {DELETED: upkeep.forget_deleted})
    held_scope, held, held_source = await deleted_message(memory, importing_tenant)
    free_scope, free, free_source = await deleted_message(memory, other)
    end = await importing(memory, importing_tenant)
    try:
        await stream.ensure_group()
        queued = [(held_scope, held_source), (free_scope, free_source)]
        for scope, source in reversed(queued) if free_first else queued:
            payload = {"tenant": scope.tenant, "threads": [scope.thread], "source": source}
            await stream.add(DELETED, payload)  # both queued before the consumer reads: a batch
        work.start()
        await until(lambda: forgotten(memory, free_scope, free))
        assert not await forgotten(memory, held_scope, held)
        await until(lambda: one_pending(stream))  # the other's ack follows its erasure
        assert await memory.redis.xlen(stream.dead_stream) == 0
    finally:
        await end()
    await drain_then_close(work)
    assert await forgotten(memory, held_scope, held)
    assert await memory.redis.xlen(stream.dead_stream) == 0


async def test_a_put_back_task_is_not_dead_lettered_unrun_after_a_crash_before_its_run(
    memory, tenant, stream
):
    """Put back on its last delivery, then claimed by a process killed before it ran it: the
    next claim, past its last delivery, runs it (its deferred run ended, nothing to bury)."""
    runs: list[list[dict]] = []

    async def deferred(payloads: list[dict]) -> None:
        await first.stop_reading()  # closing once this run ends: nothing claims it again
        raise ImportRunning()

    first = background(stream, {NOOP: counted(deferred, runs)}, max_deliveries=1)
    task_id = await first.submit(NOOP, {"tenant": tenant})
    await until(lambda: len(runs) == 1)
    await first.close()
    assert await stream.deliveries(task_id) == 0  # put back, its delivery unspent
    killed = TaskStream(memory.redis, stream.stream, consumer="killed-before-running-it")
    assert [t.id for t in await killed.claim_stale(0, 10)] == [task_id]

    async def done(payloads: list[dict]) -> None:
        pass

    work = background(TaskStream(memory.redis, stream.stream), {NOOP: counted(done, runs)},
                      max_deliveries=1)  # fmt: skip
    work.start()
    await drain_then_close(work)
    assert len(runs) == 2
    assert await memory.redis.xlen(stream.dead_stream) == 0


async def test_closing_while_a_deferred_batch_runs_alone_gives_the_rest_back_unrun(stream):
    runs: list[list[dict]] = []

    async def handler(payloads: list[dict]) -> None:
        if len(payloads) > 1:
            raise Deferred("one of them cannot run now")
        await work.stop_reading()  # closing during the first task's run alone

    work = background(stream, {NOOP: counted(handler, runs)})
    await stream.ensure_group()
    ids = [await stream.add(NOOP, {"n": n}) for n in range(3)]  # one batch
    work.start()
    await until(lambda: len(runs) >= 2)
    await work.close()
    assert runs == [[{"n": 0}, {"n": 1}, {"n": 2}], [{"n": 0}]]
    assert await stream.pending_count() == 2
    assert [await stream.deliveries(i) for i in ids[1:]] == [0, 0]  # handed back unspent


async def test_tasks_waiting_to_run_alone_carry_no_started_mark_of_their_batch(stream):
    """A deferred batch's tasks waiting for their run alone have no started mark left from the
    batch's run: killed meanwhile, the process leaves them to be run when claimed again past
    their last delivery, not buried as runs that never ended."""
    runs: list[list[dict]] = []
    running_alone, release = asyncio.Event(), asyncio.Event()

    async def handler(payloads: list[dict]) -> None:
        if len(payloads) > 1:
            raise Deferred("one of them cannot run now")
        running_alone.set()
        await release.wait()  # the first task's run alone, while the others wait

    work = background(stream, {NOOP: counted(handler, runs)}, max_deliveries=1)
    await stream.ensure_group()
    ids = [await stream.add(NOOP, {"n": n}) for n in range(3)]  # one batch
    work.start()
    try:
        await asyncio.wait_for(running_alone.wait(), WAIT)
        marks = await stream.started_on([Task(i, NOOP, {}, 1) for i in ids])
        assert ids[1] not in marks and ids[2] not in marks, marks
        assert ids[0] in marks  # the one running alone marks its own run
    finally:
        release.set()
        await work.close()


async def test_a_whole_tenant_erasure_behind_an_import_fails_at_once(memory, tenant):
    end = await importing(memory, tenant)
    try:
        with pytest.raises(ImportRunning):
            await asyncio.wait_for(TenantErasures(memory).erase(tenant), WAIT / 3)
    finally:
        await end()


async def test_an_erasure_behind_another_is_not_said_to_be_behind_an_import(memory, tenant):
    """An import that holds its own lock and waits for an erasure's: the erasure lock is not
    the import's, and an erasure behind it waits for it as usual."""
    scope, said, _ = await deleted_message(memory, tenant)
    assert await memory.redis.set(import_lock_key(tenant), "import", px=600_000, nx=True)
    assert await memory.redis.set(forgetting_key(tenant), "erasure", px=600_000, nx=True)
    erasing = asyncio.create_task(memory.governance.forget_message(tenant, scope.thread, said.id))
    try:
        await asyncio.sleep(0.3)  # it tries the lock meanwhile: behind an erasure, it waits
        await memory.redis.delete(forgetting_key(tenant))  # the other erasure ends
        await asyncio.wait_for(erasing, WAIT)
    finally:
        erasing.cancel()
        await memory.redis.delete(import_lock_key(tenant))
    await memory.governance.settle()
    assert await forgotten(memory, scope, said)


@pytest.mark.parametrize("free_first", [False, True])
async def test_a_sweep_batch_behind_an_import_sweeps_every_other_tenant_once(
    memory, stream, free_first
):
    importing_tenant, other = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(2))
    retention = Retention(memory)
    for tenant in (importing_tenant, other):
        await retention.set(tenant, 30)
    work = background(stream, {SWEEP: retention.sweep_tasks})
    end = await importing(memory, importing_tenant)
    try:
        await stream.ensure_group()
        tenants = [other, importing_tenant] if free_first else [importing_tenant, other]
        for tenant in tenants:  # both queued before the consumer reads: a batch
            await stream.add(SWEEP, {"tenant": tenant, "queued_at": 0})
        work.start()
        await until(lambda: one_pending(stream))
        assert await retention.last_sweep(importing_tenant) is None
    finally:
        await end()
    await drain_then_close(work)
    for tenant in (importing_tenant, other):
        assert (await retention.last_sweep(tenant) or {}).get("sweeps") == 1
    assert await memory.redis.xlen(stream.dead_stream) == 0
