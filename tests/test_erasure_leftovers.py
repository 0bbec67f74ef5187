"""Episodic documents an erasure hid but did not purge (its process stopped, or Redis failed
mid-purge) are finished by any live process: the retention tick (memory/retention.py
`schedule`) runs `Governance.purge_leftovers`, which leaves a tenant to an erasure holding its
lock, and to a purge that marked it in the last few minutes."""

from __future__ import annotations

import time

from memory.governance_purge import Purge
from memory.governance_threads import ThreadEraser
from memory.keys import erasing_key, forgetting_key, purging_key
from memory.locks import OwnedLocks
from memory.retention import Retention
from memory.scope import Scope
from tests.test_governance import found, say, word
from tests.test_retention import interval
from tests.test_turn_recovery_forgotten import episodic_keys


async def nothing(kind: str, payload: dict) -> None:
    """Where the sweeps would be queued: the tenant keeps everything, none is."""


async def test_a_purge_a_stopped_process_left_is_finished_on_the_retention_tick(memory, tenant):
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    secret = word()
    said = await say(memory, scope, [f"my badge code is {secret}, keep it", "Noted."])
    # a process erases the thread and stops before its purge: hidden from reads, not deleted
    eraser = ThreadEraser(memory, Purge(memory))
    await eraser.erase_threads(tenant, await eraser.read(tenant, ["t1"]))
    assert not any(secret in hit for hit in await found(memory, scope, secret))
    left = sorted(await episodic_keys(memory, tenant))
    assert memory.episodes.key(tenant, said[0].id).encode() in left  # its full text, still
    retention, now = Retention(memory, sweep_seconds=interval()), time.time()
    ticks = iter(range(1, 10))

    async def tick() -> None:
        """This process's retention tick, each in an interval of its own (it takes the claim)."""
        await retention.schedule(nothing, now + next(ticks) * retention.sweep_seconds)

    # an erasure of the tenant is running: its end purges, the tick leaves the tenant to it
    locks = OwnedLocks(memory.redis)
    assert await locks.acquire(forgetting_key(tenant), "another-erasure", 60_000)
    await tick()
    assert sorted(await episodic_keys(memory, tenant)) == left
    await locks.release(forgetting_key(tenant), "another-erasure")
    # a purge marked the tenant a moment ago (at it, or stopped only just): left to it
    await memory.redis.set(purging_key(tenant), 1, ex=300)
    await tick()
    assert sorted(await episodic_keys(memory, tenant)) == left
    await memory.redis.delete(purging_key(tenant))  # its mark lapsed: that purge stopped

    await tick()

    assert await episodic_keys(memory, tenant) == []
    assert not await memory.redis.exists(erasing_key(tenant))
    assert not await memory.redis.exists(forgetting_key(tenant))  # the lock was given back
    await tick()  # nothing left: nothing to do
    assert not any(secret in hit for hit in await found(memory, scope, secret))
