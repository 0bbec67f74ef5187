"""Auto-pipelining against the real Redis: commands issued together share one round trip."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.exceptions import ResponseError

from memory.autopipeline import AutoPipelineRedis


async def connections_received(client) -> int:
    return int((await client.info("stats"))["total_connections_received"])


async def test_concurrent_commands_share_one_connection(client):
    assert isinstance(client, AutoPipelineRedis)
    key = f"ap:{uuid.uuid4().hex}"
    await client.rpush(key, *range(50))
    before = await connections_received(client)
    values = await asyncio.gather(*(client.lindex(key, i) for i in range(50)))
    after = await connections_received(client)
    assert [int(v) for v in values] == list(range(50))  # each caller gets its own reply
    assert after - before <= 1  # sent one by one, they would have opened ~50 connections


async def test_a_failing_command_fails_alone(client):
    key = f"ap:{uuid.uuid4().hex}"
    await client.rpush(key, "x")
    await client.set(key + ":s", "fine")
    results = await asyncio.gather(
        client.get(key + ":s"), client.get(key), client.llen(key), return_exceptions=True
    )
    assert results[0] == b"fine"
    assert isinstance(results[1], ResponseError) and "WRONGTYPE" in str(results[1])
    assert results[2] == 1


async def test_blocking_commands_keep_their_own_connection(client):
    key = f"ap:{uuid.uuid4().hex}"
    finished: list[str] = []

    async def blocking() -> None:
        await client.blpop([key + ":empty"], timeout=0.5)
        finished.append("blpop")

    async def quick() -> None:
        await client.set(key, "v")
        assert await client.get(key) == b"v"
        finished.append("get")

    await asyncio.gather(blocking(), quick())
    assert finished == ["get", "blpop"]  # the quick commands never queued behind BLPOP


async def test_cancelled_caller_does_not_break_the_batch(client):
    key = f"ap:{uuid.uuid4().hex}"
    await client.set(key, "v")
    doomed = asyncio.ensure_future(client.get(key))
    kept = asyncio.ensure_future(client.get(key))
    await asyncio.sleep(0)  # both queued in the same tick
    doomed.cancel()
    assert await kept == b"v"
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert await client.get(key) == b"v"  # the client still works
