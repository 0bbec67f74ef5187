"""A forget that lands while a turn is being answered: the turn stores its answer and saves its
record after the erasure ran, so it looks again once the record is saved (bot/harness.py
`after`). A question made a tombstone leaves no record quoting it (nor in its asker's index);
a thread erased whole does not come back holding the answer. On Slack and Discord the erasure
also notes the message's id with its source (memory/governance_purge.py `close_sources`): the
deletion the turn queues when it ends finds the record by it. A turn of a person still queued
when they are erased is not run."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import memory.governance as governance_module
from memory.keys import forgetting_key, threads_key, turns_by_key
from memory.scope import Scope, Visibility
from memory.stores.turn_records import ASKER, TurnRecord, UnknownTurn
from tests import test_platform_deletions, test_turn_recovery
from tests.support.slack_api import mention, message
from tests.test_platform_deletions import WAIT, found, held_model, texts
from tests.test_slack import thread as slack_thread
from tests.test_slack import ts
from tests.test_turn_recovery_forgotten import episodic_keys

world = test_turn_recovery.world  # its fixture: an agent world on the test Redis
slack = test_platform_deletions.slack  # and two Slack bot processes on it

ANSWER = "an answer about the plan"


async def forget(memory, how: str, scope: Scope) -> None:
    """Forget the thread's question the way `how` says (the memory page's buttons)."""
    governance = memory.governance
    if how == "message":
        (question,) = await memory.conversation.all(scope)
        await governance.forget_message(scope.tenant, scope.thread, question.id)
    elif how == "thread":
        await governance.forget_thread(scope.tenant, scope.thread)
    else:  # a person: their message a tombstone, or (in their DM) the thread whole
        await governance.forget_person(scope.tenant, scope.user)


@pytest.mark.parametrize("how", ["message", "thread", "person", "person in a DM"])
async def test_a_question_forgotten_while_it_is_answered_leaves_no_record(world, tenant, how):
    """The terminal's turn: no platform id, so nothing but the turn itself can catch it up."""
    memory = world.runtime.memory
    dm = how == "person in a DM"
    scope = Scope(tenant, "t1", "D1" if dm else "C1", Visibility.DM if dm else Visibility.PUBLIC,
                  user="U1", user_name="Ada")  # fmt: skip
    secret = f"my secret okapi{uuid.uuid4().hex[:8]} plan"
    entered, release = held_model(world, ANSWER)
    turn = asyncio.create_task(world.runtime.turns().handle(scope, secret))
    await asyncio.wait_for(entered.wait(), WAIT)  # stored, and being answered
    await forget(memory, how, scope)
    release.set()
    reply = await turn
    await world.runtime.harness.drain()
    await memory.governance.settle()

    assert reply.text == ANSWER  # still answered
    with pytest.raises(UnknownTurn):  # its record, saved after the erasure, went too
        await memory.turn_records.get(tenant, reply.turn_id)
    assert await memory.turn_records.of_thread(tenant, scope.thread) == []
    assert not await memory.redis.smembers(turns_by_key(tenant, ASKER, "U1"))
    stored = await memory.conversation.all(scope, forgotten=True)
    if how in ("thread", "person in a DM"):  # the thread does not come back with the answer
        assert stored == []
        assert await memory.redis.zscore(threads_key(tenant), scope.thread) is None
        assert await episodic_keys(memory, tenant) == []
    else:  # a tombstone in its place; the answer stays, as answers to forgotten messages do
        assert [(m.forgotten, m.content) for m in stored] == [(True, ""), (False, ANSWER)]
    assert not any("okapi" in hit for hit in await found(memory, scope, secret))


async def test_an_answer_in_a_thread_erased_while_the_lock_is_busy_goes_later(
    world, tenant, monkeypatch
):
    """A DM erased whole while its turn runs, and another erasure (a person's, a long one)
    holds the tenant's lock when the turn ends: the answer, which quotes the question, is not
    left in the erased thread; its erasure is queued, and runs once the lock is free."""
    monkeypatch.setattr(governance_module, "LOCK_WAIT_SECONDS", 0.2)  # stands for a minute
    memory = world.runtime.memory
    scope = Scope(tenant, "t1", "D1", Visibility.DM, user="U1", user_name="Ada")
    entered, release = held_model(world, "about your secret okapi plan")
    turn = asyncio.create_task(world.runtime.turns().handle(scope, "my secret okapi plan"))
    await asyncio.wait_for(entered.wait(), WAIT)
    await memory.governance.forget_thread(tenant, "t1")
    await memory.redis.set(forgetting_key(tenant), "another-erasure", px=60_000)  # still held
    release.set()
    await turn
    await memory.redis.delete(forgetting_key(tenant))  # the other erasure ends
    await world.runtime.harness.drain()

    assert await memory.conversation.all(scope, forgotten=True) == []
    assert await memory.redis.zscore(threads_key(tenant), scope.thread) is None


async def test_a_queued_answer_erasure_keeps_what_was_said_since(world, tenant):
    """The queued erasure runs late: its person wrote in the DM again meanwhile. Only the
    answer goes; their new message stays."""
    memory, upkeep = world.runtime.memory, world.runtime.harness.upkeep
    scope = Scope(tenant, "t1", "D1", Visibility.DM, user="U1", user_name="Ada")
    answer = await memory.conversation.append(scope, "assistant", "about your okapi plan")
    await memory.conversation.append(scope, "user", "a new question")
    task = {"tenant": tenant, "thread": "t1", "messages": [answer.id]}

    await upkeep.forget_erased_answers([task])
    await upkeep.forget_erased_answers([task])  # run again: finds it gone

    stored = await memory.conversation.all(scope, forgotten=True)
    assert [(m.forgotten, m.content) for m in stored] == [(True, ""), (False, "a new question")]


async def test_a_platform_deletion_queued_after_a_forget_finds_the_late_record(memory, tenant):
    """The memory page forgets a Slack question; its turn saves the record later and, as it
    ends, queues the deletion of its message (bot/turns.py `changed_meanwhile`): the ids the
    forget noted with the source find the record, though the tombstone keeps no source."""
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    source = "C1:1700000000.000001"
    asked = await memory.conversation.append(scope, "user", "my okapi plan", source=source)
    await memory.governance.forget_message(tenant, "t1", asked.id)
    answered = await memory.conversation.append(scope, "assistant", "an answer")
    record = TurnRecord("turn-1", tenant, "t1", "my okapi plan", "an answer", asker="U1",
                        question_id=asked.id, answer_id=answered.id)  # fmt: skip
    assert await memory.turn_records.save(record)  # late: after the erasure

    erasure = await memory.governance.forget_deleted(tenant, ["t1"], source)

    assert erasure.turn_records == 1
    with pytest.raises(UnknownTurn):
        await memory.turn_records.get(tenant, "turn-1")
    assert not await memory.redis.smembers(turns_by_key(tenant, ASKER, "U1"))


async def test_a_turn_queued_when_its_asker_is_erased_is_not_run(slack):
    team, memory = f"T{uuid.uuid4().hex[:10]}", slack.world.runtime.memory
    here = slack_thread(team, ts(1))
    entered, release = held_model(slack.world, ANSWER)
    await slack.a.event(mention("my secret okapi plan", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # the first turn is at the model
    # queued behind it: the same person's next message, then the person is erased
    await slack.b.event(message("and my secret zebra code", ts(2), thread_ts=ts(1)), team=team)
    await memory.governance.forget_person(team, "U1")
    release.set()
    await slack.settle()

    assert await texts(memory, here) == [ANSWER]  # the queued one was neither stored
    assert len(slack.world.model_requests()) == 1  # nor answered
    assert await memory.turn_records.of_thread(team, here.thread) == []
    assert not await memory.redis.smembers(turns_by_key(team, ASKER, "U1"))
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra code"))
