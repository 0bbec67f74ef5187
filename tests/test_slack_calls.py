"""How often the Slack adapter asks Slack about channels and people (adapters/slack_walls.py):
once per channel or person however many events need the answer at the same moment, not
again before a rate limit's Retry-After, never for talk the bot takes no part in, and only
after a command has its answer. Over real HTTP to a mock Web API that records every call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import text
from tests.support.slack_api import file_share, mention, message
from tests.test_shared_pdfs import shared_world
from tests.test_slack_walls import stored, ts, walled_world

ASKED = ("conversations.info", "users.info")


@pytest.fixture
async def cached(redis_url, tmp_path):
    """A bot process that keeps Slack's answers for five minutes, as in production."""
    async with walled_world(redis_url, tmp_path, cache_seconds=300) as env:
        yield env


@pytest.fixture
async def uncached(redis_url, tmp_path):
    """A bot process that keeps no answer: every event would ask Slack again."""
    async with walled_world(redis_url, tmp_path) as env:
        yield env


@pytest.fixture
async def files_env(redis_url, tmp_path):
    async with shared_world(redis_url, tmp_path) as env:
        yield env


async def until(condition: Callable[[], bool], up_to: float = 1.0) -> None:
    """Wait for `condition`, at most `up_to` seconds (by default less than the adapter's 2 s
    per ask); it does not fail the test."""
    deadline = time.monotonic() + up_to
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def calls(env, method: str, **params: str) -> int:
    return sum(all(c.get(k) == v for k, v in params.items()) for c in env.api.of(method))


async def test_a_burst_of_events_asks_slack_once_per_channel_and_person(cached):
    """Events that all need an answer Slack has not given yet (a first time, or after its
    five minutes): one conversations.info and one users.info, shared by all of them."""
    team, burst = f"T{time.time_ns()}", 5
    cached.world.model.script(*(text(f"answer {n}") for n in range(burst)))
    cached.api.hold(*ASKED)  # a slow Slack: every event arrives while the first asks
    sent = [
        asyncio.create_task(cached.a.event(mention("hi", ts(100 + n), user="U2"), team=team))
        for n in range(burst)
    ]
    # the first event asks (held); a moment for the others to arrive and wait for its answer,
    # well within the adapter's 2 s per ask even on a stalled event loop
    await until(lambda: calls(cached, "conversations.info") >= 1, up_to=10)
    await asyncio.sleep(0.2)
    cached.api.release()
    await asyncio.gather(*sent)
    await cached.settle()
    assert calls(cached, "conversations.info") == calls(cached, "users.info") == 1
    for n in range(burst):  # every event was answered, with the one answer Slack gave
        assert len(cached.api.thread_texts("C1", ts(100 + n))) == 1
        assert await stored(cached, team, "C1", ts(100 + n)) == {"public"}


async def test_a_rate_limit_is_waited_out_before_asking_again(uncached):
    """A 429's Retry-After: not asked again before it; the last answer stands meanwhile, and
    with none, the channel is private and the person walled (stored private to the channel)."""
    team = f"T{time.time_ns()}"
    uncached.world.model.script(*(text(f"answer {n}") for n in range(5)))
    await uncached.a.event(mention("hi", ts(110), channel="C1", user="U2"), team=team)
    await uncached.settle()
    for method in ASKED:
        uncached.api.rate_limit(method, times=10, retry_after=60)
    for n in (111, 112):
        await uncached.a.event(mention("hi", ts(n), channel="C1", user="U2"), team=team)
        await uncached.settle()
        assert await stored(uncached, team, "C1", ts(n)) == {"public"}  # as Slack last said
    assert calls(uncached, "conversations.info", channel="C1") == 2  # answered, then the 429
    assert calls(uncached, "users.info", user="U2") == 2

    for n in (113, 114):  # a channel and a person Slack never described
        await uncached.a.event(mention("hi", ts(n), channel="C2", user="U1"), team=team)
        await uncached.settle()
        assert await stored(uncached, team, "C2", ts(n)) == {"private:C2"}
    # Slack's limit is the method's, for the whole workspace: no other key asks meanwhile
    assert calls(uncached, "conversations.info", channel="C2") == 0
    assert calls(uncached, "users.info", user="U1") == 0


async def test_talk_in_a_thread_the_bot_never_joined_asks_slack_nothing(uncached):
    team = f"T{time.time_ns()}"
    chat = message("lunch at noon?", ts(121), channel="C1", user="U2", thread_ts=ts(120))
    await uncached.a.event(chat, team=team)
    await uncached.settle()
    assert uncached.world.model_requests() == []
    assert [calls(uncached, method) for method in ASKED] == [0, 0]

    # the same in a thread the bot answers in: asked, and answered
    uncached.world.model.script(text("joined"), text("noon it is"))
    await uncached.a.event(mention("hello", ts(122), channel="C1", user="U2"), team=team)
    await uncached.a.event(message("lunch at noon?", ts(123), channel="C1", user="U2",
                                   thread_ts=ts(122)), team=team)  # fmt: skip
    await uncached.settle()
    assert uncached.api.thread_texts("C1", ts(122)) == ["joined", "noon it is"]


async def test_a_pdf_shared_in_a_thread_the_bot_never_joined_asks_slack_nothing(files_env):
    team = f"T{time.time_ns()}"
    pdf = files_env.api.add_file("paper.pdf", make_pdf())
    share = file_share([pdf], ts(131), channel="C1", user="U2", thread_ts=ts(130))
    await files_env.slack.event(share, team=team)
    await files_env.settle()
    assert files_env.api.downloads == []
    assert [calls(files_env, method) for method in ASKED] == [0, 0]
