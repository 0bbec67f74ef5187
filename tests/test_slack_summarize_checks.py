"""`/summarize <link to a thread of another channel>`'s check is durable work
(adapters/slack_summarize.py): queued before "Checking…" is answered, run by any live process
(one that acked it may die first), said once however often it runs, and a check Slack cannot
answer yet is run again, said only on its last delivery. Over real HTTP to the mock Web API,
a real Redis and the scripted model; several adapters on one Redis are several processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web

from adapters.slack import SlackAdapter, thread_id
from adapters.slack_summarize import (
    CHECKING,
    MAX_DELIVERIES,
    MEMBERSHIP_UNKNOWN,
    NOT_A_MEMBER,
    SUMMARIZING,
)
from adapters.web import build_web_app
from memory.keys import task_stream
from memory.scope import Scope
from memory.tasks import Task, TaskStream
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text
from tests.support.slack_api import MockSlackApi, SlackSender, mention

SECRET = "test-signing-secret"
RETRY_MS = 100  # a check that failed, or whose process died, runs again this soon
SLACK_ANSWERS_AFTER = 20.0  # seconds: the held lookups come long after any answer


def ts(n: int) -> str:
    return f"1700000000.{n:06d}"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


@pytest.fixture
async def api():
    api = MockSlackApi(streaming=True)
    api.private_channels.add("C3")
    api.members.update({"C1": {"U1", "U2"}, "C3": {"U1"}})
    await api.start()
    yield api
    await api.close()


@contextlib.asynccontextmanager
async def slack_process(world, api, stream: str, started: bool = True) -> AsyncIterator:
    """One bot process (an adapter behind its own HTTP server) on the test's stream of checks;
    `started=False`: one that answers commands but dies before it runs any check."""
    handler = world.runtime.turns()
    adapter = SlackAdapter(handler, "xoxb-test", SECRET, api_url=api.base_url, cache_seconds=0,
                           summarize_stream=stream, summarize_claim_idle_ms=RETRY_MS)  # fmt: skip
    if started:
        await adapter.check_token()
    runner = web.AppRunner(build_web_app(handler.memory, adapter.app))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    session = aiohttp.ClientSession()
    try:
        yield adapter, SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, session, api)
        if started:
            for _ in range(3):
                await adapter.wait_idle()
                await world.runtime.harness.drain()
    finally:
        await session.close()
        await runner.cleanup()
        await adapter.close()


async def a_thread(world, api, team: str, stream: str, n: int) -> str:
    """Ada's thread with the bot in private C3 (a process since gone); its link."""
    async with slack_process(world, api, stream) as (_, sender):
        world.model.script(text("The budget in C3 is 7 million."))
        await sender.event(
            mention("What is the budget?", ts(n), channel="C3", user="U1"), team=team
        )
    return f"https://x.slack.com/archives/C3/p{ts(n).replace('.', '')}"


async def ask(sender, team: str, link: str, user: str, answer: str) -> None:
    """`/summarize <link>` in C1: answered "Checking…" at once."""
    url = sender.api.response_url + answer
    response = await sender.command("/summarize", link, url, team=team, channel="C1", user=user)
    assert await response.text() == CHECKING


async def acked_then_died(world, api, team: str, stream: str, link: str, user: str,
                          answer: str) -> Task:  # fmt: skip
    """The command answered by a process that died before running its check; the check read by
    a consumer that died too (never acknowledged): what is left in Redis."""
    async with slack_process(world, api, stream, started=False) as (_, sender):
        await ask(sender, team, link, user, answer)
    dead = TaskStream(world.runtime.memory.redis, task_stream(stream), consumer="dead")
    [task] = await dead.read(10, 100)
    return task


def told(api, answer: str) -> list[str]:
    return [post["text"] for post in api.responded.get(answer, [])]


async def summaries(world, team: str, n: int) -> int:
    scope = Scope(team, thread_id(team, "C3", ts(n)), "C3")
    return len(await world.runtime.memory.summaries.for_thread(scope))


def new_stream() -> str:
    return f"summarize-test-{time.time_ns()}"


async def test_a_check_whose_process_died_is_run_by_another_once(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 1)
    task = await acked_then_died(world, api, team, stream, link, "U1", "ada")
    assert told(api, "ada") == []  # "Checking…" only, so far
    async with slack_process(world, api, stream) as (alive, _):
        await alive.wait_idle()  # taken over once idle, run, the summary queued and run
        assert told(api, "ada") == [SUMMARIZING]
        said = api.thread_texts("C3", ts(1))
        assert said[-1].startswith("Stored as [Summary ID: sum_")
        await alive.summaries.one(task.payload)  # delivered again: died before its ack
        await alive.wait_idle()
    assert told(api, "ada") == [SUMMARIZING]
    assert api.thread_texts("C3", ts(1)) == said  # summarized once, nothing more said
    assert await summaries(world, team, 1) == 1


async def test_a_refusal_is_said_once_however_often_its_check_runs(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 2)
    task = await acked_then_died(world, api, team, stream, link, "U2", "grace")  # not in C3
    async with slack_process(world, api, stream) as (alive, _):
        await alive.wait_idle()
        await alive.summaries.one(task.payload)
        await alive.wait_idle()
    assert told(api, "grace") == [NOT_A_MEMBER]
    assert await summaries(world, team, 2) == 0
    assert api.thread_texts("C3", ts(2)) == ["The budget in C3 is 7 million."]


async def test_slack_unable_to_say_is_asked_again_and_said_on_the_last_delivery(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 3)
    api.fail("users.conversations", "internal_error", times=MAX_DELIVERIES)
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, link, "U1", "ada")
        await bot.wait_idle()
    assert told(api, "ada") == [MEMBERSHIP_UNKNOWN]
    assert len(api.of("users.conversations")) == MAX_DELIVERIES
    assert await summaries(world, team, 3) == 0


async def test_slack_unable_to_say_for_a_while_ends_in_the_summary(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 4)
    api.fail("users.conversations", "internal_error", times=2)
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, link, "U1", "ada")
        for _ in range(3):
            await bot.wait_idle()
            await world.runtime.harness.drain()
    assert told(api, "ada") == [SUMMARIZING]  # nothing said of the failures
    assert len(api.of("users.conversations")) == 3
    assert await summaries(world, team, 4) == 1


async def test_a_summary_in_its_own_channel_is_answered_before_a_slow_slack_says_who(world, api):
    """Who asks and where are Slack's to say, after the answer: a person of another
    organisation (asked in turn: who they are, their organisation, the channel) still gets
    "Summarizing…" before Slack gives up waiting for it, and the summary follows."""
    team, stream = f"T{time.time_ns()}", new_stream()
    await a_thread(world, api, team, stream, 6)
    answered = asyncio.Event()

    def slack_answers() -> None:
        answered.set()
        api.release()

    async with slack_process(world, api, stream) as (bot, sender):
        api.hold("users.info", "conversations.info", "users.conversations")
        later = asyncio.get_running_loop().call_later(SLACK_ANSWERS_AFTER, slack_answers)
        try:
            body = urlencode({
                "token": "legacy", "team_id": team, "channel_id": "C3", "user_id": "U1",
                "user_team": "TPARTNER", "command": "/summarize", "text": "",
                "response_url": api.response_url + "ada", "trigger_id": "t", "api_app_id": "A1",
            })  # fmt: skip
            response = await sender.post(body, "application/x-www-form-urlencoded")
            assert not answered.is_set()  # answered while Slack still had said nothing
            assert await response.text() == SUMMARIZING
        finally:
            later.cancel()
            slack_answers()
        for _ in range(3):
            await bot.wait_idle()
            await world.runtime.harness.drain()
    assert len(api.thread_texts("C3", ts(6))) == 2  # the answer, then the summary's
