"""At least once, exactly once: jobs survive a dead process, a re-run answers once, a stopping
process hands its work back, and an unreachable memory is said and waited out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from adapters.spine import (
    MEMORY_DOWN,
    NOT_TAKEN,
    Job,
    MemoryUnavailable,
    Pipeline,
    Platform,
    Status,
)
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope
from tests.agent_world import World, close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import text


class Board(Platform):
    """A platform with one placeholder per job: re-runs must reuse it, as Slack's does."""

    name = "board"
    limit = 4000

    def __init__(self) -> None:
        self.placeholders: dict[str, str] = {}  # id -> what it shows
        self.posted: list[str] = []  # every part posted besides placeholders
        self.notices: list[str] = []

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        if "placeholder" not in job.progress:
            job.progress["placeholder"] = f"p{len(self.placeholders)}"
        self.placeholders.setdefault(job.progress["placeholder"], "Thinking…")
        yield Status()

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        if index == 0:
            self.placeholders[job.progress["placeholder"]] = part
        else:
            self.posted.append(part)

    async def notice(self, job: Job, text: str) -> None:
        self.notices.append(text)


async def until(condition, seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {condition.__code__.co_positions}")


def fast(pipeline: Pipeline) -> Pipeline:
    """Recovery scans often; the lease (renewed every second) outlasts an event loop stalled
    on a loaded machine, so the pipeline's own recovery does not take over its live run."""
    pipeline.lease_ms, pipeline.recover_every = 3000, 0.1
    return pipeline


async def stored(world: World, scope: Scope) -> list[str]:
    return [m.content for m in await world.runtime.memory.conversation.all(scope)]


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_dead_processes_job_is_taken_over_and_answered_once(world, tenant):
    scope = Scope(tenant, "t1")
    turns = world.runtime.memory.turns
    job = Job("turn", scope, "what is MemGPT?", event_id="Ev1")
    assert await turns.push(scope, job.to_json(), job.event_id, watch="board")
    # a process takes the job, posts its placeholder, saves that, and dies (no renewal)
    assert await turns.lease(scope, "dead-process", 500)
    taken = await turns.take(scope, "dead-process")
    assert taken is not None and not taken.resumed
    running = Job.from_json(taken.job)
    running.progress["placeholder"] = "p0"
    assert await turns.save(scope, "dead-process", running.to_json())

    world.model.script(text("MemGPT is an LLM OS."))
    board = Board()
    board.placeholders["p0"] = "Thinking…"
    survivor = fast(Pipeline(board, world.runtime.turns()))
    survivor.start()
    try:
        await until(lambda: board.placeholders["p0"] != "Thinking…")
        await survivor.wait_idle()
    finally:
        await survivor.close()
    assert board.placeholders == {"p0": "MemGPT is an LLM OS."}  # the dead one's placeholder
    assert await stored(world, scope) == ["what is MemGPT?", "MemGPT is an LLM OS."]
    assert await turns.delivered(scope, job.id)
    assert not await turns.push(scope, job.to_json(), job.event_id)  # a retry is recognised


async def test_a_re_run_after_a_crash_stores_and_answers_once(world, tenant):
    """The crash came after the answer was stored and sent, before the job was completed."""
    scope = Scope(tenant, "t2")
    world.model.script(text("first answer"))
    board = Board()
    pipeline = Pipeline(board, world.runtime.turns())
    job = Job("turn", scope, "a question")
    await pipeline.run(job)
    await pipeline.run(Job.from_json(job.to_json()))  # what a re-run reads from Redis
    assert board.placeholders == {"p0": "first answer"} and board.posted == []
    assert await stored(world, scope) == ["a question", "first answer"]
    assert len(world.model_requests()) == 1

    # a crash after the answer was stored, before the job saved it: the stored answer is
    # given again (the one memory, the record and its 👍/👎 hold), the model not asked again
    world.model.script(text("second answer"), text("second answer, again"))
    job = Job("turn", scope, "another question")
    await pipeline.run(job)
    del job.progress["answer"], job.progress["sent"]
    await pipeline.run(job)
    assert await stored(world, scope) == [
        "a question", "first answer", "another question", "second answer",
    ]  # fmt: skip
    assert board.placeholders["p1"] == "second answer"
    assert len(world.model_requests()) == 2


async def test_a_deletion_missed_by_a_run_that_died_after_answering_is_caught_up(world, tenant):
    """The message was deleted on the platform while its turn ran, and the run died after
    sending the answer, before looking: the job, run again, forgets the stored question."""
    scope = Scope(tenant, "t3")
    world.model.script(text("an answer about otters"))
    pipeline = Pipeline(Board(), world.runtime.turns())
    job = Job("turn", scope, "tell me about otters", source="C1:100.1")
    await pipeline.run(job)
    assert job.progress["caught_up"]
    await world.runtime.memory.governance.note_deleted(tenant, job.source)
    del job.progress["caught_up"]  # what a run that died before looking left in Redis
    await pipeline.run(Job.from_json(job.to_json()))
    await world.runtime.harness.drain()
    assert await stored(world, scope) == ["an answer about otters"]  # the question forgotten
    assert len(world.model_requests()) == 1


class Gone(Board):
    """A platform where the thread can no longer be reached (Discord: the channel not found)."""

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        raise LookupError("the channel cannot be fetched")
        yield Status()


async def test_a_deletion_is_caught_up_when_the_platform_fails_around_the_re_run(world, tenant):
    scope = Scope(tenant, "t4")
    world.model.script(text("an answer about seals"))
    job = Job("turn", scope, "tell me about seals", source="C1:100.2")
    await Pipeline(Board(), world.runtime.turns()).run(job)
    await world.runtime.memory.governance.note_deleted(tenant, job.source)
    del job.progress["caught_up"]  # the run died before looking
    await Pipeline(Gone(), world.runtime.turns()).run(Job.from_json(job.to_json()))
    await world.runtime.harness.drain()
    assert await stored(world, scope) == ["an answer about seals"]  # the question forgotten


async def test_a_job_that_keeps_failing_is_given_up(world, tenant):
    board = Board()
    pipeline = Pipeline(board, world.runtime.turns())
    job = Job("turn", Scope(tenant, "t3"), "crashes every time", progress={"attempts": 3})
    await pipeline.run(job)
    assert "several times" in board.placeholders["p0"]
    assert world.model_requests() == []


async def test_shutdown_hands_running_work_back_to_a_live_process(world, tenant):
    scope = Scope(tenant, "t4")
    world.model.script(text("slow answer", delay=2.0), text("the answer"))
    stopping = fast(Pipeline(Board(), world.runtime.turns()))
    assert await stopping.submit(Job("turn", scope, "a slow question"))
    await until(lambda: len(world.model_requests()) == 1)  # the turn is waiting for the model
    await stopping.shutdown(grace=0.1)
    turns = world.runtime.memory.turns
    assert not await turns.leased(scope)  # handed back at once, not left to lapse

    board = Board()
    survivor = fast(Pipeline(board, world.runtime.turns()))
    survivor.start()
    try:
        await until(lambda: any(v != "Thinking…" for v in board.placeholders.values()))
        await survivor.wait_idle()
    finally:
        await survivor.close()
    assert list(board.placeholders.values()) == ["the answer"]
    assert await stored(world, scope) == ["a slow question", "the answer"]


async def test_an_unreachable_memory_is_said_and_the_message_answered_when_back(tmp_path, tenant):
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    world = await open_world(server.ensure_running(), tmp_path)
    scope = Scope(tenant, "t5")
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    try:
        server.stop()
        with pytest.raises(MemoryUnavailable):
            await pipeline.submit(Job("turn", scope, "hello?"))
        assert board.notices == [NOT_TAKEN]

        server.ensure_running()  # back, with its data
        world.model.script(text("hello!"))
        assert await pipeline.submit(Job("turn", scope, "hello?"))
        await until(lambda: list(board.placeholders.values()) == ["hello!"])
        await pipeline.wait_idle()

        # memory goes away in the middle of a turn: said in the placeholder, answered later
        world.model.script(text("lost in the outage", delay=1.0), text("answered after it"))
        job = Job("turn", scope, "during the outage?")
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 2)  # the turn waits for the model
        server.stop()
        await pipeline.wait_idle()
        assert board.placeholders["p1"] == MEMORY_DOWN
        server.ensure_running()
        pipeline.start()  # as every process does: it looks for threads left unfinished
        await until(lambda: board.placeholders["p1"] == "answered after it")
        await pipeline.wait_idle()  # the job completes after its answer is out
        assert await stored(world, scope) == [
            "hello?", "hello!", "during the outage?", "answered after it",
        ]  # fmt: skip
        assert await world.runtime.memory.turns.delivered(scope, job.id)
    finally:
        await pipeline.close()
        await close_world(world)
        server.stop()
