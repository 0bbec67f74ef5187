"""A turn taken over after a crash whose stored question was forgotten meanwhile makes no watch,
even when its text is now a watch command (the person edited the message on the platform: the
re-run takes the latest text); it says what any forgotten question's re-run says. A re-run of a
watch command the first run never stored still makes (the same) watch."""

from __future__ import annotations

import pytest

from bot.harness import FORGOTTEN_QUESTION
from bot.watches import watch_id_of
from memory.scope import Scope
from memory.stores.watches import WatchStore
from tests import test_turn_recovery

world = test_turn_recovery.world  # its fixture: an agent world on the test Redis


@pytest.fixture
async def watches(world, tenant):
    """The tenant's watch store; what a test made leaves the global due index afterwards."""
    store = WatchStore(world.runtime.memory.redis)
    yield store
    for watch in await store.all(tenant):
        await store.remove(tenant, watch.id)


async def test_a_re_run_whose_question_was_forgotten_makes_no_watch(world, tenant, watches):
    runtime, memory = world.runtime, world.runtime.memory
    scope = Scope(tenant, "t1", user="U1")
    job = "job-forgotten-watch"
    await runtime.harness.before(scope, "state-space models, every week please", job)  # then died
    (question,) = await memory.conversation.all(scope)
    await memory.governance.forget_message(tenant, "t1", question.id)  # the memory page

    reply = await runtime.turns().handle(
        scope, "watch state-space models weekly", turn_id=job, rerun=True
    )
    assert reply.text == FORGOTTEN_QUESTION
    assert await watches.all(tenant) == []
    assert await memory.conversation.all(scope) == []


async def test_a_re_run_of_a_watch_command_makes_its_watch_once(world, tenant, watches):
    scope = Scope(tenant, "t1", user="U1")
    turns = world.runtime.turns()
    made = await turns.handle(scope, "watch diffusion models weekly", turn_id="job-w")
    again = await turns.handle(scope, "watch diffusion models weekly", turn_id="job-w", rerun=True)
    assert made.text == again.text
    assert [w.id for w in await watches.all(tenant)] == [watch_id_of(tenant, "job-w")]
