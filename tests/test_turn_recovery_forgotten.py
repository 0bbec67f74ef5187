"""A turn taken over after a crash whose question was forgotten meanwhile is not run: the
first run stored the question, then its process died; the memory page, a person's erasure
or retention forgot it; the run that takes the job over embeds, calls the model on, stores,
records and indexes nothing, and tells the person instead of answering."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from adapters.spine import Job, Pipeline
from bot.harness import FORGOTTEN_QUESTION
from memory.scope import Scope
from memory.stores.turn_records import UnknownTurn
from tests import test_turn_recovery
from tests.test_platform_deletions import WAIT, found, held_model
from tests.test_turn_recovery import Board, fast, until

world = test_turn_recovery.world  # its fixture: an agent world on the test Redis


class Recorder:
    """The embedding backend, recording every text it is asked to embed."""

    def __init__(self, inner) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.texts: list[str] = []

    async def embed(self, texts: list[str]):
        self.texts += texts
        return await self.inner.embed(texts)


async def episodic_keys(memory, tenant: str) -> list[bytes]:
    """Every episodic document of the tenant, as stored in Redis."""
    prefix = memory.episodes.key_prefix(tenant)
    return [key async for key in memory.redis.scan_iter(match=f"{prefix}*")]


async def erase(memory, how: str, scope: Scope) -> None:
    """Forget the thread's question the way `how` says."""
    governance = memory.governance
    if how == "memory page":
        (question,) = await memory.conversation.all(scope)
        await governance.forget_message(scope.tenant, scope.thread, question.id)
    elif how == "person":
        await governance.forget_person(scope.tenant, scope.user)
    else:  # retention: the thread is older than the period, and goes whole
        await governance.sweep_retention(scope.tenant, time.time())


@pytest.mark.parametrize("how", ["memory page", "person", "retention"])
async def test_a_turn_taken_over_after_its_question_was_forgotten_is_not_run(world, tenant, how):
    memory, turns = world.runtime.memory, world.runtime.memory.turns
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    secret = f"my secret okapi{uuid.uuid4().hex[:8]} plan"
    job = Job("turn", scope, secret)
    assert await turns.push(scope, job.to_json(), job.event_id, watch="board")

    # a process takes the job and dies while the model answers: the question is stored by then
    # its lease outlives the run's first save on a loaded machine, then lapses for the survivor
    assert await turns.lease(scope, "dead-process", 3000)
    taken = await turns.take(scope, "dead-process")
    assert taken is not None
    running = Job.from_json(taken.job)
    entered, release = held_model(world, "an answer about the secret plan")
    dying = Pipeline(Board(), world.runtime.turns())
    save = lambda: turns.save(scope, "dead-process", running.to_json())  # noqa: E731
    crash = asyncio.create_task(dying.run(running, save=save))
    await asyncio.wait_for(entered.wait(), WAIT)
    crash.cancel()  # the process is gone
    await asyncio.gather(crash, return_exceptions=True)
    world.model.responder = None
    release.set()
    assert [m.content for m in await memory.conversation.all(scope)] == [secret]
    assert len(world.model_requests()) == 1

    await erase(memory, how, scope)
    assert await memory.conversation.all(scope) == []

    recorder = Recorder(memory.embedder.inner)
    memory.embedder.inner = recorder  # what the survivor embeds (a remote service would see)
    board = Board()
    survivor = fast(Pipeline(board, world.runtime.turns()))
    survivor.start()  # finds the dead process's thread and takes it over
    try:
        await until(lambda: FORGOTTEN_QUESTION in board.placeholders.values())
        await survivor.wait_idle()
    finally:
        await survivor.close()
    await world.runtime.harness.drain()

    assert list(board.placeholders.values()) == [FORGOTTEN_QUESTION]  # delivered, once
    assert not [text for text in recorder.texts if "okapi" in text]  # not even embedded again
    assert await turns.delivered(scope, job.id)
    assert len(world.model_requests()) == 1  # the dead run's only: the survivor asked nothing
    assert await memory.conversation.all(scope) == []  # no answer stored
    assert await memory.turn_records.of_thread(tenant, scope.thread) == []
    with pytest.raises(UnknownTurn):
        await memory.turn_records.get(tenant, job.id)
    assert await episodic_keys(memory, tenant) == []
    assert not await memory.redis.exists(memory.embedder._key(secret))
    assert not any("okapi" in hit for hit in await found(memory, scope, secret))
