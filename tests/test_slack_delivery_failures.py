"""Slack failing around an answer: a passing error (Slack's own, or the network) runs the job
again until it is answered or given up; blocks Slack refuses go as plain text; a status or a
stream Slack cannot start does not stop the turn; a first Socket Mode delivery is no retry."""

from __future__ import annotations

import time

import pytest
from slack_bolt.adapter.socket_mode.async_internals import run_async_bolt_app
from slack_bolt.adapter.socket_mode.internals import build_headers
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.socket_mode.request import SocketModeRequest

from adapters.slack import slack_retry
from adapters.slack_delivery import MARKDOWN_LIMIT
from adapters.spine import FAILURE, GAVE_UP_UNSAVED, NOT_TAKEN, RETRY_BACKOFF
from memory.redis_server import EmbeddedRedis
from tests.conftest import free_port, redis_options
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, mention
from tests.test_slack import slack_world, thread, ts
from tests.test_turn_recovery import until


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:
            instance.adapter.pipeline.platform.update_every = 3600.0  # only final edits
        yield env


def retried_soon(slack) -> None:
    """A job left queued runs again within a few seconds, not after 15 s. The lease (renewed
    every second) outlasts an event loop stalled on a loaded machine: a shorter one lets the
    other instance take the thread over from a live run and run the job twice."""
    for instance in slack.instances:
        instance.adapter.pipeline.lease_ms, instance.adapter.pipeline.recover_every = 3000, 0.1


async def answered(slack, n: int, texts: list[str]) -> None:
    await until(lambda: slack.api.thread_texts("C1", ts(n)) == texts)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(n)) == texts


async def stored(slack, team: str, n: int) -> list[str]:
    memory = slack.world.runtime.memory
    return [m.content for m in await memory.conversation.all(thread(team, ts(n)))]


@pytest.mark.parametrize("failure", ["internal_error", "dropped"])
async def test_a_passing_failure_of_the_placeholder_runs_the_job_again(slack, failure):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    if failure == "dropped":  # slack_sdk tries a dropped connection twice
        slack.api.drop("chat.postMessage", times=2)
    else:
        slack.api.fail("chat.postMessage", failure)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(1)), team=team)
    await answered(slack, 1, ["The answer"])
    assert await stored(slack, team, 1) == ["tell me", "The answer"]
    assert len(slack.world.model_requests()) == 1


async def test_a_placeholder_slack_keeps_refusing_ends_in_the_given_up_message(slack):
    """Past its pauses (RETRY_BACKOFF): the turn never ran, so the reply says the question
    was not saved."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    for instance in slack.instances:
        instance.adapter.pipeline.retry_pause = 0.02  # the pauses keep their growth
    slack.api.fail("chat.postMessage", "service_unavailable", times=len(RETRY_BACKOFF) + 1)
    await slack.a.event(mention("tell me", ts(2)), team=team)
    await answered(slack, 2, [GAVE_UP_UNSAVED])
    assert slack.world.model_requests() == []
    assert await stored(slack, team, 2) == []


async def test_a_passing_failure_of_the_final_edit_is_answered_by_a_run_again(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    slack.api.fail("chat.update", "internal_error")  # the final edit (no update before it)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(3)), team=team)
    await answered(slack, 3, ["The answer"])  # the same placeholder, no FAILURE
    assert await stored(slack, team, 3) == ["tell me", "The answer"]
    assert len(slack.world.model_requests()) == 1  # the stored answer was delivered again


async def test_a_later_part_that_fails_in_passing_is_sent_by_a_run_again_once(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    first, second = "a" * (MARKDOWN_LIMIT - 10), "b" * 50
    slack.world.model.script(text(f"{first}\n\n{second}", delay=1.0))
    await slack.a.event(mention("tell me", ts(4)), team=team)
    await until(lambda: slack.api.thread_texts("C1", ts(4)) == ["_Thinking…_"])
    slack.api.fail("chat.postMessage", "fatal_error")  # the second part's post
    await answered(slack, 4, [first, second])
    assert len(slack.world.model_requests()) == 1


async def test_blocks_slack_refuses_are_sent_as_sections_with_the_buttons(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    first, second = "a" * (MARKDOWN_LIMIT - 10), "b" * 50
    slack.world.model.script(text(f"{first}\n\n{second}", delay=1.0))
    slack.api.fail("chat.update", "invalid_blocks")  # the final edit of the placeholder
    await slack.a.event(mention("tell me", ts(5)), team=team)
    await until(lambda: slack.api.thread_texts("C1", ts(5)) == ["_Thinking…_"])
    slack.api.fail("chat.postMessage", "msg_too_long")  # the second part, with its 👍/👎
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(5)) == [first, second]
    assert FAILURE not in slack.api.thread_texts("C1", ts(5))
    edit = slack.api.of("chat.update")[-1]
    assert {b["type"] for b in edit["blocks"]} == {"section"}  # 11,000 characters: 4 sections
    assert "".join(b["text"]["text"] for b in edit["blocks"]) == first
    last = slack.api.of("chat.postMessage")[-1]
    assert [b["type"] for b in last["blocks"]] == ["section", "actions"]  # the buttons kept
    assert last["blocks"][0]["text"]["text"] == second


async def test_blocks_and_sections_slack_refuses_are_sent_as_plain_text(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    slack.world.model.script(text("The answer"))
    slack.api.fail("chat.update", "invalid_blocks", times=2)  # the markdown, then sections
    await slack.a.event(mention("tell me", ts(10)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(10)) == ["The answer"]
    edit = slack.api.of("chat.update")[-1]
    assert edit["blocks"] == [] and edit["text"] == "The answer"  # the placeholder's dropped


async def test_a_placeholder_slack_posted_despite_its_error_is_not_posted_twice(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    slack.api.fail("chat.postMessage", "internal_error", done=True)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(11)), team=team)
    await answered(slack, 11, ["The answer"])  # in the placeholder Slack did post
    assert len(slack.api.of("chat.postMessage")) == 1


async def test_a_part_slack_posted_despite_its_error_is_not_posted_twice(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    first, second = "a" * (MARKDOWN_LIMIT - 10), "b" * 50
    slack.world.model.script(text(f"{first}\n\n{second}", delay=1.0))
    await slack.a.event(mention("tell me", ts(12)), team=team)
    await until(lambda: slack.api.thread_texts("C1", ts(12)) == ["_Thinking…_"])
    slack.api.fail("chat.postMessage", "fatal_error", done=True)  # the second part's post
    await answered(slack, 12, [first, second])


async def test_a_slack_answer_that_is_not_json_runs_the_job_again(slack):
    """slack_sdk leaves aiohttp's response in the error (`status`, no `status_code`)."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    slack.api.garble("chat.postMessage")  # the placeholder: a proxy's 502 page
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(13)), team=team)
    await answered(slack, 13, ["The answer"])
    assert len(slack.world.model_requests()) == 1


async def test_a_passing_failure_runs_again_after_a_pause_not_a_lapsed_lease(slack):
    """The job runs again in the same drain after a short pause: with a lease of a minute,
    waiting for it to lapse would leave the person without an answer for that long."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    for instance in slack.instances:
        instance.adapter.pipeline.lease_ms, instance.adapter.pipeline.recover_every = 60_000, 60
    slack.api.fail("chat.postMessage", "service_unavailable")
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(14)), team=team)
    await answered(slack, 14, ["The answer"])


async def test_a_status_slack_drops_does_not_leave_the_stream_unanswered(slack):
    team = f"T{time.time_ns()}"
    slack.api.drop("assistant.threads.setStatus", times=2)  # "is thinking…" never shown
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(6)), team=team)
    await slack.settle()  # in the same run: no lease to lapse first
    assert slack.api.thread_texts("C1", ts(6)) == ["The answer"]


async def test_a_stream_slack_drops_falls_back_to_a_placeholder(slack):
    team = f"T{time.time_ns()}"
    slack.api.drop("chat.startStream", times=2)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(7)), team=team)
    await slack.settle()  # in the same run: no lease to lapse first
    assert slack.api.thread_texts("C1", ts(7)) == ["The answer"]
    assert [p["text"] for p in slack.api.of("chat.postMessage")] == ["_Thinking…_"]


def test_a_first_socket_mode_delivery_is_no_retry():
    """Socket Mode sends `retry_attempt: 0` with a first delivery, which bolt makes the
    header x-slack-retry-num "0": the person is told memory is down on it, as over HTTP."""

    def socket_mode(attempt: int | None) -> AsyncBoltRequest:
        envelope = SocketModeRequest(
            type="events_api", envelope_id="E1", payload={"type": "event_callback"},
            retry_attempt=attempt, retry_reason="timeout" if attempt else "",
        )  # fmt: skip
        headers = build_headers(envelope)
        return AsyncBoltRequest(mode="socket_mode", body=envelope.payload, headers=headers)

    assert not slack_retry(socket_mode(0)) and not slack_retry(socket_mode(None))
    assert slack_retry(socket_mode(1)) and slack_retry(socket_mode(3))
    assert not slack_retry(AsyncBoltRequest(body="{}", headers={}))  # over HTTP
    assert slack_retry(AsyncBoltRequest(body="{}", headers={"X-Slack-Retry-Num": "1"}))


async def test_a_first_socket_mode_delivery_while_memory_is_down_is_told(tmp_path):
    """Through bolt's Socket Mode dispatch: told on the first delivery, not on Slack's retry."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    async with slack_world(server.ensure_running(), tmp_path) as slack:
        try:
            team, app = f"T{time.time_ns()}", slack.instances[0].adapter.app
            slack.api.knows(ts(9))
            server.stop()
            body = {
                "token": "legacy", "team_id": team, "api_app_id": "A1",
                "type": "event_callback", "event_id": "EvSocket", "event_time": int(time.time()),
                "event": mention("tell me", ts(9)),
                "authorizations": [{"team_id": team, "user_id": BOT_USER, "is_bot": True}],
            }  # fmt: skip
            for attempt in (0, 1):  # Slack's first delivery, then its retry
                envelope = SocketModeRequest(
                    type="events_api", envelope_id=f"E{attempt}", payload=dict(body),
                    retry_attempt=attempt, retry_reason="timeout" if attempt else "",
                )  # fmt: skip
                assert (await run_async_bolt_app(app, envelope)).status == 503  # sent again
                assert slack.api.thread_texts("C1", ts(9)) == [NOT_TAKEN]  # told once
        finally:
            server.ensure_running()  # for the world's own closing
    server.stop()


async def test_a_part_slack_posted_while_it_could_not_say_so_is_looked_for_first(slack):
    """Slack posts the part despite its error and cannot be asked either (degraded): the run
    again looks for the part before posting it, rather than posting it a second time."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    first, second = "a" * (MARKDOWN_LIMIT - 10), "b" * 50
    slack.world.model.script(text(f"{first}\n\n{second}", delay=1.0))
    await slack.a.event(mention("tell me", ts(15)), team=team)
    await until(lambda: slack.api.thread_texts("C1", ts(15)) == ["_Thinking…_"])
    slack.api.fail("chat.postMessage", "internal_error", done=True)  # the second part's post
    slack.api.fail("conversations.replies", "service_unavailable")  # its lookup in that run
    await answered(slack, 15, [first, second])
    assert len(slack.api.of("chat.postMessage")) == 2  # the placeholder, the second part


async def test_a_placeholder_slack_posted_while_it_could_not_say_so_is_the_one_used(slack):
    team = f"T{time.time_ns()}"
    retried_soon(slack)
    slack.api.drop("chat.startStream", times=2)  # a placeholder, not a stream
    slack.api.fail("chat.postMessage", "internal_error", done=True)
    slack.api.fail("conversations.replies", "service_unavailable")
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(16)), team=team)
    await answered(slack, 16, ["The answer"])  # in the placeholder Slack did post
    assert len(slack.api.of("chat.postMessage")) == 1


async def test_a_gone_placeholder_is_not_taken_for_the_answer_posted_anew(slack):
    """The placeholder cannot be edited and the answer posted in its stead fails: the answer
    is not taken as delivered because the placeholder (another marker) is in the thread."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    slack.world.model.script(text("The answer", delay=1.0))
    await slack.a.event(mention("tell me", ts(17)), team=team)
    await until(lambda: slack.api.thread_texts("C1", ts(17)) == ["_Thinking…_"])
    slack.api.fail("chat.update", "cant_update_message")  # the final edit
    slack.api.fail("chat.postMessage", "internal_error")  # the answer posted anew: not posted
    await slack.settle()
    assert "The answer" in slack.api.thread_texts("C1", ts(17))  # by the run again
    assert len(slack.world.model_requests()) == 1


async def test_a_stream_answered_by_a_proxy_page_is_tried_again_next_turn(slack):
    """A 502 that is not JSON (no Slack error code) is passing: the workspace keeps streaming."""
    team = f"T{time.time_ns()}"
    slack.api.garble("chat.startStream")
    slack.world.model.script(text("The first"), text("The second"))
    await slack.a.event(mention("tell me", ts(18)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(18)) == ["The first"]  # in a placeholder
    await slack.a.event(mention("and more", ts(19)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(19)) == ["The second"]
    assert len(slack.api.of("chat.startStream")) == 2
    assert [p["text"] for p in slack.api.of("chat.postMessage")] == ["_Thinking…_"]


async def test_a_status_answered_by_a_proxy_page_is_shown_again_next_turn(slack):
    team = f"T{time.time_ns()}"
    slack.api.garble("assistant.threads.setStatus")
    slack.world.model.script(text("The first"), text("The second"))
    await slack.a.event(mention("tell me", ts(20)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(20)) == ["The first"]
    await slack.a.event(mention("and more", ts(21)), team=team)
    await slack.settle()
    statuses = slack.api.of("assistant.threads.setStatus")
    assert [s["status"] for s in statuses if s["thread_ts"] == ts(21)][:1] == ["is thinking…"]


async def test_a_post_that_cannot_be_looked_for_at_all_is_made_by_the_run_again(slack):
    """Without the history scope the lookup fails for good: the run again posts rather than
    failing the turn over a post that may not be there."""
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    retried_soon(slack)
    slack.api.fail("chat.postMessage", "internal_error")  # the placeholder: not posted
    slack.api.fail("conversations.replies", "missing_scope", times=2)
    slack.world.model.script(text("The answer"))
    await slack.a.event(mention("tell me", ts(22)), team=team)
    await answered(slack, 22, ["The answer"])
    assert len(slack.api.of("conversations.replies")) == 2  # looked for in each run
