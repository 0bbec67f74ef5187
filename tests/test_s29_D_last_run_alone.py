"""A task that takes its process down (real Redis, real processes killed): its batch-mates are
not buried with it. Each task on its last delivery runs alone, so the run that never ends, and
buries its task on the next claim (bot/spent_tasks.py), is the killer's own; and the last runs
of a BackgroundWork (each process here has one) take turns, so one of another kind is not
running beside it."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

from memory.dead_letters import dead_letters
from memory.keys import task_stream
from memory.tasks import TaskStream

MAX = 2
ROOT = Path(__file__).resolve().parents[1]

# One process of the worker: the killer's payload ends it (as an out-of-memory kill would) a
# moment into its run, any other is recorded as run once it ends.
WORKER = """
import asyncio, os, sys
from bot.background import BackgroundWork
from memory.connection import connect
from memory.tasks import TaskStream

async def main(url: str, name: str, most: int) -> None:
    redis = await connect(url, warm=0)
    async def handler(payloads: list[dict]) -> None:
        if any(p["kill"] for p in payloads):
            await asyncio.sleep(0.3)  # a moment into its run: what runs beside it has started
            os._exit(9)
        await asyncio.sleep(1)  # a longer run: still running when a killer beside it kills
        await redis.rpush(name + ":ran", *(p["n"] for p in payloads))
    stream = TaskStream(redis, name, consumer=f"worker-{os.getpid()}")
    work = BackgroundWork(stream, {"a": handler, "b": handler}, claim_idle_ms=100,
                          block_ms=50, max_deliveries=most)
    work.start()
    await asyncio.wait_for(work.drain(), 20)
    await work.close()
    await redis.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"killer-{uuid.uuid4().hex[:10]}"))
    await stream.ensure_group()
    yield stream
    await stream.destroy()
    await client.delete(f"{stream.stream}:ran")


async def run_worker(redis_url: str, stream: TaskStream) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER, redis_url, stream.stream, str(MAX), cwd=ROOT
    )
    return await asyncio.wait_for(process.wait(), 60)


@pytest.mark.parametrize("innocent_kind", ["a", "b"])  # its batch, or one running beside it
async def test_batch_mates_of_a_task_that_kills_its_process_are_run_not_buried(
    stream, redis_url, innocent_kind
):
    killer = await stream.add("a", {"n": "killer", "kill": True})
    await stream.add(innocent_kind, {"n": "innocent", "kill": False})
    codes = []
    while await stream.pending_count() and len(codes) < MAX + 3:
        codes.append(await run_worker(redis_url, stream))
        await asyncio.sleep(0.2)  # idle past claim_idle_ms: the next process claims them

    assert codes[-1] == 0 and 9 in codes  # killed, then one process settled them
    ran = [r.decode() for r in await stream.redis.lrange(f"{stream.stream}:ran", 0, -1)]
    assert ran == ["innocent"]
    assert [d.task_id for d in await dead_letters(stream)] == [killer]
