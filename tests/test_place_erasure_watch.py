"""A watch made in a deleted place while its erasure waited for the tenant's erasure lock goes
with the place (memory/governance.py `forget_place`: the place's watches are read once its
threads went, not before the lock). Against the real Redis; the lock is taken the way the code
takes it (memory/locks.py), and the erasure is seen asking for it (Redis MONITOR)."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio as aredis

from memory.governance_places import DeletedPlace
from memory.keys import forgetting_key
from memory.locks import OwnedLocks
from memory.scope import Scope
from memory.stores.watches import DAY, Watch, WatchStore

LATER = time.time() + 1000 * DAY  # never due while the test runs
WAIT = 10.0


async def watch_in(memory, tenant: str, channel: str, topic: str) -> str:
    scope = Scope(tenant, channel=channel, user="U1")
    made = await WatchStore(memory.redis).create(
        scope, topic, 7 * DAY, platform="slack", channel=channel, now=LATER
    )
    return made.id


async def until_asked_for(monitor, key: str) -> None:
    """Until some client tries to take `key` (SET … NX): the erasure waits for the lock."""
    while not (await monitor.next_command())["command"].startswith(f"SET {key} "):
        pass


async def test_a_watch_made_while_the_erasure_waited_for_its_lock_goes_too(
    memory, tenant, redis_url
):
    here = f"slack:{tenant}:C1:1700000000.000001"
    await memory.conversation.append(
        Scope(tenant, here, channel="C1", user="U1"), "user", "otters?"
    )
    before = await watch_in(memory, tenant, "C1", "sea otters")
    elsewhere = await watch_in(memory, tenant, "C2", "walruses")
    handed: list[str] = []

    async def removing(watches: list[Watch]) -> None:
        handed.extend(w.query for w in watches)

    locks, key, token = OwnedLocks(memory.redis), forgetting_key(tenant), uuid.uuid4().hex
    assert await locks.acquire(key, token, 60_000)  # another erasure of the tenant runs
    watcher = aredis.from_url(redis_url)
    try:
        async with watcher.monitor() as monitor:
            place = DeletedPlace(tenant, "slack", "C1")
            erasure = asyncio.create_task(memory.governance.forget_place(place, removing))
            async with asyncio.timeout(WAIT):
                await until_asked_for(monitor, key)
        meanwhile = await watch_in(memory, tenant, "C1", "river otters")
        assert not erasure.done()  # still waiting for the lock
    finally:
        await locks.release(key, token)
        await watcher.aclose()
    assert (await asyncio.wait_for(erasure, WAIT)).threads == 1

    left = {w.id for w in await WatchStore(memory.redis).all(tenant)}
    assert left == {elsewhere}  # the one made meanwhile went too, with the one before
    assert before not in left and meanwhile not in left
    assert sorted(handed) == ["river otters", "sea otters"]  # each creator is told
    assert {t for t, _ in await memory.conversation.threads(tenant)} == set()
