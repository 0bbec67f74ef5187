"""What walled people (a guest, someone of another organisation: memory/scope.py) said in a
public channel is stored as that channel's private memory: whoever can read the channel sees it
(recall, watches, the memory page), nobody elsewhere. And a tool log named in a thread is read
by its audience only, not by the own-thread rule: it holds what a tool read across the team.

Through the Slack adapter over real HTTP, a real Redis and the scripted model
(tests/test_slack_walls.py's world)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import SlackDirectory
from adapters.slack import thread_id
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.tool_log import ToolLogEntry
from tests.support.scripted_openai import call, text, tool_calls
from tests.support.slack_api import MockSlackApi, mention
from tests.test_slack_walls import GUEST, sent_to_model, team_memory, ts, walled_world

DEADLINE = "the Okavango grant deadline is the ides of March"  # said by the guest in C1
SEEN_ELSEWHERE = "the Kalahari budget is 4 million"  # what a member's tool read elsewhere


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        yield env


async def guest_says_in_c1(walled) -> str:
    """The guest tells the bot something in public C1 (stored `private:C1`); the team."""
    team = f"T{time.time_ns()}"
    walled.world.model.script(text("Noted, Gus."))
    await walled.a.event(mention(f"Gus here: {DEADLINE}", ts(2), channel="C1", user=GUEST),
                         team=team)  # fmt: skip
    await walled.settle()
    scope = Scope(team, thread_id(team, "C1", ts(2)), "C1")
    stored = await walled.memory.conversation.all(scope)
    assert {m.audience for m in stored} == {"private:C1"}
    return team


async def member_asks(walled, team: str, channel: str, n: int) -> str:
    """A member asks about it in a new thread of `channel`, searching the team's memory; what
    the model was sent (recalled context and the search's results)."""
    walled.world.model.script(
        tool_calls(call("search_conversations", {"query": "Okavango grant deadline"})),
        text("I looked."),
    )
    before = len(walled.world.model_requests())
    asked = mention("When is the Okavango grant deadline?", ts(n), channel=channel, user="U2")
    await walled.a.event(asked, team=team)
    await walled.settle()
    return sent_to_model(walled, before)


async def test_a_member_recalls_what_a_guest_said_in_their_public_channel(walled):
    team = await guest_says_in_c1(walled)
    assert "ides of March" in await member_asks(walled, team, "C1", 3)
    assert "ides of March" not in await member_asks(walled, team, "C2", 4)


async def slash(walled, text: str, team: str, channel: str, user: str) -> str:
    response = await walled.a.command(
        "/watch", text, walled.api.response_url + f"{time.time_ns()}", team=team,
        channel=channel, user=user,
    )  # fmt: skip
    return json.loads(await response.text())["text"]


async def test_a_member_lists_and_removes_a_guest_s_watch_in_their_public_channel(walled):
    team = f"T{time.time_ns()}"
    store = walled.world.runtime.watches.store
    try:
        made = await slash(walled, "quokka sleep weekly", team, "C1", GUEST)
        assert made.startswith("Watching “quokka sleep”, weekly here"), made
        [watch] = await store.all(team)
        assert watch.audience == "private:C1"  # the guest's: the channel's private memory

        assert watch.id not in await slash(walled, "list", team, "C2", "U2")
        refused = await slash(walled, f"remove {watch.id}", team, "C2", "U2")
        assert refused.startswith(f"No watch `{watch.id}` posts here")
        assert watch.id in await slash(walled, "list", team, "C1", "U2")
        removed = await slash(walled, f"remove {watch.id}", team, "C1", "U2")
        assert removed.startswith("Stopped watching “quokka sleep”"), removed
        assert await store.all(team) == []
    finally:
        for left in await store.all(team):
            await store.remove(team, left.id)


async def test_a_guest_cannot_read_a_member_s_tool_log_named_in_their_thread(walled):
    """The agent names its tool logs in the thread when it runs out of steps (bot/agent.py): a
    guest asking there reads its summaries (`Scope.may_show`), never a member's tool log."""
    team = await team_memory(walled)
    thread = thread_id(team, "C1", ts(1))
    member = Scope(team, thread, "C1", Visibility.PUBLIC, "U1", "Ada")
    log_id = await walled.memory.tool_logs.write(member, ToolLogEntry(
        thread, "search_conversations", {"query": "Kalahari"}, SEEN_ELSEWHERE, "success",
        author="U1",
    ))  # fmt: skip

    async def reads_the_log(user: str, n: int) -> str:
        walled.world.model.script(
            tool_calls(call("read_tool_log", {"log_id": log_id})), text("Done.")
        )
        before = len(walled.world.model_requests())
        asked = mention(f"Read {log_id}", ts(n), channel="C1", user=user, thread_ts=ts(1))
        await walled.a.event(asked, team=team)
        await walled.settle()
        return sent_to_model(walled, before)

    guest_saw = await reads_the_log(GUEST, 5)
    assert f"No tool log with id '{log_id}'" in guest_saw and "4 million" not in guest_saw
    assert "4 million" in await reads_the_log("U2", 6)  # a member asking there reads it


# -- the memory page: who sees a public channel's private memory --------------------------------


@pytest.fixture
async def slack_api() -> AsyncIterator[MockSlackApi]:
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


async def test_the_memory_page_shows_a_public_channel_s_private_memory_to_its_people(slack_api):
    """Members of public C1 and a guest let into C1 see `private:C1` (what walled people said
    there); a member of public C2 only does not."""
    slack_api.users["U5"] = "Gus"
    slack_api.guests.add("U5")
    slack_api.members.update({"C1": {"U1", "U5"}, "C2": {"U2"}})
    directory = SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=slack_api.base_url))

    member = await directory.viewer("T1", "U1")
    assert member.can_see("private:C1") and member.can_see(PUBLIC)
    elsewhere = await directory.viewer("T1", "U2")
    assert elsewhere.can_see("private:C2") and not elsewhere.can_see("private:C1")
    guest = await directory.viewer("T1", "U5")
    assert guest.audiences == {"private:C1", "dm:DU5"}  # and still none of the team's memory
