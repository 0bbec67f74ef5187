"""The message shortcut *Summarize thread* is `/summarize`'s durable task
(adapters/slack_summarize.py): in Redis before Slack has its (quiet) answer, so a process lost
right after the answer loses nothing. And a check whose person Slack cannot describe (users.info
failing: walled by default, not by Slack's word) runs again like a membership Slack cannot say,
told only on its last delivery; a guest by Slack's word is refused at once. Over real HTTP to
the mock Web API, a real Redis and the scripted model, as tests/test_slack_summarize_checks.py.
"""

from __future__ import annotations

import time

import pytest

from adapters.slack_summarize import (
    MAX_DELIVERIES,
    NOT_A_MEMBER,
    PERSON_UNKNOWN,
    SHORTCUT_NOT_TAKEN,
    SUMMARIZING,
)
from memory.keys import task_stream
from memory.redis_server import EmbeddedRedis
from memory.tasks import TaskStream
from tests.agent_world import close_world, open_world
from tests.conftest import free_port, redis_options
from tests.support.slack_api import MockSlackApi
from tests.test_slack_summarize_checks import (
    a_thread,
    ask,
    new_stream,
    slack_process,
    summaries,
    told,
    ts,
)

SUMMARY = "Stored as [Summary ID: sum_"


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


async def settle(world, bot) -> None:
    for _ in range(3):
        await bot.wait_idle()
        await world.runtime.harness.drain()


async def test_a_shortcut_s_summary_survives_its_process_dying_after_the_answer(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    await a_thread(world, api, team, stream, 1)  # Ada's thread with the bot in C3
    async with slack_process(world, api, stream, started=False) as (_, sender):
        response = await sender.shortcut("summarize_thread", {"ts": ts(1), "user": "U1"},
                                         api.response_url + "ada", team=team, channel="C3")  # fmt: skip
        assert response.status == 200
    # answered, then gone: its task is in Redis, read by a consumer that died too
    dead = TaskStream(world.runtime.memory.redis, task_stream(stream), consumer="dead")
    [task] = await dead.read(10, 100)
    async with slack_process(world, api, stream) as (alive, _):
        await settle(world, alive)  # taken over once idle, run, the summary queued and run
        said = api.thread_texts("C3", ts(1))
        assert said[-1].startswith(SUMMARY)
        await alive.summaries.one(task.payload)  # delivered again: died before its ack
        await settle(world, alive)
    assert api.thread_texts("C3", ts(1)) == said  # summarized once, in its thread
    assert await summaries(world, team, 1) == 1
    assert told(api, "ada") == []  # quiet, as before: the summary is the answer


async def test_a_shortcut_memory_cannot_take_is_said_to_the_person_only(tmp_path, api):
    """Memory down at the shortcut: answered all the same (Slack sends no shortcut twice), and
    only the person told, at its response_url, to run it again: nothing of it is kept, so no
    "I will answer this as soon as it is back" in the thread."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    world = await open_world(server.ensure_running(), tmp_path)
    try:
        team, stream = f"T{time.time_ns()}", new_stream()
        await a_thread(world, api, team, stream, 5)
        said = api.thread_texts("C3", ts(5))
        async with slack_process(world, api, stream) as (_, sender):
            server.stop()
            response = await sender.shortcut("summarize_thread", {"ts": ts(5), "user": "U1"},
                                             api.response_url + "ada", team=team, channel="C3")  # fmt: skip
            assert response.status == 200
            await api.response("ada", timeout=30)  # told after the answer (memory down)
            assert told(api, "ada") == [SHORTCUT_NOT_TAKEN]
            server.ensure_running()
        assert api.thread_texts("C3", ts(5)) == said  # nothing said in the thread
    finally:
        await close_world(world)
        server.stop()


async def test_slack_unable_to_say_who_they_are_for_a_while_ends_in_the_summary(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 2)
    api.fail("users.info", "internal_error", times=2)
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, link, "U1", "ada")
        await settle(world, bot)
    assert told(api, "ada") == [SUMMARIZING]  # nothing said of the failures, no refusal
    assert await summaries(world, team, 2) == 1


async def test_slack_never_saying_who_they_are_is_said_on_the_last_delivery(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 3)
    asked_before = len(api.of("users.info"))
    api.fail("users.info", "internal_error", times=MAX_DELIVERIES)
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, link, "U1", "ada")
        await settle(world, bot)
    assert told(api, "ada") == [PERSON_UNKNOWN]
    assert len(api.of("users.info")) - asked_before == MAX_DELIVERIES  # asked each delivery
    assert await summaries(world, team, 3) == 0


async def test_a_guest_by_slack_s_word_is_refused_at_once(world, api):
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 4)
    api.guests.add("U1")  # made a guest since
    asked_before = len(api.of("users.info"))
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, link, "U1", "ada")
        await settle(world, bot)
    assert told(api, "ada") == [NOT_A_MEMBER]
    assert len(api.of("users.info")) - asked_before == 1  # Slack's word: not asked again
    assert await summaries(world, team, 4) == 0
