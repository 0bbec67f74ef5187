"""Every message stays in the recent window or under a summary, and forgotten text leaves every
summary, whatever fails or is sent twice while a summary is written or replaced.

redis-py resends a command whose reply was lost (a timeout, a connection reset): a resend is
simulated by sending the same script with the same arguments again. An edit landing meanwhile
lands for real: the model's summary request is held (tests/support/scripted_openai.py), or the
marking itself on its way to Redis (tests/support/redis_gate.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bot.consolidation import SUMMARY_INSTRUCTIONS, Consolidator
from memory.keys import record_key
from memory.scope import Scope
from memory.stores.conversation import _MARK_SCRIPT, MarkConflict
from memory.stores.summary import Summary, compact_note
from tests.agent_world import close_world, open_world
from tests.support.redis_gate import RedisGate
from tests.support.scripted_openai import text
from tests.test_governance import all_summary_text, check_invariant


async def say(memory, scope: Scope, count: int, start: int = 0) -> list:
    return [
        await memory.conversation.append(
            scope, "user" if i % 2 == 0 else "assistant", f"secret number {i} is {1000 + i}"
        )
        for i in range(start, start + count)
    ]


async def every_summary_text(memory, tenant: str) -> str:
    """What every summary hash of the tenant says, listed anywhere or not."""
    pattern = record_key(tenant, "summary", "*")
    keys = [k async for k in memory.redis.scan_iter(match=pattern, count=1000)]
    rows = [await memory.redis.hgetall(k) for k in keys]
    return "\n".join(str(row) for row in rows)


async def test_a_resent_marking_succeeds_and_keeps_its_summary(memory, tenant):
    scope = Scope(tenant, "resend")
    said = await say(memory, scope, 4)
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    summary = Summary(scope.thread, *compact_note(said), [m.id for m in said])
    record = memory.summaries.indexed(scope, summary)
    conversation = memory.conversation
    await conversation.mark_summarized(scope, first, raw, summary.id, record)  # reply lost
    await conversation.mark_summarized(scope, first, raw, summary.id, record)  # the resend

    assert [s.id for s in await memory.summaries.for_thread(scope)] == [summary.id]
    assert await conversation.unsummarized(scope) == []
    await check_invariant(memory, scope)
    # a message that really changed is still a conflict, and marks nothing
    more = await say(memory, scope, 2, start=4)
    first, raw = await conversation.unsummarized_snapshot(scope)
    await memory.governance.forget_message(tenant, scope.thread, more[0].id)
    with pytest.raises(MarkConflict):
        await conversation.mark_summarized(scope, first, raw, "sum_stale")
    assert [m.id for m in await conversation.unsummarized(scope)] == [more[1].id]


async def test_a_refused_marking_leaves_no_summary_and_erasure_reaches_every_one(
    redis_url, tmp_path, tenant
):
    """A message forgotten while the model writes the summary: the marking is refused, and
    no summary is left listed or stored (it would quote the forgotten text); the messages
    stay in the window, and a later summary forgets like any other."""
    world = await open_world(redis_url, tmp_path)
    memory, scope = world.runtime.memory, Scope(tenant, "refused")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_summaries(body: dict):
        if body["messages"][0]["content"] != SUMMARY_INSTRUCTIONS:
            return world.route(body)
        asked.set()
        await answer.wait()  # the note quotes what the model was sent: the secret too
        transcript = body["messages"][-1]["content"]
        return text(json.dumps({"description": "numbers", "summary": transcript}))

    world.model.router = held_summaries
    try:
        said = await say(memory, scope, 6)
        consolidator = Consolidator(memory, world.runtime.llm)
        writing = asyncio.create_task(consolidator.summarize_and_store(scope))
        await asked.wait()
        await memory.governance.forget_message(tenant, scope.thread, said[2].id)
        answer.set()
        with pytest.raises(MarkConflict):
            await writing
        assert await memory.summaries.for_thread(scope) == []  # nothing in the Summary segment
        assert await every_summary_text(memory, tenant) == ""  # nor stored unlisted
        window = await memory.conversation.unsummarized(scope)
        assert [m.id for m in window] == [m.id for m in said if m.id != said[2].id]
        await check_invariant(memory, scope)

        await consolidator.summarize_and_store(scope)  # summarized again later
        assert len(await memory.summaries.for_thread(scope)) == 1
        assert said[3].content in await all_summary_text(memory, scope)
        await memory.governance.forget_message(tenant, scope.thread, said[3].id)
        for secret in (said[2].content, said[3].content):
            assert secret not in await every_summary_text(memory, tenant)
        assert said[4].content in await all_summary_text(memory, scope)
        await check_invariant(memory, scope)
    finally:
        await close_world(world)


async def test_a_marking_cut_off_from_redis_leaves_no_summary(redis_url, tmp_path, tenant):
    """Redis becomes unreachable as the marking is sent (nothing can be undone then): no
    summary is left listed over messages it does not mark, and every message stays in the
    window."""
    gate = RedisGate(redis_url)
    world = await open_world(await gate.start(), tmp_path)
    memory, scope = world.runtime.memory, Scope(tenant, "cut")
    try:
        said = await say(memory, scope, 6)
        gate.hold(hashlib.sha1(_MARK_SCRIPT.encode()).hexdigest().encode())  # the marking
        compacting = asyncio.create_task(Consolidator(memory, None).compact(scope))
        await gate.held.wait()
        gate.cut()
        with pytest.raises(RedisConnectionError):
            await compacting
        gate.mend()
        assert await memory.summaries.for_thread(scope) == []  # nothing in the Summary segment
        assert await every_summary_text(memory, tenant) == ""  # nor stored unlisted
        window = await memory.conversation.unsummarized(scope)
        assert [m.id for m in window] == [m.id for m in said]
        await check_invariant(memory, scope)
    finally:
        await close_world(world)
        await gate.close()


async def test_a_resent_replacement_of_a_forgotten_summary_succeeds(memory, tenant):
    scope = Scope(tenant, "replace")
    consolidator = Consolidator(memory, None)
    for i in range(3):
        await say(memory, scope, 2, start=2 * i)
        await consolidator.compact(scope)
    tops = await memory.summaries.for_thread(scope)
    merged = Summary(scope.thread, "merged", "", [m for t in tops[:2] for m in t.message_ids])
    await memory.summaries.merge(scope, merged, tops[:2])
    summaries = memory.summaries
    for old in [*(await summaries.get_many(tenant, [tops[0].id])).values(), tops[2]]:
        new = Summary(old.thread_id, "rewritten", "", old.message_ids, parent=old.parent)
        await summaries.store(tenant, new)
        await summaries.replace(tenant, old, new)  # reply lost
        await summaries.replace(tenant, old, new)  # the resend: done, not a conflict
        assert not await summaries.get_many(tenant, [old.id])
        if old.parent:
            parent = (await summaries.get_many(tenant, [old.parent]))[old.parent]
            assert new.id in parent.children and old.id not in parent.children
        else:
            assert new.id in await summaries.ids(scope) and old.id not in await summaries.ids(scope)


async def test_a_conflicting_edit_during_the_forced_compaction_does_not_fail_the_turn(
    redis_url, tmp_path, tenant
):
    """A message forgotten between the compaction's snapshot and its marking (the compaction
    asks no model: its marking is held on its way to Redis): the turn is answered uncompacted
    (trimmed), and the thread keeps every message."""
    gate = RedisGate(redis_url)
    world = await open_world(await gate.start(), tmp_path, window=3000)
    scope = Scope(tenant, "t")
    memory = world.runtime.memory
    try:
        said = [
            await memory.conversation.append(scope, "user", f"question {i} " + "word " * 300)
            for i in range(6)
        ]
        world.model.script(text("fine"))
        gate.hold(hashlib.sha1(_MARK_SCRIPT.encode()).hexdigest().encode())  # the marking
        turn = asyncio.create_task(world.agent.run_turn(scope, "And now?"))
        await gate.held.wait()
        await memory.governance.forget_message(tenant, scope.thread, said[1].id)
        gate.release.set()
        result = await turn
        assert result.stop_reason == "final" and result.answer == "fine"
        assert await memory.summaries.for_thread(scope) == []
        assert await every_summary_text(memory, tenant) == ""
        await check_invariant(memory, scope)
    finally:
        await close_world(world)
        await gate.close()
