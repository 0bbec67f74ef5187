"""The spine after the Slack audit: another service's refused connection is not the memory
down (else its job is retried for ever, never counted); an answer the platform refuses for
good in its place is said NOT_SHOWN; a /summarize is never told "your message is saved"; the
pauses before a job runs again grow as RETRY_BACKOFF says.

Real errors from real clients (aiohttp, openai, redis) at a port nothing listens on; the
pipeline over a real Redis, with a test platform."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis

from adapters.spine import (
    FAILURE,
    GAVE_UP,
    GAVE_UP_AGAIN,
    NOT_DONE,
    NOT_SHOWN,
    RETRY_PAUSE_SECONDS,
    Job,
    Pipeline,
    Status,
    retry_pause_after,
)
from memory.errors import memory_unavailable
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import text
from tests.test_spine_failures import delivered
from tests.test_turn_recovery import Board


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def refused_by(call) -> BaseException:
    try:
        await call
    except Exception as exc:
        return exc
    raise AssertionError("something listened")


async def test_a_connection_another_service_refused_is_not_the_memory_down():
    """Slack's (aiohttp) and the model's (openai) refused connection carry a
    ConnectionRefusedError as their cause, as Redis's does: only Redis's is the memory."""
    url = f"http://127.0.0.1:{free_port()}"
    async with aiohttp.ClientSession() as session:
        slack = await refused_by(session.post(f"{url}/api/chat.postMessage"))
    model = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    try:
        llm = await refused_by(model.embeddings.create(model="m", input="a"))
    finally:
        await model.close()
    memory = aioredis.Redis(port=free_port())
    try:
        down = await refused_by(memory.ping())
    finally:
        await memory.aclose()
    for exc in (slack, llm, down):
        assert any(isinstance(e, ConnectionRefusedError) for e in _causes(exc)), exc
    assert isinstance(llm, openai.APIConnectionError)
    assert not memory_unavailable(slack)
    assert not memory_unavailable(llm)
    assert memory_unavailable(down)
    assert memory_unavailable(ConnectionRefusedError())  # bare: no other service's around it


def _causes(exc: BaseException | None) -> list[BaseException]:
    found = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


class Closed(Exception):
    """The platform refusing for good where the job asked (a channel archived)."""


class RefusingAnswers(Board):
    """A platform that refuses every answer's first part: for good (`Closed`), or with an
    error of its own it does not know (`kind`)."""

    def __init__(self, kind: type[Exception] = Closed) -> None:
        super().__init__()
        self.kind = kind

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        raise self.kind("no")

    def refused(self, exc: BaseException) -> bool:
        return isinstance(exc, Closed)


class NeverWorking(Board):
    """A platform failing in passing at every run (its server never answers)."""

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        raise ConnectionResetError("the platform did not answer")
        yield Status()


async def run_job(world, board: Board, job: Job) -> None:
    pipeline = Pipeline(board, world.runtime.turns())
    pipeline.retry_pause = 0.01  # the pauses keep their growth
    try:
        assert await pipeline.submit(job)
        await delivered(world, job.scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()


async def test_an_answer_refused_for_good_in_its_place_is_said_not_shown(world, tenant):
    """Not "something went wrong on my side... try again": trying again there fails too."""
    board = RefusingAnswers()
    world.model.script(text("the answer"))
    await run_job(world, board, Job("turn", Scope(tenant, "closed"), "a question", "EvClosed"))
    assert board.notices == [NOT_SHOWN]


async def test_a_summary_that_could_not_be_shown_does_not_say_a_message_is_saved(world, tenant):
    board = RefusingAnswers(RuntimeError)
    await run_job(world, board, Job("summarize", Scope(tenant, "sum-failed"), event_id="EvSum1"))
    assert board.notices == [NOT_DONE]
    assert FAILURE != NOT_DONE and "saved" not in NOT_DONE


async def test_a_summary_given_up_does_not_say_a_message_is_saved(world, tenant):
    board = NeverWorking()
    await run_job(world, board, Job("summarize", Scope(tenant, "sum-gave-up"), event_id="EvSum2"))
    assert board.notices == [GAVE_UP_AGAIN]
    assert GAVE_UP != GAVE_UP_AGAIN and "saved" not in GAVE_UP_AGAIN


def test_the_pauses_before_a_job_runs_again_grow_as_said():
    """2 s, 10 s, 30 s, 1 min, 2 min after the 1st to 5th run the platform failed in passing;
    2 min after any later one."""
    assert RETRY_PAUSE_SECONDS == 2.0
    paused = [retry_pause_after(passed) for passed in range(1, 7)]
    assert paused == [2.0, 10.0, 30.0, 60.0, 120.0, 120.0]
    assert retry_pause_after(3, 0.02) == pytest.approx(0.3)
