"""Export and import after an audit (memory/portability*.py, memory/manager.py), on the real
Redis and MiniLM:

- a DM thread whose person's own messages are tombstones keeps its person through an export
  and an import (the thread line's `dm_person`): erasing them takes the thread, answers too;
- an erasure and an import's writes never run together: an erasure running refuses the import,
  and one due while an import writes waits for it (the tenant's erasure lock);
- a file's `dm_person` does not override the person its messages show;
- a tenant left with only what an erasure's purge is still deleting is refused as that erasure
  finishing, not as "not empty" (learned records left are a memory: "not empty");
- an import that does not start gives back all it took, the erasure lock too (a SET applied
  whose answer the import never read), and never leaves the running key;
- a file nested thousands deep is a bad line, and so is a turn whose asker is not text;
- a thread's, paper's or watch's time ahead of the importing host's clock is not taken for use
  of the tenant since the import began;
- a tenant's drop that fails midway leaves the import's marker: the next import clears the rest.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from memory.governance import LOCK_TTL_MS as ERASURE_LOCK_TTL_MS
from memory.governance_tenants import TenantErasures
from memory.keys import (
    dm_people_key,
    erasing_key,
    forgetting_key,
    import_lock_key,
    import_partial_key,
    import_running_key,
    papers_key,
    threads_key,
)
from memory.portability import (
    BadExportLine,
    ErasureFinishing,
    ErasureRunning,
    Portability,
    TenantNotEmpty,
)
from memory.scope import Scope, Visibility
from memory.stores.base import decode
from memory.stores.entity import Entity
from memory.stores.episodic_episode import Episode
from memory.stores.watches import DAY as A_DAY
from memory.stores.watches import WatchStore
from tests.support.memory_seed import say
from tests.test_memory_stores import add_memgpt
from tests.test_portability import export, populate
from tests.test_portability_s25 import lines_of, message_write

DAY = 1_700_000_000.0


@pytest.fixture
def other() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- 1. a DM of tombstones keeps its person ------------------------------------------------------


async def test_a_dm_of_tombstones_and_answers_goes_with_its_person(memory, tenant, other):
    """Their one message in the DM was forgotten before the export: no author is left to tell
    the place's person by, only the record the export carries."""
    here = Scope(tenant, f"slack:{tenant}:D7:1.1", "D7", Visibility.DM, "U7", "Dee")
    said = await say(memory, here, "user", "my pin is 4242", DAY)
    await say(memory, here, "assistant", "Noted.", DAY + 1)
    await memory.governance.forget_message(tenant, here.thread, said.id)
    records = await export(memory, tenant)
    line = next(r for r in records if r["kind"] == "thread")
    assert line["dm_person"] == "U7"

    await memory.portability.import_lines(other, lambda: iter(lines_of(records)))
    erasure = await memory.governance.forget_person(other, "U7")
    assert erasure.threads == 1 and not await memory.conversation.threads(other)
    await memory.drop_tenant(other)


async def test_a_file_without_the_record_still_tells_the_person_by_their_words(memory, tenant,
                                                                               other):  # fmt: skip
    """A file from before exports kept `dm_person`: the place's one writer tells its person
    (their words in another thread of the same DM), and the import records it."""
    first = Scope(tenant, f"slack:{tenant}:D7:1.1", "D7", Visibility.DM, "U7", "Dee")
    second = Scope(tenant, f"slack:{tenant}:D7:2.2", "D7", Visibility.DM, "U7", "Dee")
    await say(memory, first, "user", "hello there", DAY)
    said = await say(memory, second, "user", "my pin is 4242", DAY + 5)
    await say(memory, second, "assistant", "Noted.", DAY + 6)
    await memory.governance.forget_message(tenant, second.thread, said.id)
    records = await export(memory, tenant)
    for record in records:
        record.pop("dm_person", None)
    await memory.portability.import_lines(other, lambda: iter(lines_of(records)))
    assert decode(await memory.redis.hget(dm_people_key(other), "dm:D7")) == "U7"
    await memory.drop_tenant(other)


async def test_a_file_s_person_does_not_override_what_its_messages_show(memory, tenant, other):
    """The DM's one writer is U7; the file's record says U8 (edited, or another export's): the
    messages tell the place, the record only where they cannot."""
    here = Scope(tenant, f"slack:{tenant}:D7:1.1", "D7", Visibility.DM, "U7", "Dee")
    await say(memory, here, "user", "hello there", DAY)
    records = await export(memory, tenant)
    line = next(r for r in records if r["kind"] == "thread")
    line["dm_person"] = "U8"
    await memory.portability.import_lines(other, lambda: iter(lines_of(records)))
    assert decode(await memory.redis.hget(dm_people_key(other), "dm:D7")) == "U7"
    await memory.drop_tenant(other)


@pytest.mark.parametrize("person", [5, "", "U7\n"])
async def test_a_dm_person_that_is_not_an_id_is_a_bad_line(memory, tenant, other, person):
    here = Scope(tenant, f"slack:{tenant}:D7:1.1", "D7", Visibility.DM, "U7", "Dee")
    await say(memory, here, "user", "hello there", DAY)
    records = await export(memory, tenant)
    records[1]["dm_person"] = person
    with pytest.raises(BadExportLine, match="dm_person") as refused:
        await memory.portability.import_lines(other, lambda: iter(lines_of(records)))
    assert refused.value.line_no == 2


# -- 3. an erasure and an import, one at a time --------------------------------------------------


async def test_an_import_is_refused_while_an_erasure_runs(memory, tenant, other):
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    await memory.redis.set(forgetting_key(other), "an-erasure", px=60_000)
    try:
        with pytest.raises(ErasureRunning, match=r"erasure .* is running"):
            await memory.portability.import_records(other, records)
        assert await memory.portability.is_empty(other)
        assert not await memory.redis.exists(import_lock_key(other))
        assert not await memory.redis.exists(import_partial_key(other))
        assert not await memory.redis.exists(import_running_key(other))
        assert await memory.redis.get(forgetting_key(other)) == b"an-erasure"  # not released
    finally:
        await memory.redis.delete(forgetting_key(other))
    await memory.portability.import_records(other, records)  # the erasure ended
    assert not await memory.redis.exists(forgetting_key(other))  # given back
    await memory.drop_tenant(other)


async def test_a_tenant_erasure_due_while_an_import_writes_waits_for_it(memory, gated, tenant,
                                                                       other):  # fmt: skip
    """The erasure comes due while the import is held before its messages' writes: it is
    left for the next tick (its lock is the import's), which then erases all it wrote."""
    through_gate, gate = gated
    await populate(memory, tenant)
    records = await export(memory, tenant)
    erasures = TenantErasures(memory, keep_days=0)
    gate.hold(message_write(other))
    task = asyncio.create_task(Portability(through_gate).import_records(other, records))
    try:
        await gate.held.wait()
        # the erasure lock is held as an erasure holds it (its TTL, not the import lock's)
        assert 0 < await memory.redis.pttl(forgetting_key(other)) <= ERASURE_LOCK_TTL_MS
        assert await erasures.schedule(other, now=0.0) == 0.0
        assert await erasures.erase_due(now=0.0) == []  # busy: the import holds the tenant
        gate.release.set()
        counts = await task
        assert counts["messages"] > 0
        assert await erasures.erase_due(now=0.0) == [other]  # the next tick
        assert await memory.portability.is_empty(other)
        assert not await memory.redis.exists(threads_key(other))
    finally:
        gate.release.set()
        await asyncio.gather(task, return_exceptions=True)
        await erasures.cancel([other])  # the uninstalled list shared by every test: left clean
        await memory.drop_tenant(other)


async def test_what_an_erasure_still_purges_is_not_a_memory_in_the_way(memory, tenant, other):
    """The admin forgot the tenant's last thread a moment ago: its episodic documents are still
    being deleted (`erasing_key`), nothing else is left. The import says that erasure is
    finishing (try again shortly), not that the tenant holds memory."""
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    said = Episode(id="m-gone", thread="t-gone", author="U1", text="a forgotten question", ts=DAY)
    await memory.episodes.add(Scope(other), [said])
    await memory.redis.hset(erasing_key(other), "m-gone", 1)
    try:
        with pytest.raises(ErasureFinishing, match="still finishing; try again shortly"):
            await memory.portability.import_records(other, records)
        assert not await memory.redis.exists(import_running_key(other))
        await memory.conversation.append(Scope(other, "t1"), "user", "A thread of its own.")
        with pytest.raises(TenantNotEmpty):  # a memory of its own besides: not empty, as ever
            await memory.portability.import_records(other, records)
        assert not await memory.redis.exists(import_running_key(other))
    finally:
        await memory.redis.delete(erasing_key(other))
        await memory.drop_tenant(other)


async def test_learned_records_left_beside_a_purge_are_a_memory(memory, tenant, other):
    """The purge still deletes forgotten messages' episodic documents, but an entity the
    tenant learned is there too: no erasure is finishing it, so the tenant is not empty."""
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    said = Episode(id="m-gone", thread="t-gone", author="U1", text="a forgotten question", ts=DAY)
    await memory.episodes.add(Scope(other), [said])
    learned = Entity("MemGPT", "system", "An LLM that pages its own memory.")
    await memory.entities.upsert(Scope(other, "t-kept", user="U1"), [learned])
    await memory.redis.hset(erasing_key(other), "m-gone", 1)
    try:
        with pytest.raises(TenantNotEmpty, match="already holds memory"):
            await memory.portability.import_records(other, records)
        assert not await memory.redis.exists(import_running_key(other))
    finally:
        await memory.redis.delete(erasing_key(other))
        await memory.drop_tenant(other)


def erasure_lock_set(tenant: str) -> bytes:
    """The import taking the tenant's erasure lock (SET NX), as it goes to Redis."""
    key = forgetting_key(tenant)
    return f"SET\r\n${len(key)}\r\n{key}".encode()


async def test_an_import_stopped_while_it_takes_the_erasure_lock_gives_it_back(
    memory, gated, tenant, other
):
    """Cancelled while it waits for the answer to its erasure lock's SET, which Redis then
    applied: it gives that lock back too (with its running key and its lock), so no erasure
    waits a minute behind an import that never ran."""
    through_gate, gate = gated
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    gate.hold(erasure_lock_set(other))
    task = asyncio.create_task(Portability(through_gate).import_records(other, records))
    try:
        await gate.held.wait()
        gate.release.set()  # the SET goes on to Redis, and is applied...
        task.cancel()  # ...while the import, cancelled, never reads its answer
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        gate.release.set()
        await asyncio.gather(task, return_exceptions=True)
    assert not await memory.redis.exists(forgetting_key(other))
    assert not await memory.redis.exists(import_running_key(other))
    assert not await memory.redis.exists(import_lock_key(other))
    assert await memory.portability.is_empty(other)


# -- 5. not an export ----------------------------------------------------------------------------


async def test_a_line_nested_too_deeply_is_a_bad_line(memory, tenant, other):
    await add_memgpt(memory, tenant)
    lines = lines_of(await export(memory, tenant))
    deep = '{"kind": "paper", "paper": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    with pytest.raises(BadExportLine, match="nested too deeply") as refused:
        await memory.portability.import_lines(other, lambda: iter([lines[0], deep, *lines[1:]]))
    assert refused.value.line_no == 2
    assert await memory.portability.is_empty(other)


@pytest.mark.parametrize("name, value", [("asker", None), ("audience", 7), ("question_id", [])])
async def test_a_turn_s_text_field_that_is_not_text_is_a_bad_line(memory, tenant, other, name,
                                                                 value):  # fmt: skip
    await populate(memory, tenant)
    records = await export(memory, tenant)
    at = next(i for i, r in enumerate(records) if r["kind"] == "turn")
    records[at]["turn"][name] = value
    with pytest.raises(BadExportLine, match=f"turn's '{name}' must be a string") as refused:
        await memory.portability.import_lines(other, lambda: iter(lines_of(records)))
    assert refused.value.line_no == at + 1
    assert await memory.portability.is_empty(other)


# -- 7. a clock ahead ----------------------------------------------------------------------------


@pytest.mark.parametrize("ahead", ["thread", "paper", "watch"])
async def test_times_ahead_of_the_import_are_not_use_since(memory, tenant, other, ahead):
    """A file from a host whose clock ran an hour ahead, its import crashed (its marker left):
    the next import clears what it wrote and imports again, not refusing a tenant 'used'."""
    await populate(memory, tenant)
    if ahead == "watch":
        await WatchStore(memory.redis).create(
            Scope(tenant, channel="C9", user="U9"), "walruses", A_DAY, platform="slack",
            channel="C9",
        )  # fmt: skip
    records = await export(memory, tenant)
    later = time.time() + 3600
    for record in records:
        # (a watch's case: its threads' times too, clamped to the import's start, show it)
        if ahead in ("thread", "watch") and record["kind"] == "thread":
            record["last_active"] = later
        if ahead == "paper" and record["kind"] == "paper":
            record["paper"]["ingested_at"] = later
        if ahead == "watch" and record["kind"] == "watch":
            record["watch"]["created_at"] = later
    await memory.portability.import_records(other, records)
    started = time.time()  # (at most) when a crashed import of it would have started
    if ahead == "watch":  # exactly when it started: its threads' times were clamped to it
        started = max(s for _, s in await memory.redis.zrange(threads_key(other), 0, -1,
                                                              withscores=True))  # fmt: skip
        watches = await WatchStore(memory.redis).all(other)
        assert watches and all(w.created_at <= started for w in watches)
    assert max(s for _, s in await memory.redis.zrange(threads_key(other), 0, -1,
                                                       withscores=True)) <= time.time()  # fmt: skip
    for raw in await memory.redis.hvals(papers_key(other)):
        assert float(json.loads(raw)["ingested_at"]) <= time.time()

    await memory.redis.set(import_partial_key(other), repr(started))  # as if it crashed
    assert not await memory.portability.used_since(other, started)
    await memory.portability.import_records(other, records)  # cleared, then imported again
    assert not await memory.redis.exists(import_partial_key(other))
    await memory.drop_tenant(other)


# -- 8. a drop that fails midway -----------------------------------------------------------------


async def test_a_failed_drop_leaves_the_marker_for_the_next_import(memory, gated, tenant,
                                                                   other):  # fmt: skip
    """What a crashed import left is being cleared (its marker there) when Redis goes away at
    the vector stores' documents: the marker stays, so the next import clears the rest."""
    through_gate, gate = gated
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    await memory.portability.import_records(other, records)
    await memory.redis.set(import_partial_key(other), repr(time.time()))  # as if it crashed
    gate.hold(b"FT.DROPINDEX")
    task = asyncio.create_task(through_gate.drop_tenant(other))
    await gate.held.wait()
    gate.cut()
    with pytest.raises(Exception):  # noqa: B017  (Redis out of reach, as the client says it)
        await task
    gate.mend()
    assert not await memory.portability.is_empty(other)  # the documents are left
    assert await memory.redis.exists(import_partial_key(other))

    counts = await memory.portability.import_records(other, records)  # clears, then imports
    assert counts["chunks"] == sum(r["kind"] == "chunk" for r in records)
    assert not await memory.redis.exists(import_partial_key(other))
    await memory.drop_tenant(other)
