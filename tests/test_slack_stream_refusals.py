"""A streamed answer whose chat.appendStream Slack refuses for good (not in passing): the
stream is no longer appended to, the final edit shows the answer once. A stream the person
stopped (`stopped_by_user`) shows nothing more: no append, no edit, no part, no post, a
re-run's neither; the answer is stored all the same. A stream that showed none of the answer
(nothing appended, or its appends refused) hides nothing when stopped: the answer is edited in."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import thread_id
from adapters.slack_delivery import STILL_WORKING, SlackPlatform, SlackStatus
from adapters.spine import GAVE_UP_UNSAVED, MAX_ATTEMPTS, Job
from memory.scope import Scope
from tests.support.scripted_openai import text
from tests.support.slack_api import MockSlackApi, SlackError, mention
from tests.test_slack import slack_world, ts
from tests.test_slack_delivery_failures import answered, retried_soon, stored
from tests.test_slack_stream_passing_errors import ANSWER, shown_once_in_the_stream
from tests.test_turn_recovery import until

LONG_ANSWER = ("A streamed answer " * 1000).strip()  # two parts


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:  # every delta may update: the tests drive the pace
            instance.adapter.pipeline.platform.update_every = 0.0
        retried_soon(env)
        yield env


def the_person_stops(api: MockSlackApi, when: str) -> list[dict]:
    """The person stops the stream while it grows (its third append refused) or just before
    the bot stops it ("stopping"): Slack ends it, and refuses every stream call after with
    `stopped_by_user`. Returns the appends Slack was sent."""
    answer, appends = api._answer, []

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
    return appends


# errors Slack documents for chat.appendStream alone (its chunks), not for a stop or an edit
@pytest.mark.parametrize("error", ["invalid_chunks", "invalid_metadata_format"])
async def test_an_append_refused_for_good_is_not_tried_again(slack, error):
    team = f"T{time.time_ns()}"
    slack.api.fail("chat.appendStream", error, times=1_000)
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(1)), team=team)
    await answered(slack, 1, [ANSWER])
    assert len(slack.api.of("chat.appendStream")) == 1  # not again with every piece
    shown_once_in_the_stream(slack, 1)  # stopped, then edited with the whole answer
    assert await stored(slack, team, 1) == ["tell me", ANSWER]


async def test_an_append_refused_by_a_page_not_slacks_is_tried_again():
    """A 4xx page that is not Slack's answer (a proxy's: not JSON, no error code) says
    nothing of the stream: the next piece is appended all the same."""
    platform = SlackPlatform(AsyncWebClient(token="xoxb-test"))
    platform.update_every = 0.0
    job = Job("turn", Scope("T1", "t"), reply={"channel": "C1", "thread_ts": ts(7)})
    status = SlackStatus(platform, job, ts(8), streaming=True)
    appends: list[dict] = []

    async def a_proxy_page(**params):  # slack_sdk leaves aiohttp's response in the error
        appends.append(params)
        raise SlackApiError("not JSON", SimpleNamespace(status=403, headers={}))

    platform.client.chat_appendStream = a_proxy_page
    await status.delta("A streamed ")
    await status.delta("answer")
    assert [p["markdown_text"] for p in appends] == ["A streamed ", "A streamed answer"]
    assert not status.refused


@pytest.mark.parametrize("when", ["appending", "stopping"])
async def test_a_stream_the_person_stopped_shows_nothing_more(slack, when):
    """The person stops the stream while it grows (its third append refused) or just before
    the bot stops it: Slack ends it, and the bot neither appends, edits nor posts again."""
    team, api = f"T{time.time_ns()}", slack.api
    appends = the_person_stops(api, when)
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


async def test_a_stopped_stream_gets_no_more_parts(slack):
    team, api = f"T{time.time_ns()}", slack.api
    appends = the_person_stops(api, "stopping")
    slack.world.model.script(text(LONG_ANSWER))
    await slack.a.event(mention("tell me", ts(4)), team=team)
    await slack.settle()
    assert api.thread_texts("C1", ts(4)) == ["".join(p["markdown_text"] for p in appends)]
    assert api.of("chat.postMessage") == []  # not the second part either
    assert api.of("chat.update") == []
    assert await stored(slack, team, 4) == ["tell me", LONG_ANSWER]


async def test_a_stream_stopped_while_the_bot_failed_to_stop_it_stays_so(slack):
    """The person stops the stream as the bot's own stop fails in passing: the job runs
    again, and that run leaves the message as the person stopped it too."""
    team, api = f"T{time.time_ns()}", slack.api
    appends = the_person_stops(api, "stopping")
    api.fail("chat.stopStream", "internal_error")
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(5)), team=team)
    await until(lambda: len(api.of("chat.stopStream")) >= 2)  # the run again's stop
    await slack.settle()
    assert api.thread_texts("C1", ts(5)) == ["".join(p["markdown_text"] for p in appends)]
    assert api.of("chat.update") == []  # neither "Still working on this…" nor the answer
    assert api.of("chat.postMessage") == []
    assert await stored(slack, team, 5) == ["tell me", ANSWER]


@pytest.mark.parametrize("showing", ["refused", "nothing appended"])
async def test_a_stream_stopped_without_the_answer_shows_it_all_the_same(slack, showing):
    """A stream frozen (its appends refused) or still empty, stopped by the person: the stop
    hides nothing of the answer, which the final edit shows."""
    team, api = f"T{time.time_ns()}", slack.api
    the_person_stops(api, "stopping")
    if showing == "refused":
        api.fail("chat.appendStream", "invalid_chunks", times=1_000)
    else:
        for instance in slack.instances:  # no update before the answer is out
            instance.adapter.pipeline.platform.update_every = 3600.0
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(6)), team=team)
    await answered(slack, 6, [ANSWER])
    shown_once_in_the_stream(slack, 6)
    assert await stored(slack, team, 6) == ["tell me", ANSWER]


def a_job(slack, team: str, n: int) -> Job:
    """A turn in the thread under message `n`, run by hand (a run that dies, a re-run)."""
    slack.api.knows(ts(n))
    scope = Scope(team, thread_id(team, "C1", ts(n)), channel="C1", user="U1")
    return Job("turn", scope, "tell me", reply={"channel": "C1", "thread_ts": ts(n)})


async def test_a_rerun_shows_its_new_answer_though_the_dead_runs_stream_was_stopped(slack):
    """The run died before appending anything; the person stopped its stream meanwhile: the
    re-run computes an answer no one stopped, and edits it in after "Still working…"."""
    api, pipeline = slack.api, slack.instances[0].adapter.pipeline
    job = a_job(slack, f"T{time.time_ns()}", 10)
    slack.world.model.script(text("never seen", delay=30), text(ANSWER))
    first = asyncio.create_task(pipeline.run(job))  # the process dies mid-turn
    while "placeholder" not in job.progress or not slack.world.model_requests():
        await asyncio.sleep(0.02)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    assert job.progress["stream"] and api.of("chat.appendStream") == []
    the_person_stops(api, "stopping")  # the re-run's stop meets the person's
    await pipeline.run(job)
    assert api.thread_texts("C1", ts(10)) == [ANSWER]
    edits = [p["text"] for p in api.of("chat.update")]
    assert edits[0] == STILL_WORKING and edits[-1] == ANSWER


async def test_a_turn_given_up_after_the_person_stopped_its_stream_says_so(slack):
    """The person stopped the stream as it grew, then its runs kept dying: the job given up
    says so below the stopped stream, which stays as they stopped it."""
    team, api = f"T{time.time_ns()}", slack.api
    pipeline, job = slack.instances[0].adapter.pipeline, a_job(slack, team, 11)
    appends = the_person_stops(api, "appending")
    async with pipeline.platform.working(job) as status:  # the first run, which dies
        for piece in ("A ", "streamed ", "answer ", "never shown"):
            await status.delta(piece)
    assert status.stopped and len(appends) == 3
    job.progress["attempts"] = MAX_ATTEMPTS  # and the runs after it died too
    await pipeline.run(job)
    assert api.thread_texts("C1", ts(11)) == ["A streamed ", GAVE_UP_UNSAVED]
    assert api.of("chat.update") == []  # the stopped stream left as it is


async def test_a_rerun_of_a_stopped_long_answer_posts_no_later_part(slack):
    """The person stopped a long answer's stream; the run died before its second part: the
    re-run (the stop known from the job's progress) posts it no more than the first run."""
    team, api = f"T{time.time_ns()}", slack.api
    pipeline, job = slack.instances[0].adapter.pipeline, a_job(slack, team, 12)
    appends = the_person_stops(api, "stopping")
    slack.world.model.script(text(LONG_ANSWER))
    await pipeline.run(job)
    assert job.progress["stopped"] and job.progress["parts"] == 2
    job.progress["sent"] = 1  # as if the run died before the second part
    await pipeline.run(job)
    assert api.thread_texts("C1", ts(12)) == ["".join(p["markdown_text"] for p in appends)]
    assert api.of("chat.postMessage") == []
    assert api.of("chat.update") == []


@pytest.mark.parametrize("showing", ["refused", "nothing appended"])
async def test_a_stream_stopped_without_the_answer_as_the_bot_failed_to_stop_it(slack, showing):
    """A stream that showed none of the answer (its appends refused, or none made), the bot's
    stop failing in passing, the person stopping it meanwhile: the re-run edits it in."""
    team, api = f"T{time.time_ns()}", slack.api
    the_person_stops(api, "stopping")  # the re-run's stop meets the person's
    api.fail("chat.stopStream", "internal_error")
    if showing == "refused":
        api.fail("chat.appendStream", "invalid_chunks", times=1_000)
    else:
        for instance in slack.instances:  # no update before the answer is out
            instance.adapter.pipeline.platform.update_every = 3600.0
    slack.world.model.script(text(ANSWER))
    await slack.a.event(mention("tell me", ts(13)), team=team)
    await answered(slack, 13, [ANSWER])
    assert len(api.of("chat.stopStream")) == 2
    shown_once_in_the_stream(slack, 13)
    assert await stored(slack, team, 13) == ["tell me", ANSWER]
