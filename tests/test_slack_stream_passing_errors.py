"""A streamed answer through Slack failing in passing (its own error, a proxy's 5xx page, a
dropped connection) on chat.appendStream or chat.stopStream: the stream stays one and is
stopped, the answer shows once, in it, and no edit Slack refuses is sent."""

from __future__ import annotations

import time

import pytest

from tests.support.scripted_openai import text
from tests.support.slack_api import mention
from tests.test_slack import slack_world, ts
from tests.test_slack_delivery_failures import answered, retried_soon, stored

ANSWER = ("A streamed answer " * 60).strip()


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:  # every delta may update: the tests drive the pace
            instance.adapter.pipeline.platform.update_every = 0.0
        retried_soon(env)
        yield env


def fail(slack, method: str, failure: str, done: bool = False) -> None:
    """The next call of `method` fails in passing (slack_sdk tries a dropped one twice)."""
    if failure == "dropped":
        slack.api.drop(method, times=2)
    elif failure == "garbled":
        slack.api.garble(method)
    else:
        slack.api.fail(method, failure, done=done)


def shown_once_in_the_stream(slack, n: int) -> None:
    """The answer is the thread's one message: the stream, stopped, edited once."""
    [started] = [p for p in slack.api.of("chat.startStream") if p["thread_ts"] == ts(n)]
    assert not slack.api.messages[started["_ts"]].streaming
    assert slack.api.of("chat.postMessage") == []  # never posted anew
    answers = [p for p in slack.api.of("chat.update") if p["text"] == ANSWER]
    assert [p["ts"] for p in answers] == [started["_ts"]]


@pytest.mark.parametrize("failure", ["internal_error", "garbled"])
async def test_an_append_failing_in_passing_keeps_streaming(slack, failure):
    team = f"T{time.time_ns()}"
    fail(slack, "chat.appendStream", failure)
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(1)), team=team)
    await answered(slack, 1, [ANSWER])
    shown_once_in_the_stream(slack, 1)
    assert len(slack.api.of("chat.appendStream")) > 2  # the stream grew on after the failure
    assert len(slack.api.of("chat.update")) == 1  # no edits of a stream Slack refuses
    assert await stored(slack, team, 1) == ["tell me", ANSWER]


@pytest.mark.parametrize(
    ("failure", "done"), [("internal_error", False), ("internal_error", True), ("dropped", False)]
)
async def test_a_stop_failing_in_passing_is_stopped_by_the_run_again(slack, failure, done):
    """`done`: Slack stopped the stream despite its error (the run again is told it is no
    longer streaming)."""
    team = f"T{time.time_ns()}"
    fail(slack, "chat.stopStream", failure, done)
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(2)), team=team)
    await answered(slack, 2, [ANSWER])
    shown_once_in_the_stream(slack, 2)
    assert len(slack.api.of("chat.stopStream")) >= 2  # tried again by the run again
    assert len(slack.world.model_requests()) == 1  # the answer kept, not asked for again
    assert await stored(slack, team, 2) == ["tell me", ANSWER]
