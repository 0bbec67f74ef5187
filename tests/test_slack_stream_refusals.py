"""A streamed answer whose chat.appendStream Slack refuses for good (not in passing): the
stream is no longer appended to, the final edit shows the answer once. A stream the person
stopped (`stopped_by_user`) shows nothing more: no append, no edit, no post; the answer is
stored all the same."""

from __future__ import annotations

import time

import pytest

from tests.support.scripted_openai import text
from tests.support.slack_api import SlackError, mention
from tests.test_slack import slack_world, ts
from tests.test_slack_delivery_failures import answered, retried_soon, stored
from tests.test_slack_stream_passing_errors import ANSWER, shown_once_in_the_stream


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:  # every delta may update: the tests drive the pace
            instance.adapter.pipeline.platform.update_every = 0.0
        retried_soon(env)
        yield env


@pytest.mark.parametrize("error", ["invalid_auth", "channel_not_found"])
async def test_an_append_refused_for_good_is_not_tried_again(slack, error):
    team = f"T{time.time_ns()}"
    slack.api.fail("chat.appendStream", error, times=1_000)
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(1)), team=team)
    await answered(slack, 1, [ANSWER])
    assert len(slack.api.of("chat.appendStream")) == 1  # not again with every piece
    shown_once_in_the_stream(slack, 1)  # stopped, then edited with the whole answer
    assert await stored(slack, team, 1) == ["tell me", ANSWER]


@pytest.mark.parametrize("when", ["appending", "stopping"])
async def test_a_stream_the_person_stopped_shows_nothing_more(slack, when):
    """The person stops the stream while it grows (its third append refused) or just before
    the bot stops it: Slack ends it, and the bot neither appends, edits nor posts again."""
    team, api, answer = f"T{time.time_ns()}", slack.api, slack.api._answer
    appends: list[dict] = []

    def stopped_by_the_person(method, params):
        message = api.messages.get(params.get("ts") or "")
        if method == "chat.appendStream":
            appends.append(params)
        ends = method == "chat.stopStream" if when == "stopping" else len(appends) == 3
        if message is not None and message.streaming and ends:
            message.streaming = False  # Slack ended it; the bot is told so from now on
        if message is not None and not message.streaming and method.endswith("Stream"):
            raise SlackError("stopped_by_user")
        return answer(method, params)

    api._answer = stopped_by_the_person
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(2)), team=team)
    await slack.settle()
    refused = 1 if when == "appending" else 0  # the append the stop refused
    shown = "".join(p["markdown_text"] for p in appends[: len(appends) - refused])
    assert api.thread_texts("C1", ts(2)) == [shown]  # what was streamed before the stop
    if when == "appending":
        assert len(appends) == 3  # none after the one Slack refused
    assert api.of("chat.update") == []
    assert api.of("chat.postMessage") == []
    assert api.of("assistant.threads.setStatus")[-1]["status"] == ""  # cleared all the same
    assert await stored(slack, team, 2) == ["tell me", ANSWER]
