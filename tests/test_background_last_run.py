"""A task claimed past its last delivery (real Redis): buried unrun, its kind's hook told, only
if a run began on that delivery and never ended (`TaskStream.mark_started`); one whose
delivery was spent without a run (killed before it started, a lapse) gets its last run; a
hook that fails is tried again on the next claims, then its error goes with the dead letter."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bot.background import BackgroundWork
from bot.spent_tasks import HOOK_DELIVERIES, last_delivery
from memory.dead_letters import dead_letters
from memory.keys import task_stream
from memory.tasks import Task, TaskStream

MAX = 2


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"last-run-{uuid.uuid4().hex[:10]}"))
    await stream.ensure_group()
    yield stream
    await stream.destroy()


async def spent(stream: TaskStream, began: bool) -> str:
    """A task delivered MAX times to consumers that died; `began`: its last run had started."""
    task_id = await stream.add("k", {"n": 1})
    await stream.redis.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})
    for n in range(1, MAX):
        await stream.redis.xclaim(stream.stream, stream.group, f"dead-{n}", 0, [task_id])
    await stream.mark_started([Task(task_id, "k", {"n": 1}, MAX - (not began))])
    return task_id


async def run_until_settled(stream: TaskStream, handler, hook) -> None:
    work = BackgroundWork(
        TaskStream(stream.redis, stream.stream, consumer="live"), {"k": handler},
        claim_idle_ms=100, block_ms=50, max_deliveries=MAX, on_dead_letter={"k": hook},
    )  # fmt: skip
    work.start()
    try:
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        await work.close()


async def test_a_task_past_its_limit_whose_last_run_never_began_is_run(stream):
    await spent(stream, began=False)  # its run began on an earlier delivery, not the last
    ran: list[tuple[dict, bool]] = []
    told: list[dict] = []

    async def handler(payloads: list[dict]) -> None:
        ran.extend((p, last_delivery()) for p in payloads)

    async def hook(payload: dict) -> None:
        told.append(payload)

    await run_until_settled(stream, handler, hook)
    assert ran == [({"n": 1}, True)] and told == []
    assert await dead_letters(stream) == []
    assert await stream.redis.hlen(stream.runs) == 0  # cleared with the ack


async def test_a_task_whose_last_run_began_and_never_ended_is_buried_and_told(stream):
    task_id = await spent(stream, began=True)
    ran: list[dict] = []
    told: list[dict] = []

    async def handler(payloads: list[dict]) -> None:
        ran.extend(payloads)

    async def hook(payload: dict) -> None:
        told.append(payload)

    await run_until_settled(stream, handler, hook)
    assert ran == [] and told == [{"n": 1}]
    [letter] = await dead_letters(stream)
    assert letter.task_id == task_id and letter.error.startswith("not run: delivered 3 times")
    assert await stream.redis.hlen(stream.runs) == 0  # cleared with the dead letter


async def test_a_failing_hook_is_tried_again_then_its_error_goes_with_the_dead_letter(stream):
    await spent(stream, began=True)
    told: list[dict] = []

    async def handler(payloads: list[dict]) -> None:
        raise AssertionError("never run")

    async def hook(payload: dict) -> None:
        told.append(payload)
        raise ConnectionError("Slack away")

    await run_until_settled(stream, handler, hook)
    assert len(told) == HOOK_DELIVERIES  # one try per claim past the last delivery
    [letter] = await dead_letters(stream)
    assert letter.deliveries == MAX + HOOK_DELIVERIES
    assert "its hook failed: ConnectionError('Slack away')" in letter.error
