"""What erasures used to leave behind (memory/governance.py, memory/governance_sweeps.py,
memory/retention.py):

- a person's DM thread where their own messages were already forgotten (tombstones keep no
  author): erasing the person takes it whole, the bot's answers, summary, episodic entries and
  tool logs with it, and finds the person there;
- a forgotten summary's old text in the log of a call that expanded it, and a forgotten tool
  log's copy in the log of a call that read it back;
- a retention sweep queued before the whole tenant's erasure and run after it writes nothing;
- another person's DM of tombstones: it survives, and keeps its record (compare-and-delete);
- a Discord person's DM tenant (`dm-<id>`): all of it is theirs, tombstones or not;
- an imported DM: the import records whose DM the place is, as appends do;
- a log elsewhere that read back a deleted thread's log goes with the thread.

A real Redis, the real harness and consolidator, and the scripted model (tests/agent_world.py).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from memory.governance_tenants import TenantErasures
from memory.keys import dm_people_key, messages_key, retention_swept_key
from memory.retention import Retention
from memory.scope import Scope, Visibility
from memory.stores.base import decode
from memory.stores.tool_log import ToolLogEntry, UnknownToolLog
from tests import test_walled_summaries_and_logs
from tests.support.memory_seed import say
from tests.support.scripted_openai import text
from tests.test_tool_logs_forgotten import logs_holding_the_secret, turn

SECRET = "hunter2zebra"
DAY = 1_700_000_000.0

world = test_walled_summaries_and_logs.world  # its fixture: a bot process (scripted model)


def dm(tenant: str, ts: str = "1.1") -> Scope:
    return Scope(tenant, f"slack:{tenant}:D7:{ts}", "D7", Visibility.DM, "U7", "Dee")


def summaries_quote_the_secret(world) -> None:
    plain = world.route

    def quoting(body: dict):  # a faithful summary repeats what was said
        if body.get("messages") and body["messages"][0]["content"].startswith("You consolidate"):
            return text(json.dumps({"description": "pin", "summary": f"Dee: {SECRET}."}))
        return plain(body)

    world.model.router = quoting


async def episodes_of(memory, tenant: str, thread: str) -> list[str]:
    found = []
    async for key in memory.redis.scan_iter(match=memory.episodes.key(tenant, "*")):
        if decode(await memory.redis.hget(key, "thread")) == thread:
            found.append(decode(key))
    return found


async def forget_their_messages(memory, scope: Scope) -> None:
    """Forget each of the person's messages of the thread, one by one: tombstones remain."""
    for message in await memory.conversation.all(scope):
        if message.role == "user":
            await memory.governance.forget_message(scope.tenant, scope.thread, message.id)


async def test_a_dm_of_tombstones_goes_whole_with_its_person(world, tenant):
    memory, here = world.runtime.memory, dm(tenant)
    await say(memory, here, "user", f"my bank pin is {SECRET}", DAY)
    await say(memory, here, "assistant", f"Noted, {SECRET} is safe with me.", DAY + 1)
    summaries_quote_the_secret(world)
    (summary,) = await world.runtime.harness.consolidator.roll(here, 10)
    world.model.router = world.route
    log_id = await turn(world, here, "expand_summary", {"summary_id": summary.id})
    await forget_their_messages(memory, here)
    left = await memory.conversation.all(here)
    assert left and all(m.role == "assistant" for m in left)  # the bot's answers remain
    assert await episodes_of(memory, tenant, here.thread)

    erasure = await memory.governance.forget_person(tenant, "U7")  # no NotFound
    await memory.governance.settle()
    assert erasure.threads == 1
    assert not await memory.redis.exists(messages_key(tenant, here.thread))
    assert here.thread not in {t for t, _ in await memory.conversation.threads(tenant)}
    assert await memory.summaries.get_many(tenant, [summary.id]) == {}
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, log_id)
    assert await logs_holding_the_secret(memory, tenant) == []
    assert await episodes_of(memory, tenant, here.thread) == []
    assert not await memory.redis.hgetall(dm_people_key(tenant))  # their id went too


async def test_a_person_found_only_in_their_dm_s_tombstones(memory, tenant):
    here = dm(tenant)
    said = await say(memory, here, "user", "what is the okapi's diet?", DAY)
    await say(memory, here, "assistant", "Okapis eat leaves.", DAY + 1)
    await memory.governance.forget_message(tenant, here.thread, said.id)
    erasure = await memory.governance.forget_person(tenant, "U7")
    assert erasure.threads == 1 and not await memory.conversation.threads(tenant)


async def test_a_dm_thread_stored_before_the_record_is_found_by_its_sibling(memory, tenant):
    """Threads stored before appends recorded whose DM a place is: one where the person's
    words remain tells whose DM it is; its sibling of tombstones goes too."""
    first, second = dm(tenant, "1.1"), dm(tenant, "2.2")
    await say(memory, first, "user", "hello there", DAY)
    said = await say(memory, second, "user", f"my pin is {SECRET}", DAY + 5)
    await say(memory, second, "assistant", f"Noted: {SECRET}.", DAY + 6)
    await memory.governance.forget_message(tenant, second.thread, said.id)
    await memory.redis.delete(dm_people_key(tenant))  # as stored before the record was kept
    erasure = await memory.governance.forget_person(tenant, "U7")
    assert erasure.threads == 2 and not await memory.conversation.threads(tenant)


async def test_forgetting_a_summary_deletes_the_log_that_expanded_it(world, tenant):
    memory = world.runtime.memory
    here = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(memory, here, "user", f"the vault code is {SECRET}", DAY)
    await say(memory, here, "assistant", "Please keep codes out of chat.", DAY + 1)
    summaries_quote_the_secret(world)
    (summary,) = await world.runtime.harness.consolidator.roll(here, 10)
    world.model.router = world.route
    expanded = await turn(world, here, "expand_summary", {"summary_id": summary.id})
    read = await turn(world, here, "read_tool_log", {"log_id": expanded})
    # the message goes from the summary's text but not from the thread: only the summary
    assert SECRET in (await memory.tool_logs.get(here, expanded)).output
    erasure = await memory.governance.forget_summary(tenant, summary.id)
    assert erasure.tool_logs == 2
    for log_id in (expanded, read):
        with pytest.raises(UnknownToolLog):
            await memory.tool_logs.get(here, log_id)


async def test_forgetting_a_tool_log_deletes_the_logs_that_read_it(world, tenant):
    memory = world.runtime.memory
    here = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(memory, here, "user", f"the vault code is {SECRET}", DAY)
    searched = await turn(world, here, "search_conversations", {"query": "vault code"})
    read = await turn(world, here, "read_tool_log", {"log_id": searched})
    erasure = await memory.governance.forget_tool_log(tenant, searched)
    assert erasure.tool_logs == 2
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, read)


async def test_a_sweep_queued_before_the_tenant_s_erasure_writes_nothing(memory, tenant):
    here = Scope(tenant, "old")
    await memory.conversation.append(here, "user", "an old line", timestamp=time.time() - 9e5)
    # a deployment's default period: it outlives the tenant's erasure (its own setting does not)
    retention = Retention(memory, default_days=1, sweep_seconds=7_000 + time.time() % 1_000)
    queued = []

    async def submit(kind: str, payload: dict) -> None:
        queued.append(payload)

    assert tenant in await retention.schedule(submit)
    await TenantErasures(memory).erase(tenant)
    await retention.sweep_tasks([p for p in queued if p["tenant"] == tenant])
    assert not await memory.redis.exists(retention_swept_key(tenant))
    await retention.sweep(tenant)  # run now (not queued before): it notes its sweep
    assert await memory.redis.exists(retention_swept_key(tenant))
    await memory.redis.delete(retention_swept_key(tenant))


def dm_of(tenant: str, channel: str, user: str, ts: str = "1.1") -> Scope:
    return Scope(tenant, f"slack:{tenant}:{channel}:{ts}", channel, Visibility.DM, user, user)


async def test_another_person_s_dm_of_tombstones_survives_and_is_not_mis_assigned(memory, tenant):
    mine, theirs = dm_of(tenant, "D7", "U7"), dm_of(tenant, "D8", "U8")
    await say(memory, mine, "user", "hello", DAY)
    said = await say(memory, theirs, "user", f"my pin is {SECRET}", DAY + 1)
    await say(memory, theirs, "assistant", "Noted.", DAY + 2)
    await memory.governance.forget_message(tenant, theirs.thread, said.id)
    await memory.redis.delete(dm_people_key(tenant))  # as stored before the record was kept
    erasure = await memory.governance.forget_person(tenant, "U7")
    assert erasure.threads == 1
    assert [t for t, _ in await memory.conversation.threads(tenant)] == [theirs.thread]
    # the back-fill could not tell whose DM of tombstones it is: it records nobody
    assert await memory.redis.hget(dm_people_key(tenant), "dm:D8") is None


async def test_erasing_someone_who_spoke_in_another_s_dm_keeps_that_dm_s_record(memory, tenant):
    """The record names U8 (their later append): erasing U7, who spoke there before, leaves it,
    so U8's erasure still finds their DM thread of tombstones."""
    before, later = dm_of(tenant, "D8", "U7", "1.1"), dm_of(tenant, "D8", "U8", "2.2")
    await say(memory, before, "user", "a word in someone else's DM", DAY)
    said = await say(memory, later, "user", f"my pin is {SECRET}", DAY + 1)
    await say(memory, later, "assistant", "Noted.", DAY + 2)
    await memory.governance.forget_message(tenant, later.thread, said.id)
    await memory.governance.forget_person(tenant, "U7")
    assert decode(await memory.redis.hget(dm_people_key(tenant), "dm:D8")) == "U8"
    erasure = await memory.governance.forget_person(tenant, "U8")
    assert erasure.threads == 1 and not await memory.conversation.threads(tenant)


async def test_a_discord_person_s_dm_tenant_goes_whole_with_them(memory):
    user = str(10**17 + uuid.uuid4().int % 10**17)  # a snowflake: 18 digits
    tenant, channel = f"dm-{user}", str(10**17 + uuid.uuid4().int % 10**17)
    here = Scope(tenant, f"discord:dm:{channel}", channel, Visibility.DM, user, "Dee")
    said = await say(memory, here, "user", f"my pin is {SECRET}", DAY)
    await say(memory, here, "assistant", "Noted.", DAY + 1)
    await memory.governance.forget_message(tenant, here.thread, said.id)
    await memory.redis.delete(dm_people_key(tenant))  # as stored before the record was kept
    erasure = await memory.governance.forget_person(tenant, user)
    assert erasure.threads == 1 and not await memory.conversation.threads(tenant)


async def test_an_imported_dm_knows_its_person(memory, tenant):
    """After the import, the person's words in the DM are forgotten: only the record the
    import wrote ties the DM's threads of tombstones and answers to them."""
    first, second = dm(tenant, "1.1"), dm(tenant, "2.2")
    await say(memory, first, "user", "hello there", DAY)
    said = await say(memory, second, "user", f"my pin is {SECRET}", DAY + 5)
    await say(memory, second, "assistant", "Noted.", DAY + 6)
    await memory.governance.forget_message(tenant, second.thread, said.id)
    records = [r async for r in memory.portability.export_tenant(tenant)]
    other = f"{tenant}-copy"
    await memory.portability.import_records(other, records)
    assert decode(await memory.redis.hget(dm_people_key(other), "dm:D7")) == "U7"
    for message in await memory.conversation.all(Scope(other, first.thread)):
        await memory.governance.forget_message(other, first.thread, message.id)
    erasure = await memory.governance.forget_person(other, "U7")
    assert erasure.threads == 2 and not await memory.conversation.threads(other)


async def test_a_thread_s_erasure_takes_the_logs_that_read_its_logs_back(world, tenant):
    memory = world.runtime.memory
    there = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    here = Scope(tenant, f"slack:{tenant}:C1:2.2", "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(memory, there, "user", "fetch the vault page", DAY)
    fetched = ToolLogEntry(there.thread, "fetch_url", {"url": "x"}, f"vault code {SECRET}",
                           "success", audience="public")  # fmt: skip
    log_id = await memory.tool_logs.write(there, fetched)  # no message shown: not indexed
    read = await turn(world, here, "read_tool_log", {"log_id": log_id})
    assert SECRET in (await memory.tool_logs.get(here, read)).output
    erasure = await memory.governance.forget_thread(tenant, there.thread)
    assert erasure.tool_logs == 2
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, read)


async def test_a_tool_log_gone_before_its_copies_still_takes_them(world, tenant):
    """An erasure stopped after the log went (before the logs that read it back): forgetting
    it again takes the copies rather than saying it is not there."""
    memory = world.runtime.memory
    here = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(memory, here, "user", f"the vault code is {SECRET}", DAY)
    searched = await turn(world, here, "search_conversations", {"query": "vault code"})
    read = await turn(world, here, "read_tool_log", {"log_id": searched})
    await memory.tool_logs.remove(tenant, {here.thread: [searched]})  # where it stopped
    erasure = await memory.governance.forget_tool_log(tenant, searched)
    assert erasure.tool_logs == 1
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, read)


async def test_retention_takes_the_later_logs_that_read_an_expired_log_back(world, tenant):
    memory = world.runtime.memory
    there = Scope(tenant, f"slack:{tenant}:C1:1.1", "C1", Visibility.PUBLIC, "U1", "Ada")
    here = Scope(tenant, f"slack:{tenant}:C1:2.2", "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(memory, there, "user", "fetch the vault page", DAY)
    await say(memory, there, "user", "and today's too", time.time())  # the thread stays
    fetched = ToolLogEntry(there.thread, "fetch_url", {"url": "x"}, f"vault code {SECRET}",
                           "success", created_at=DAY, audience="public")  # fmt: skip
    log_id = await memory.tool_logs.write(there, fetched)
    read = await turn(world, here, "read_tool_log", {"log_id": log_id})
    erasure = await memory.governance.sweep_retention(tenant, DAY + 100)
    assert erasure is not None and erasure.tool_logs == 2
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, read)
