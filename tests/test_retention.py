"""Retention (memory/retention.py) against the real Redis: the period a tenant keeps (its own, the
default, "off"), the sweep that forgets older conversation memory and keeps papers, and its
scheduling by several processes: one sweep per interval, taken over when its process dies."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import asdict

import pytest

from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import Upkeep
from memory.keys import task_stream
from memory.retention import SWEEP, InvalidRetention, Retention
from memory.scope import Scope
from memory.stores.entity import Entity
from memory.tasks import TaskStream
from tests.test_memory_stores import add_memgpt

DAY = 86_400


def interval() -> float:
    """A sweep interval of this test's own: its claims never meet another test's."""
    return 5_000 + random.random() * 1_000


async def say(memory, scope: Scope, texts: list[str], when: float) -> None:
    said = [
        await memory.conversation.append(scope, "user", text, timestamp=when + i)
        for i, text in enumerate(texts)
    ]
    stream = TaskStream(memory.redis, task_stream(f"ret-{uuid.uuid4().hex[:6]}"))
    upkeep = Upkeep(memory, Consolidator(memory, None), BackgroundWork(stream))
    await upkeep.index_episodes([{"scope": scope.to_dict(), "messages": [asdict(m) for m in said]}])


async def aged(memory, tenant: str) -> None:
    """An old thread, a thread with old and new messages, a paper and an entity."""
    old, new = time.time() - 3 * DAY, time.time() - 600
    await say(memory, Scope(tenant, "old"), ["the aardvark budget was approved"], old)
    mixed = Scope(tenant, "mixed")
    await say(memory, mixed, ["the pangolin deadline is Friday"], old)
    await say(memory, mixed, ["the narwhal review went well"], new)
    await add_memgpt(memory, tenant)
    await memory.entities.upsert(mixed, [Entity("Pangolin", "project", "A project.")])


async def texts(memory, tenant: str) -> list[str]:
    found = []
    for thread, _ in await memory.conversation.threads(tenant):
        found += [m.content for m in await memory.conversation.all(Scope(tenant, thread))]
    return found


async def recalled(memory, tenant: str, query: str) -> list[str]:
    vector = await memory.embedder.embed_one(query)
    return [e.text for e in await memory.episodes.search(Scope(tenant), query, vector)]


async def test_the_period_is_the_tenants_own_else_the_default(memory, tenant):
    retention = Retention(memory)
    assert await retention.get(tenant) is None and await retention.period(tenant) is None
    await retention.set(tenant, 30)
    assert await retention.get(tenant) == 30 and await retention.period(tenant) == 30 * DAY
    await retention.set(tenant, 0.5)
    assert await retention.get(tenant) == 0.5
    defaulted = Retention(memory, default_days=7)
    assert await defaulted.get(tenant) == 0.5  # its own setting wins
    await defaulted.set(tenant, None)  # kept for ever, whatever the default
    assert await defaulted.get(tenant) is None and await defaulted.own(tenant) == (True, None)
    await defaulted.clear(tenant)
    assert await defaulted.get(tenant) == 7 and await defaulted.own(tenant) == (False, None)
    for bad in (0, -1, 40_000, float("nan"), "30", True):
        with pytest.raises(InvalidRetention):
            await retention.set(tenant, bad)


async def test_a_sweep_forgets_older_conversation_memory_and_keeps_papers(memory, tenant):
    await aged(memory, tenant)
    assert "aardvark" in " ".join(await recalled(memory, tenant, "aardvark budget"))
    retention = Retention(memory)
    assert await retention.sweep(tenant) is None  # no period: nothing goes
    assert len(await texts(memory, tenant)) == 3 and await retention.last_sweep(tenant) is None

    await retention.set(tenant, 1)
    erasure = await retention.sweep(tenant)
    assert erasure.messages >= 1 and erasure.episodes == 2
    assert [t for t, _ in await memory.conversation.threads(tenant)] == ["mixed"]
    assert await texts(memory, tenant) == ["the narwhal review went well"]
    assert not any("aardvark" in t for t in await recalled(memory, tenant, "aardvark budget"))
    assert not any("pangolin" in t for t in await recalled(memory, tenant, "pangolin deadline"))
    assert "narwhal" in " ".join(await recalled(memory, tenant, "narwhal review"))
    assert [p["arxiv_id"] for p in await memory.knowledge_base.papers(Scope(tenant))] == [
        "2310.08560"
    ]
    assert [e.name for e in await memory.entities.all(Scope(tenant))] == ["Pangolin"]
    last = await retention.last_sweep(tenant)
    assert last["sweeps"] == 1 and last["episodes"] == 2
    assert last["cutoff"] == pytest.approx(time.time() - DAY, abs=60)


async def test_the_default_period_sweeps_tenants_without_their_own(memory, tenant):
    await aged(memory, tenant)
    keeps = f"t-{uuid.uuid4().hex[:10]}"
    await aged(memory, keeps)
    defaulted = Retention(memory, default_days=1)
    await defaulted.set(keeps, None)
    assert await defaulted.sweep(keeps) is None
    assert len(await texts(memory, keeps)) == 3
    assert (await defaulted.sweep(tenant)).messages >= 1
    assert await texts(memory, tenant) == ["the narwhal review went well"]


async def test_one_process_queues_an_intervals_sweeps(memory, tenant):
    await aged(memory, tenant)
    retention = Retention(memory, sweep_seconds=interval())
    await retention.set(tenant, 1)
    queued: list[list[tuple[str, dict]]] = [[], []]

    def submitter(n: int):
        async def submit(kind: str, payload: dict) -> None:
            queued[n].append((kind, payload))

        return submit

    now = time.time()
    won = await asyncio.gather(*(retention.schedule(submitter(n), now) for n in range(2)))
    assert sorted(map(bool, won)) == [False, True]  # one process won the interval's claim
    assert any(kind == SWEEP and p["tenant"] == tenant for kind, p in queued[0] + queued[1])
    assert not queued[0] or not queued[1]
    assert await retention.schedule(submitter(0), now + 1) == []  # same interval
    later = await retention.schedule(submitter(0), now + retention.sweep_seconds)
    assert tenant in later  # the next interval sweeps again


async def until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_two_processes_sweep_once_per_interval(memory, tenant):
    await aged(memory, tenant)
    retention = Retention(memory, sweep_seconds=interval())
    await retention.set(tenant, 1)
    name = task_stream(f"ret-{uuid.uuid4().hex[:6]}")
    workers = [
        BackgroundWork(TaskStream(memory.redis, name), {SWEEP: retention.sweep_tasks})
        for _ in range(2)
    ]
    try:
        for work in workers:
            work.every(
                retention.sweep_seconds, lambda w=work: retention.schedule(w.submit), first=0
            )

        async def swept() -> bool:
            return (await retention.last_sweep(tenant) or {}).get("sweeps") == 1 and not (
                await workers[0].stream.pending_count()
            )

        await until(swept)
        await asyncio.sleep(0.5)  # a second sweep, were one queued, would have run by now
    finally:
        for work in workers:
            await work.close()
        await workers[0].stream.destroy()
    assert (await retention.last_sweep(tenant))["sweeps"] == 1
    assert await texts(memory, tenant) == ["the narwhal review went well"]


async def test_a_sweep_whose_process_died_is_taken_over(memory, tenant):
    await aged(memory, tenant)
    retention = Retention(memory, sweep_seconds=interval())
    await retention.set(tenant, 1)
    name = task_stream(f"ret-{uuid.uuid4().hex[:6]}")
    dead = TaskStream(memory.redis, name, consumer="died-mid-sweep")
    await dead.ensure_group()
    assert tenant in await retention.schedule(dead.add)
    taken = await dead.read(count=10_000, block_ms=1000)  # read, then the process died: no ack
    assert any(t.kind == SWEEP and t.payload["tenant"] == tenant for t in taken)
    assert await retention.last_sweep(tenant) is None
    alive = BackgroundWork(TaskStream(memory.redis, name), {SWEEP: retention.sweep_tasks},
                           claim_idle_ms=200)  # fmt: skip
    try:
        alive.start()
        await until(lambda: _zero(alive))
    finally:
        await alive.close()
        await dead.destroy()
    assert (await retention.last_sweep(tenant))["sweeps"] == 1
    assert await texts(memory, tenant) == ["the narwhal review went well"]


async def _zero(work: BackgroundWork) -> bool:
    return not await work.stream.pending_count()
