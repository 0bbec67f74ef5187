"""How answers reach Slack: streamed or edited, through rate limits, in DMs, through a
response_url where the bot may not post, and once only when a job runs again."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from adapters.slack import thread_id
from adapters.slack_delivery import RESPONSE_URL_POSTS, STILL_WORKING
from adapters.spine import Job
from memory.scope import Scope
from tests.support.scripted_openai import call, text, tool_calls
from tests.support.slack_api import mention, message
from tests.test_slack import slack_world, ts

ANSWER = ("A long answer about [arXiv:2310.08560], " + "with many words " * 40).strip()
# The paper the answer cites is shown first: only a paper the turn showed is linked.
SEARCH = tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"}))


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:  # every delta may update: the tests drive the pace
            instance.adapter.pipeline.platform.update_every = 0.0
        yield env


def linked(answer: str) -> str:
    return answer.replace(
        "[arXiv:2310.08560]", "[arXiv:2310.08560](https://arxiv.org/abs/2310.08560)"
    ).strip()


async def ask(slack, team: str, n: int, question: str = "tell me") -> None:
    await slack.a.event(mention(question, ts(n)), team=team)
    await slack.settle()


async def test_answers_stream_where_the_workspace_streams(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(SEARCH, text(ANSWER))
    await ask(slack, team, 1)
    assert slack.api.thread_texts("C1", ts(1)) == [linked(ANSWER)]
    assert slack.api.of("chat.postMessage") == []  # no placeholder besides the stream
    appended = "".join(p["markdown_text"] for p in slack.api.of("chat.appendStream"))
    assert appended and ANSWER.startswith(appended)  # it grew as the model wrote
    assert len(slack.api.of("chat.stopStream")) == 1
    statuses = [p["status"] for p in slack.api.of("assistant.threads.setStatus")]
    assert statuses[0] == "is thinking…" and statuses[-1] == ""


async def test_without_streaming_a_placeholder_is_edited_and_that_is_remembered(slack):
    team = f"T{time.time_ns()}"
    slack.api.streaming = False
    slack.world.model.script(SEARCH, text(ANSWER), text("Second answer"))
    await ask(slack, team, 2)
    await ask(slack, team, 3, "again")
    assert slack.api.thread_texts("C1", ts(2)) == [linked(ANSWER)]
    assert slack.api.thread_texts("C1", ts(3)) == ["Second answer"]
    placeholders = [p for p in slack.api.of("chat.postMessage") if p["thread_ts"] == ts(2)]
    assert [p["text"] for p in placeholders] == ["_Thinking…_"]
    growing = [p["text"] for p in slack.api.of("chat.update") if p["ts"] == placeholders[0]["_ts"]]
    assert growing[0] == "_Searching arxiv…_"  # the tool's status, then the answer growing
    assert len(growing) > 2 and growing[1].endswith(" …")  # intermediate, then the answer
    # asked once per workspace (and process): the second turn goes straight to a placeholder
    assert len(slack.api.of("chat.startStream")) == 1
    assert len(slack.api.of("assistant.threads.setStatus")) == 1


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_429_while_the_answer_grows_does_not_abort_the_turn(slack, streaming):
    team = f"T{time.time_ns()}"
    slack.api.streaming = streaming
    method = "chat.appendStream" if streaming else "chat.update"
    slack.api.rate_limit(method, times=1, retry_after=1)
    slack.api.rate_limit("chat.update", times=2 if not streaming else 1, retry_after=1)
    slack.world.model.script(SEARCH, text(ANSWER))
    await ask(slack, team, 4)
    assert slack.api.thread_texts("C1", ts(4)) == [linked(ANSWER)]  # whole, after Retry-After
    deltas = len(ANSWER) // 8  # the scripted model writes 8 characters at a time
    # after the 429, updates waited for Retry-After instead of hammering Slack
    assert len(slack.api.of(method)) < deltas / 2
    stored = await slack.world.runtime.memory.conversation.all(
        Scope(team, thread_id(team, "C1", ts(4)), channel="C1")
    )
    assert stored[-1].content == ANSWER  # the turn was not aborted


async def test_summarize_in_the_bots_dm(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Hello in the DM"))
    dm = message("hello", ts(5), channel="D5", channel_type="im")
    await slack.a.event(dm, team=team)
    await slack.settle()
    response = await slack.a.command(
        "/summarize", "", slack.api.response_url + "dm", team=team, channel="D5"
    )
    assert response.status == 200
    await slack.settle()
    shown = slack.api.thread_texts("D5", None)
    assert shown[0] == "Hello in the DM"
    assert shown[-1].startswith("Stored as [Summary ID: sum_")
    assert all("thread_ts" not in p for p in slack.api.of("chat.postMessage"))


async def test_the_shortcut_where_the_bot_is_not_a_member_answers_via_response_url(slack):
    team = f"T{time.time_ns()}"
    slack.api.not_joined.add("C7")
    await slack.a.shortcut(
        "summarize_thread", {"ts": ts(6)}, slack.api.response_url + "7", team=team, channel="C7"
    )
    await slack.settle()
    answer = await slack.api.response("7")
    assert answer["response_type"] == "ephemeral" and answer["text"]
    assert slack.api.thread_texts("C7", ts(6)) == []


async def test_expand_of_a_very_long_summary_fits_the_response_url(slack):
    team = f"T{time.time_ns()}"
    memory = slack.world.runtime.memory
    scope = Scope(team, thread_id(team, "C1", ts(7)), channel="C1", user="U1")
    for i in range(8):
        await memory.conversation.append(scope, "user", f"message {i}: " + "words " * 1_800)
    slack.api.knows(ts(7))
    link = f"https://x.slack.com/archives/C1/p{ts(7).replace('.', '')}"
    await slack.a.command("/summarize", link, slack.api.response_url + "s", team=team)
    await slack.settle()
    summary_post = slack.api.thread_texts("C1", ts(7))[-1]
    summary_id = summary_post.split("[Summary ID: ")[1].split("]")[0]

    await slack.a.command("/expand", summary_id, slack.api.response_url + "x", team=team)
    await slack.settle()
    await slack.api.response("x")
    posts = slack.api.responded["x"]
    assert len(posts) == RESPONSE_URL_POSTS and slack.api.refused_responses == []
    assert "message 0:" in posts[0]["text"]
    assert "parts are left out" in posts[-1]["text"] and f"expand {summary_id}" in posts[-1]["text"]


async def test_a_job_run_again_edits_its_placeholder_and_answers_once(slack):
    team = f"T{time.time_ns()}"
    pipeline = slack.instances[0].adapter.pipeline
    scope = Scope(team, thread_id(team, "C1", ts(8)), channel="C1", user="U1")
    job = Job("turn", scope, "a question", reply={"channel": "C1", "thread_ts": ts(8)})
    slack.api.knows(ts(8))
    slack.world.model.script(text("never seen", delay=30), text("The answer"))

    first = asyncio.create_task(pipeline.run(job))  # the process dies mid-turn
    while "placeholder" not in job.progress or not slack.world.model_requests():
        await asyncio.sleep(0.02)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first

    await pipeline.run(job)  # another process runs it again, with the progress kept
    placeholder = job.progress["placeholder"]
    assert slack.api.thread_texts("C1", ts(8)) == ["The answer"]
    edits = [p for p in slack.api.of("chat.update") if p["ts"] == placeholder]
    assert edits[0]["text"] == STILL_WORKING and edits[-1]["text"] == "The answer"
    assert all(e["text"].endswith(" …") for e in edits[1:-1])  # the answer as it grew

    calls = len(slack.api.calls)
    await pipeline.run(job)  # and once more after it was delivered: nothing is sent again
    assert slack.api.thread_texts("C1", ts(8)) == ["The answer"]
    sent_again = [c for c in slack.api.calls[calls:] if c.method.startswith("chat.")]
    assert sent_again == []
