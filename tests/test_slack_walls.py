"""Guests, people of another organisation (Slack Connect) and channels shared with one do not
see the team's public memory (adapters/slack_walls.py, memory/scope.py `walled`): through the
Slack adapter over real HTTP, a real Redis and the scripted model. What the model is sent (the
context and the tools' results) is what they could read.

The team's memory is a member's message in the public channel C1 and an entity learned there;
each walled flow asks about it and must not be shown it, while a member asking the same is.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from adapters.slack import SlackAdapter, thread_id
from adapters.web import build_web_app
from memory.scope import Scope, Visibility
from memory.stores.entity import Entity
from tests.agent_world import close_world, open_world
from tests.support.memory_seed import PAPER, add_paper, say
from tests.support.scripted_openai import call, text, tool_calls
from tests.support.slack_api import MockSlackApi, SlackSender, mention, message

SECRET = "test-signing-secret"
BUDGET = "the Zanzibar launch budget is 7 million"  # said by a member in public C1
ENTITY = "a satellite launch funded with 9 million"  # learned in public C1
GUEST, STRANGER = "U5", "U6"
QUESTION = "What is the Zanzibar launch budget?"


def ts(n: int) -> str:
    return f"1700000000.{n:06d}"


@contextlib.asynccontextmanager
async def walled_world(redis_url: str, tmp_path, cache_seconds: float = 0) -> AsyncIterator:
    """One bot process whose Slack answers are cached for `cache_seconds` (0: never, so a
    channel's conversion is followed at once), a mock Web API with a guest and a Slack Connect
    person."""
    world = await open_world(redis_url, tmp_path)
    api = MockSlackApi(streaming=True)
    api.users.update({GUEST: "Gus", STRANGER: "Sten"})
    api.guests.add(GUEST)
    await api.start()
    session = aiohttp.ClientSession()
    handler = world.runtime.turns()
    adapter = SlackAdapter(handler, "xoxb-test", SECRET, api_url=api.base_url,
                           cache_seconds=cache_seconds)  # fmt: skip
    runner = web.AppRunner(build_web_app(handler.memory, adapter.app))
    await adapter.check_token()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]

    class Env:
        pass

    env = Env()
    env.world, env.api, env.adapter = world, api, adapter
    env.a = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, session, api)
    env.memory = world.runtime.memory

    async def settle() -> None:
        for _ in range(3):
            await adapter.wait_idle()
            await world.runtime.harness.drain()

    env.settle = settle
    yield env
    await settle()
    await session.close()
    await runner.cleanup()
    await adapter.close()
    await api.close()
    await close_world(world)


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        yield env


async def team_memory(env) -> str:
    """The team's public memory: a member's message in C1, indexed, and an entity."""
    team = f"T{time.time_ns()}"
    public = Scope(team, thread_id(team, "C1", ts(1)), "C1", Visibility.PUBLIC, "U1", "Ada")
    await say(env.memory, public, "user", f"We decided that {BUDGET}.", 1_700_000_000.0)
    await env.memory.entities.upsert(public, [Entity("Zanzibar", "project", ENTITY)])
    return team


def asks_team_memory() -> list:
    """The model's turn: search every conversation and answer."""
    query = {"query": "Zanzibar launch budget", "where": "team"}
    return [tool_calls(call("search_conversations", query)), text("I cannot say.")]


def sent_to_model(env, since: int) -> str:
    """Everything the agent loop sent the model from its `since`-th request on: the context
    (recalled messages, entities) and the tools' results."""
    return json.dumps(env.world.model_requests()[since:])


async def stored(env, team: str, channel: str, thread_ts: str) -> set[str]:
    scope = Scope(team, thread_id(team, channel, thread_ts), channel)
    return {m.audience for m in await env.memory.conversation.all(scope)}


async def test_a_guest_s_direct_message_is_not_shown_the_team_s_memory(walled):
    team = await team_memory(walled)
    walled.world.model.script(*asks_team_memory(), *asks_team_memory())
    dm = message(QUESTION, ts(10), channel=f"D{GUEST}", user=GUEST, channel_type="im")
    await walled.a.event(dm, team=team)
    await walled.settle()
    seen = sent_to_model(walled, 0)
    assert QUESTION in seen  # the guest was answered
    assert "7 million" not in seen and "9 million" not in seen
    assert await stored(walled, team, f"D{GUEST}", "dm") == {f"dm:D{GUEST}"}

    # a member asking the same in their DM is shown it
    before = len(walled.world.model_requests())
    await walled.a.event(message(QUESTION, ts(11), channel="DU2", user="U2", channel_type="im"),
                         team=team)  # fmt: skip
    await walled.settle()
    member_seen = sent_to_model(walled, before)
    assert "7 million" in member_seen and "9 million" in member_seen


async def test_a_slack_connect_person_s_mention_in_a_public_channel(walled):
    team = await team_memory(walled)
    walled.world.model.script(*asks_team_memory())
    event = {**mention(QUESTION, ts(20), channel="C1", user=STRANGER), "user_team": "TPARTNER"}
    await walled.a.event(event, team=team)
    await walled.settle()
    assert walled.api.thread_texts("C1", ts(20)) == ["I cannot say."]
    # the answer is streamed to the person in their own workspace, not ours
    started = walled.api.of("chat.startStream")[-1]
    assert (started["recipient_user_id"], started["recipient_team_id"]) == (STRANGER, "TPARTNER")
    seen = sent_to_model(walled, 0)
    assert QUESTION in seen
    assert "7 million" not in seen and "9 million" not in seen
    # what they said stays in the channel: not the team's public memory
    assert await stored(walled, team, "C1", ts(20)) == {"private:C1"}


async def test_a_member_s_mention_in_a_channel_shared_with_another_organisation(walled):
    team = await team_memory(walled)
    walled.api.shared_channels.add("C7")
    walled.world.model.script(*asks_team_memory())
    await walled.a.event(mention(QUESTION, ts(30), channel="C7", user="U1"), team=team)
    await walled.settle()
    assert walled.api.thread_texts("C7", ts(30)) == ["I cannot say."]
    seen = sent_to_model(walled, 0)
    assert QUESTION in seen
    assert "7 million" not in seen and "9 million" not in seen
    assert await stored(walled, team, "C7", ts(30)) == {"private:C7"}


async def guest_asks_in_a_public_thread(walled) -> tuple[list[dict], Scope, str]:
    """A guest asks in C1's thread of the member's message, now summarized (compacted): the
    model searches the thread and expands its summary. The model's requests, the thread, the
    summary's id."""
    team = await team_memory(walled)
    thread = Scope(team, thread_id(team, "C1", ts(1)), "C1", Visibility.PUBLIC, "U1", "Ada")
    summary = await walled.world.runtime.harness.consolidator.compact(thread)
    assert summary is not None and summary.audience == "public"
    walled.world.model.script(
        tool_calls(
            call("search_conversations", {"query": "Zanzibar launch budget", "where": "thread"}),
            call("expand_summary", {"summary_id": summary.id}),
        ),
        text("It is 7 million."),
    )
    event = mention(QUESTION, ts(40), channel="C1", user=GUEST, thread_ts=ts(1))
    await walled.a.event(event, team=team)
    await walled.settle()
    return walled.world.model_requests(), thread, summary.id


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_a_guest_asking_in_a_public_thread_sees_that_thread(walled):
    requests, thread, summary_id = await guest_asks_in_a_public_thread(walled)
    context = requests[0]["messages"][1]["content"]
    assert summary_id in context  # the thread's own summary, as for anyone asking there
    searched, expanded = tool_results(requests[1])
    assert "7 million" in searched  # the thread's own older message, recalled
    assert expanded.startswith(f"[Summary ID: {summary_id}]")  # found, and shown
    assert "9 million" not in json.dumps(requests)  # the team's entity stays walled off
    audiences = {m.audience for m in await walled.memory.conversation.all(thread)}
    assert audiences == {"public", "private:C1"}  # the guest's turn stays in the channel


async def test_a_guest_expanding_their_thread_s_summary_sees_its_messages(walled):
    requests, _, _ = await guest_asks_in_a_public_thread(walled)
    _, expanded = tool_results(requests[1])
    assert "Original messages (1)" in expanded and "not shown here" not in expanded


async def test_a_member_expands_the_summary_of_a_guest_s_turn_in_their_thread(walled):
    """A guest's turn in a public thread is private to the channel, and so is a summary rolled
    from it; a member asking in that thread may still expand it (they can read the thread)."""
    team = await team_memory(walled)
    walled.world.model.script(text("Noted, Gus."))
    asked = mention("Gus here: our deadline is the ides of March", ts(2), channel="C1",
                    user=GUEST, thread_ts=ts(1))  # fmt: skip
    await walled.a.event(asked, team=team)
    await walled.settle()
    thread = thread_id(team, "C1", ts(1))
    guest = Scope(team, thread, "C1", Visibility.PRIVATE, GUEST, "Gus", walled=True)
    summary = await walled.world.runtime.harness.consolidator.compact(guest)
    assert summary is not None and summary.audience == "private:C1"
    walled.world.model.script(
        tool_calls(call("expand_summary", {"summary_id": summary.id})), text("The ides.")
    )
    before = len(walled.world.model_requests())
    event = mention("What deadline did Gus give?", ts(3), channel="C1", user="U2", thread_ts=ts(1))
    await walled.a.event(event, team=team)
    await walled.settle()
    [expanded] = tool_results(walled.world.model_requests()[before + 1])
    assert expanded.startswith(f"[Summary ID: {summary.id}]") and "ides of March" in expanded


async def test_a_channel_converted_to_private_is_stored_private(walled):
    team = f"T{time.time_ns()}"
    walled.world.model.script(text("first"), text("second"))
    await walled.a.event(mention("hello", ts(50), channel="C8"), team=team)
    await walled.settle()
    assert await stored(walled, team, "C8", ts(50)) == {"public"}
    walled.api.private_channels.add("C8")  # an admin converts the channel
    await walled.a.event(mention("hello again", ts(51), channel="C8"), team=team)
    await walled.settle()
    assert await stored(walled, team, "C8", ts(51)) == {"private:C8"}


async def test_when_slack_cannot_say_the_last_answer_stands_else_the_scope_is_walled(walled):
    team = await team_memory(walled)
    walled.world.model.script(*asks_team_memory() * 6)

    async def member_asks(event: dict) -> str:
        before = len(walled.world.model_requests())
        await walled.a.event(event, team=team)
        await walled.settle()
        return sent_to_model(walled, before)

    async def member_dm(n: int) -> str:
        return await member_asks(message(QUESTION, ts(n), channel="DU2", user="U2",
                                         channel_type="im"))  # fmt: skip

    async def member_mention(n: int) -> str:
        return await member_asks(mention(QUESTION, ts(n), channel="C1", user="U2"))

    walled.api.fail("users.info", "internal_error")  # a person Slack never described
    assert "7 million" not in await member_dm(60)
    assert "7 million" in await member_dm(61)  # described: a member
    walled.api.fail("users.info", "internal_error")
    assert "7 million" in await member_dm(62)  # as Slack last said
    walled.api.fail("conversations.info", "internal_error")  # a channel Slack never described
    assert "7 million" not in await member_mention(63)
    assert await stored(walled, team, "C1", ts(63)) == {"private:C1"}
    assert "7 million" in await member_mention(64)  # described: public
    assert await stored(walled, team, "C1", ts(64)) == {"public"}
    walled.api.fail("conversations.info", "internal_error")
    assert "7 million" in await member_mention(65)  # as Slack last said: not walled for good
    assert await stored(walled, team, "C1", ts(65)) == {"public"}


async def test_the_app_home_hides_the_saved_papers_from_a_guest(walled):
    team = f"T{time.time_ns()}"
    await add_paper(walled.memory, team)
    await walled.a.home_opened(user="U1", team=team)
    await walled.a.home_opened(user=GUEST, team=team)
    await walled.settle()

    def papers(user: str) -> str:
        blocks = walled.api.home_views[user]["blocks"]
        return json.dumps(blocks[blocks.index(
            {"type": "header", "text": {"type": "plain_text", "text": "Recently saved papers"}}
        ) + 1])  # fmt: skip

    assert PAPER.title in papers("U1")
    assert PAPER.title not in papers(GUEST) and "memory page" in papers(GUEST)
