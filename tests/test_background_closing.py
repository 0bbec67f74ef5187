"""A process that stopped reading (bot/background.py `stop_reading`) starts no consumer again:
an event arriving during its shutdown (a Slack message_deleted, say) queues its task in Redis,
where another process runs it, instead of restarting a consumer that would claim what the
stopping processes handed back and be killed mid-run. Real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bot.background import BackgroundWork
from memory.keys import task_stream
from memory.tasks import TaskStream

CONSUMER = "background-consumer"


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"closing-{uuid.uuid4().hex[:10]}"))
    yield stream
    await stream.destroy()


def consumers_running() -> int:
    """The consumer loops alive in this event loop (found by their task's name)."""
    return sum(t.get_name() == CONSUMER and not t.done() for t in asyncio.all_tasks())


async def test_a_task_submitted_while_closing_waits_in_redis_for_another_process(client, stream):
    ran: list[tuple[str, dict]] = []

    def recorder(who: str):
        async def handler(payloads: list[dict]) -> None:
            ran.extend((who, p) for p in payloads)

        return handler

    closing = BackgroundWork(
        TaskStream(client, stream.stream, consumer="closing"), {"deleted": recorder("closing")},
        claim_idle_ms=200, block_ms=100,
    )  # fmt: skip
    closing.start()
    await closing.stop_reading()
    assert consumers_running() == 0

    task_id = await closing.submit("deleted", {"source": "slack:C1:1"})  # during shutdown
    assert consumers_running() == 0  # queued only: no consumer started
    await closing.drain()  # a closing process does not wait for what it no longer reads
    assert await stream.pending_count() == 1 and ran == []
    await closing.close()

    live = BackgroundWork(
        TaskStream(client, stream.stream, consumer="live"), {"deleted": recorder("live")},
        claim_idle_ms=200, block_ms=100,
    )  # fmt: skip
    try:
        async with asyncio.timeout(20):
            await live.drain()
    finally:
        await live.close()
    assert ran == [("live", {"source": "slack:C1:1"})]
    assert await stream.pending_count() == 0 and task_id
