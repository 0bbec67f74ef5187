"""Records an erasure keeps or writes, and ids it takes (memory/governance_sweeps.py,
memory/governance.py, memory/governance_places.py, memory/portability_write.py,
memory/dm_people.py):

- a person's DM place they write in again while their erasure runs keeps its record (whose DM
  it is), so erasing them again finds that thread of tombstones;
- `forget_tool_log` takes only a tool log's id: a message's or summary's is not found, and the
  logs that showed it stay;
- a Slack channel's deletion in a tenant erased in the last day writes no note there;
- one rule for whose DM a place is, for an import and for a person's erasure: a message's place
  is its audience or its thread's (from before audiences were kept), and a place is someone's
  when exactly one person wrote there across its threads.

A real Redis; the erasure is held on its way there by a gate (the `gated` fixture,
tests/support/gated_memory.py).
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from memory.governance_erasure import NotFound
from memory.governance_places import DeletedPlace
from memory.governance_sweeps import _FORGET_DM_PLACES
from memory.governance_tenants import TenantErasures
from memory.keys import deleted_thread_key, dm_people_key
from memory.scope import Scope, Visibility
from memory.stores.base import decode
from memory.stores.tool_log import ToolLogEntry
from tests.support.memory_seed import say

DAY = 1_700_000_000.0


def dm(tenant: str, ts: str, user: str = "U7") -> Scope:
    return Scope(tenant, f"slack:{tenant}:D7:{ts}", "D7", Visibility.DM, user, user)


async def threads(memory, tenant: str) -> list[str]:
    return [t for t, _ in await memory.conversation.threads(tenant)]


@pytest.mark.parametrize("again", ["3.3", "1.1"])  # a new thread, or the same id come back
async def test_a_dm_written_in_during_the_erasure_keeps_its_record(memory, gated, tenant, again):
    through_gate, gate = gated
    await say(memory, dm(tenant, "1.1"), "user", "hello there", DAY)
    gate.hold(hashlib.sha1(_FORGET_DM_PLACES.encode()).hexdigest().encode())
    running = asyncio.create_task(through_gate.governance.forget_person(tenant, "U7"))
    later = dm(tenant, again)
    try:
        await asyncio.wait_for(gate.held.wait(), 30)  # the record's deletion, on its way
        said = await say(memory, later, "user", "one more thing", DAY + 9)
        gate.release.set()
        await running
    finally:
        gate.release.set()
        await asyncio.gather(running, return_exceptions=True)
    assert await threads(memory, tenant) == [later.thread]
    assert decode(await memory.redis.hget(dm_people_key(tenant), "dm:D7")) == "U7"
    await memory.governance.forget_message(tenant, later.thread, said.id)
    erasure = await memory.governance.forget_person(tenant, "U7")  # found by the record alone
    assert erasure.threads == 1 and not await threads(memory, tenant)


async def test_forgetting_a_tool_log_takes_only_a_tool_log_s_id(memory, tenant):
    here = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    said = await say(memory, here, "user", "the okapi eats leaves", DAY)
    shown = ToolLogEntry(here.thread, "search_conversations", {"query": "okapi"},
                         "Ada: the okapi eats leaves", "success", audience="public",
                         message_ids=[said.id])  # fmt: skip
    log_id = await memory.tool_logs.write(here, shown)
    with pytest.raises(NotFound):
        await memory.governance.forget_tool_log(tenant, said.id)
    assert (await memory.tool_logs.get(here, log_id)).output  # still there


async def test_a_slack_channel_s_deletion_writes_nothing_into_an_erased_tenant(memory, tenant):
    await say(memory, Scope(tenant, f"slack:{tenant}:C1:1.1"), "user", "hi", DAY)
    await TenantErasures(memory).erase(tenant)
    await memory.governance.forget_place(DeletedPlace(tenant, "slack", "C1"))
    assert not await memory.redis.exists(deleted_thread_key(tenant, f"slack:{tenant}:C1:"))


async def test_an_imported_dm_from_before_audiences_knows_its_person(memory, tenant):
    first, second = dm(tenant, "1.1"), dm(tenant, "2.2")
    await say(memory, first, "user", "hello there", DAY)
    await say(memory, second, "user", "and again", DAY + 5)
    records = [r async for r in memory.portability.export_tenant(tenant)]
    for record in records:
        if record["kind"] == "message":
            record["message"]["audience"] = ""  # as stored before messages kept it
    other = f"{tenant}-copy"
    await memory.portability.import_records(other, records)
    assert decode(await memory.redis.hget(dm_people_key(other), "dm:D7")) == "U7"
    await memory.drop_tenant(other)


async def test_a_dm_place_two_people_wrote_in_is_nobody_s(memory, tenant):
    """Stored before the record was kept, one thread each: the back-fill tells no one's DM
    (as an import would not), so erasing one leaves the other's thread."""
    mine, theirs = dm(tenant, "1.1"), dm(tenant, "2.2", user="U9")
    await say(memory, mine, "user", "hello there", DAY)
    await say(memory, theirs, "user", "my own words", DAY + 5)
    await memory.redis.delete(dm_people_key(tenant))  # as stored before the record was kept
    await memory.governance.forget_person(tenant, "U7")
    assert await threads(memory, tenant) == [theirs.thread]
    assert await memory.redis.hget(dm_people_key(tenant), "dm:D7") is None
