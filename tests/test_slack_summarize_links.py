"""`/summarize <thread link>` of another channel than the one it is used in: its summary is
the person's to read (the own-thread rule), so only a member of that channel who is not walled
off the team's memory gets it (users.conversations). Over real HTTP to a mock Web API.
"""

from __future__ import annotations

import time

import pytest

from adapters.slack import thread_id
from adapters.slack_summarize import CHECKING, NOT_A_MEMBER, SUMMARIZING
from memory.scope import Scope
from tests.support.scripted_openai import text
from tests.support.slack_api import mention
from tests.test_slack_walls import GUEST, ts, walled_world


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        env.api.private_channels.add("C3")
        env.api.members.update({"C1": {"U1", "U2"}, "C3": {"U1"}, "C9": {"U2", GUEST}})
        yield env


async def a_thread(env, team: str, channel: str, n: int) -> str:
    """Ada's thread with the bot in `channel`, under message `n`; its link."""
    env.world.model.script(text(f"The budget in {channel} is 7 million."))
    await env.a.event(mention("What is the budget?", ts(n), channel=channel, user="U1"), team=team)
    await env.settle()
    return f"https://x.slack.com/archives/{channel}/p{ts(n).replace('.', '')}"


async def summarize(env, team: str, link: str, channel: str, user: str, answer: str) -> list[str]:
    """Run `/summarize <link>` in `channel` as `user`: what they are told (the command's answer
    says it is being checked; what follows comes to its response_url)."""
    response = await env.a.command(
        "/summarize", link, env.api.response_url + answer, team=team, channel=channel, user=user
    )
    assert await response.text() == CHECKING
    await env.settle()
    await env.api.response(answer)
    return [post["text"] for post in env.api.responded[answer]]


async def summaries(env, team: str, channel: str, n: int) -> int:
    scope = Scope(team, thread_id(team, channel, ts(n)), channel)
    return len(await env.memory.summaries.for_thread(scope))


async def test_a_guest_may_not_summarize_a_thread_of_another_channel(walled):
    team = f"T{time.time_ns()}"
    link = await a_thread(walled, team, "C1", 1)
    told = await summarize(walled, team, link, "C9", GUEST, "guest")  # in C9 only
    assert told == [NOT_A_MEMBER]
    walled.api.members["C1"].add(GUEST)  # in C1 too, but walled: C9's threads only
    assert await summarize(walled, team, link, "C9", GUEST, "guest-in-c1") == [NOT_A_MEMBER]
    assert await summaries(walled, team, "C1", 1) == 0
    assert walled.api.thread_texts("C1", ts(1)) == ["The budget in C1 is 7 million."]


async def test_a_member_may_not_summarize_a_private_channel_they_are_not_in(walled):
    team = f"T{time.time_ns()}"
    link = await a_thread(walled, team, "C3", 2)
    assert await summarize(walled, team, link, "C1", "U2", "grace") == [NOT_A_MEMBER]
    assert await summaries(walled, team, "C3", 2) == 0
    assert walled.api.thread_texts("C3", ts(2)) == ["The budget in C3 is 7 million."]


async def test_a_member_summarizes_a_thread_of_another_channel_they_are_in(walled):
    team = f"T{time.time_ns()}"
    link = await a_thread(walled, team, "C3", 3)
    assert await summarize(walled, team, link, "C1", "U1", "ada") == [SUMMARIZING]
    assert walled.api.thread_texts("C3", ts(3))[-1].startswith("Stored as [Summary ID: sum_")
    assert await summaries(walled, team, "C3", 3) == 1
    # Grace, in C1 and C9, asks from C9 for C1's thread
    link = await a_thread(walled, team, "C1", 4)
    assert await summarize(walled, team, link, "C9", "U2", "grace") == [SUMMARIZING]
    assert walled.api.thread_texts("C1", ts(4))[-1].startswith("Stored as [Summary ID: sum_")
