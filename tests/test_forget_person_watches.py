"""A person's erasure (memory/governance.py `forget_person`) takes the watches of their DMs:
the DM's threads go whole, and a watch left there would keep their query and keep posting
digests to them. It goes as a removed watch does, off the schedule too; the watches they made
elsewhere stay (they belong to their places), without their id."""

from __future__ import annotations

import time

from memory.keys import watches_due_key
from memory.scope import Scope, Visibility
from memory.stores.watches import WatchStore

DAY = 86_400
LATER = time.time() + 1000 * DAY  # never due while the test runs


async def scheduled(memory, tenant: str, watch_id: str) -> bool:
    return await memory.redis.zscore(watches_due_key(), f"{tenant}|{watch_id}") is not None


async def test_erasing_a_person_removes_the_watches_of_their_dms(memory, tenant):
    store = WatchStore(memory.redis)
    dm = Scope(tenant, "dm-u1", channel="D1", user="U1", visibility=Visibility.DM)
    channel = Scope(tenant, "c1", channel="C1", user="U1")
    await memory.conversation.append(dm, "user", "watch diffusion models for me")
    own = await store.create(dm, "diffusion models", DAY, platform="slack", channel="D1", now=LATER)
    shared = await store.create(
        channel, "graph networks", DAY, platform="slack", channel="C1", now=LATER
    )
    assert await scheduled(memory, tenant, own.id)

    await memory.governance.forget_person(tenant, "U1")

    assert await store.get(tenant, own.id) is None
    assert not await scheduled(memory, tenant, own.id)
    kept = await store.get(tenant, shared.id)
    assert kept is not None and kept.created_by == "" and kept.query == "graph networks"
    assert await scheduled(memory, tenant, shared.id)


async def test_a_watch_of_their_dm_made_by_no_one_known_goes_too(memory, tenant):
    """Found by the DM's audience (`Sweeps.person`), not its creator: one imported, or whose
    creator was cleared before, goes with the DM it posts to."""
    store = WatchStore(memory.redis)
    dm = Scope(tenant, "dm-u1", channel="D1", user="U1", visibility=Visibility.DM)
    await memory.conversation.append(dm, "user", "watch transformers")
    anonymous = Scope(tenant, "dm-u1", channel="D1", user="", visibility=Visibility.DM)
    made = await store.create(anonymous, "transformers", DAY, platform="slack", channel="D1",
                              now=LATER)  # fmt: skip
    other_dm = Scope(tenant, "dm-u2", channel="D2", user="U2", visibility=Visibility.DM)
    theirs = await store.create(other_dm, "robots", DAY, platform="slack", channel="D2", now=LATER)

    await memory.governance.forget_person(tenant, "U1")

    assert await store.get(tenant, made.id) is None
    assert not await scheduled(memory, tenant, made.id)
    assert await store.get(tenant, theirs.id) is not None
