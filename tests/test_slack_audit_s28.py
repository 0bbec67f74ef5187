"""Slack away for a while, and memory away while a message is taken: a job Slack fails in
passing runs again after a growing pause (RETRY_BACKOFF) before it is given up, and the given
up reply says whether the message was saved; a PDF shared with the bot while memory is down
is told so on Slack's first delivery; a mention whose listener failed after queueing joins
its thread on Slack's retry.

Through the Slack adapter over real HTTP, the local Slack Web API, a real Redis."""

from __future__ import annotations

import asyncio
import time

from adapters.slack import thread_id
from adapters.slack_delivery import THREAD_GONE_NOTICE
from adapters.spine import GAVE_UP_UNSAVED, MAX_ATTEMPTS, NOT_SHOWN, NOT_TAKEN, RETRY_BACKOFF
from memory.scope import Scope
from tests import test_slack_delivery_failures
from tests.support.redis_gate import RedisGate
from tests.support.scripted_openai import text
from tests.support.slack_api import mention
from tests.test_shared_pdfs import shared_pdf, shared_world
from tests.test_slack import slack_world, ts
from tests.test_slack_delivery_failures import answered, retried_soon, stored
from tests.test_turn_recovery import until

slack = test_slack_delivery_failures.slack  # its fixture: two instances, only final edits


def paused_briefly(slack) -> None:
    """Each run again comes soon, the pauses keeping their growth (RETRY_BACKOFF)."""
    retried_soon(slack)
    for instance in slack.instances:
        instance.adapter.pipeline.retry_pause = 0.02


async def test_slack_down_for_more_runs_than_a_crash_allows_still_answers(slack):
    """Every run while Slack is out fails to show the placeholder: those runs pause, they do
    not count as a job that kills its process (given up after MAX_ATTEMPTS)."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    paused_briefly(slack)
    assert len(RETRY_BACKOFF) > MAX_ATTEMPTS
    slack.api.fail("chat.postMessage", "service_unavailable", times=len(RETRY_BACKOFF))
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(1)), team=team)
    await answered(slack, 1, ["The answer"])
    assert await stored(slack, team, 1) == ["tell me", "The answer"]


async def test_an_answer_slack_cannot_take_for_a_while_is_delivered(slack):
    """The answer is computed once; its delivery fails through more runs than MAX_ATTEMPTS,
    then goes out (not the failure reply)."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    paused_briefly(slack)
    # the final edit, and each run again's edits (its placeholder shown working, then the
    # answer): Slack out for the runs of all the pauses but the last
    slack.api.fail("chat.update", "internal_error", times=2 * len(RETRY_BACKOFF) - 1)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(3)), team=team)
    await answered(slack, 3, ["The answer"])
    assert len(slack.world.model_requests()) == 1


async def test_a_pdf_shared_in_a_dm_while_memory_is_down_is_told_once(redis_url, tmp_path):
    """Slack's first delivery tells the person, as a text message is told; its retries do
    not tell them again."""
    gate = RedisGate(redis_url)
    async with shared_world(await gate.start(), tmp_path) as env:
        team = f"T{time.time_ns()}"
        pdf = env.api.add_file("notes.pdf", shared_pdf("Notes on Quokkas"))
        event = {
            "type": "message", "subtype": "file_share", "text": "", "files": [pdf],
            "user": "U1", "ts": ts(20), "channel": "D7", "channel_type": "im", "event_ts": ts(20),
        }  # fmt: skip
        gate.cut()
        try:
            first = await env.slack.event(event, team=team, event_id="EvShare")
            again = await env.slack.event(event, team=team, event_id="EvShare", retry=1)
        finally:
            gate.mend()
        assert (first.status, again.status) == (503, 503)  # Slack sends it again
        assert env.api.thread_texts("D7", None) == [NOT_TAKEN]
    await gate.close()


async def test_a_mention_whose_listener_failed_after_queueing_joins_on_the_retry(
    redis_url, tmp_path
):
    """Memory goes away between queueing the mention and joining its thread: Slack's retry
    finds the job queued, and joins the thread all the same (not only its early join, gone
    within a minute), so follow-ups without a mention are answered."""
    gate = RedisGate(redis_url)
    async with slack_world(await gate.start(), tmp_path) as env:
        team = f"T{time.time_ns()}"
        retried_soon(env)
        env.world.model.script(text("The answer"))
        gate.hold(b"last-thread")  # the join, after the job is queued
        asked = mention("tell me", ts(4))
        first = asyncio.create_task(env.a.event(asked, team=team, event_id="EvJoin"))
        await gate.held.wait()
        gate.cut()
        assert (await first).status == 503
        gate.mend()
        again = await env.a.event(asked, team=team, event_id="EvJoin", retry=1)
        assert again.status == 200
        presence = env.world.runtime.memory.presence
        thread = Scope(team, thread_id(team, "C1", ts(4)))
        assert await presence.joining(thread) is False  # joined, not only early
        await until(lambda: env.api.thread_texts("C1", ts(4)) == ["The answer"])
    await gate.close()


async def test_a_notice_its_channel_refuses_goes_to_the_person_in_a_dm(slack):
    """The channel is archived: the placeholder and the notice there are refused; the person
    is told in a DM with the bot, which names the channel."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    slack.api.fail("chat.postMessage", "is_archived", times=2)  # the placeholder, the notice
    await slack.a.event(mention("tell me", ts(5)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(5)) == []
    dm = slack.api.dm_channel("U1")
    assert slack.api.thread_texts(dm, None) == [f"About your message in <#C1>: {NOT_SHOWN}"]
    assert slack.world.model_requests() == []


async def test_a_thread_gone_with_the_persons_own_message_is_not_told(slack):
    """The thread the mention started is gone: the person deleted their message, so nothing
    is said (as for a message deleted before it was answered), not in the channel either."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    slack.api.fail("chat.postMessage", "thread_not_found", times=2)
    await slack.a.event(mention("tell me", ts(6)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(6)) == []
    assert slack.api.thread_texts("C1", None) == []


async def test_a_notice_its_thread_refuses_goes_to_the_channel(slack):
    """A reply in someone else's thread, gone: the person is told in the channel, in words
    for that case (not NOT_SHOWN's "could not post here")."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    slack.api.fail("chat.postMessage", "thread_not_found", times=2)
    await slack.a.event(mention("tell me", ts(10), thread_ts=ts(9)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(9)) == []
    assert slack.api.thread_texts("C1", None) == [f"<@U1> {THREAD_GONE_NOTICE}"]


async def test_a_slack_api_not_listening_gives_the_job_up_in_the_end(slack, caplog):
    """Slack's connection refused is Slack's, not the memory down (memory/errors.py): the job
    runs again after its pauses, then is given up (the given-up notice tried, refused too),
    not retried for ever."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    paused_briefly(slack)
    slack.world.model.script(text("The answer"))  # the channel's walls known (cached)
    await slack.a.event(mention("tell me", ts(8)), team=team)
    await answered(slack, 8, ["The answer"])
    await slack.api.close()  # nothing listens at the Web API's address any more
    await slack.a.event(mention("tell me", ts(7)), team=team)
    thread = Scope(team, thread_id(team, "C1", ts(7)))
    turns = slack.world.runtime.memory.turns
    for _ in range(1200):  # slack_sdk tries each call again after a second: a minute at most
        if thread not in await turns.busy("slack"):
            break
        await asyncio.sleep(0.05)
    assert thread not in await turns.busy("slack")
    assert "could not tell the person" in caplog.text
    assert GAVE_UP_UNSAVED[:60] in caplog.text
