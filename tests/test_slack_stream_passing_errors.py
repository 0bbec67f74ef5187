"""A streamed answer through Slack failing in passing on chat.appendStream (its own error, a
proxy's 502 page) or chat.stopStream (its own error, a dropped connection): the stream stays
one and is stopped, the answer shows once, in it, and no edit Slack refuses is sent. A stop that
fails on every run is let be on the last: the answer is posted anew, never lost. A stream
Slack ended meanwhile is edited, not stopped."""

from __future__ import annotations

import time

import pytest

from adapters.spine import GAVE_UP, RETRY_BACKOFF
from tests.support.scripted_openai import text
from tests.support.slack_api import mention
from tests.test_slack import slack_world, ts
from tests.test_slack_delivery_failures import answered, retried_soon, stored
from tests.test_turn_recovery import until

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


async def test_a_stop_failing_on_every_run_posts_the_answer_anew(slack):
    """Slack failing every stop (down for a while): the last run lets the stream be and posts
    the answer anew (a duplicate beats an answer lost), not "I tried several times"."""
    for instance in slack.instances:
        instance.adapter.pipeline.retry_pause = 0.02  # the pauses keep their growth
    team = f"T{time.time_ns()}"
    slack.api.fail("chat.stopStream", "internal_error", times=100)
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(3)), team=team)
    await until(lambda: [p for p in slack.api.of("chat.postMessage") if p["text"] == ANSWER])
    await slack.settle()
    texts = slack.api.thread_texts("C1", ts(3))
    assert texts[-1] == ANSWER
    assert not [t for t in texts if GAVE_UP in t]
    assert len(slack.api.of("chat.stopStream")) == 1 + len(RETRY_BACKOFF)  # tried every run
    assert len(slack.world.model_requests()) == 1
    assert await stored(slack, team, 3) == ["tell me", ANSWER]


async def test_a_stream_slack_ended_is_edited_not_stopped(slack):
    """Slack ends the stream (idle) mid-answer: the appends after it are refused, the answer
    edited in, and no stop is sent (it could only fail, in passing at worst)."""
    team, api, answer = f"T{time.time_ns()}", slack.api, slack.api._answer
    appends = []

    def ended_after_two(method, params):
        if method == "chat.appendStream":
            appends.append(params)
            if len(appends) == 3:
                api.messages[params["ts"]].streaming = False
        return answer(method, params)

    api._answer = ended_after_two
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(4)), team=team)
    await answered(slack, 4, [ANSWER])
    [started] = api.of("chat.startStream")
    assert api.of("chat.stopStream") == []
    assert api.of("chat.postMessage") == []
    assert api.of("chat.update")[-1]["ts"] == started["_ts"]
    assert await stored(slack, team, 4) == ["tell me", ANSWER]
