"""The Slack adapter over real HTTP: signed requests in, real Web API client calls out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from adapters.slack import SlackAdapter, parse_thread_link, thread_id
from adapters.web import build_web_app
from app.runtime import AgentRuntime
from bot.turns import TurnHandler
from memory.scope import Scope, Visibility
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.scripted_openai import call, text, tool_calls
from tests.support.slack_api import (
    BOT_USER,
    INVALID_TOKEN,
    MockSlackApi,
    SlackSender,
    mention,
    message,
    sign,
)

SECRET = "test-signing-secret"


class SlackInstance:
    """One bot process: its own Bolt app, pipeline and HTTP server, sharing Redis and agent."""

    def __init__(self, handler: TurnHandler, api: MockSlackApi) -> None:
        self.api = api
        self.adapter = SlackAdapter(handler, "xoxb-test", SECRET, api_url=api.base_url)
        self.runner = web.AppRunner(build_web_app(handler.memory, self.adapter.app))

    async def start(self, session: aiohttp.ClientSession) -> SlackSender:
        await self.adapter.check_token()
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return SlackSender(f"{self.url}/slack/events", SECRET, session, self.api)


@contextlib.asynccontextmanager
async def slack_world(
    redis_url: str, tmp_path, handler_of: Callable[[AgentRuntime], TurnHandler] | None = None
) -> AsyncIterator:
    """Two bot processes on one Redis, a mock Slack Web API, and a sender per process; their
    turns are taken by `handler_of(runtime)` (say, one without a file service), else by the
    runtime's own."""
    world = await open_world(redis_url, tmp_path)
    # a workspace with streaming; threads only under messages it issued or was told of
    api = MockSlackApi(streaming=True, strict_threads=True)
    await api.start()
    session = aiohttp.ClientSession()
    handler = handler_of(world.runtime) if handler_of else world.runtime.turns()
    first, second = (SlackInstance(handler, api) for _ in range(2))
    senders = [await first.start(session), await second.start(session)]

    class Env:
        pass

    env = Env()
    env.world, env.api, env.a, env.b = world, api, senders[0], senders[1]
    env.instances = (first, second)

    async def settle():
        for _ in range(3):
            for instance in (first, second):
                await instance.adapter.wait_idle()
            await world.runtime.harness.drain()

    env.settle = settle
    yield env
    await settle()
    await session.close()
    for instance in (first, second):
        await instance.runner.cleanup()
        await instance.adapter.close()
    await api.close()
    await close_world(world)


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        yield env


def ts(n: int) -> str:
    return f"1700000000.{n:06d}"


def thread(team: str, thread_ts: str, channel: str = "C1") -> Scope:
    """The scope a test reads a Slack thread's memory with."""
    return Scope(team, thread_id(team, channel, thread_ts), channel=channel)


async def test_mention_is_answered_in_its_thread_and_followups_need_no_mention(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Hello from ArxivScout"), text("Second answer"))
    response = await slack.a.event(mention("hi there", ts(1)), team=team)
    assert response.status == 200
    await slack.settle()
    # the reply is streamed into the thread, for the person who asked
    started = slack.api.of("chat.startStream")[0]
    assert started["thread_ts"] == ts(1)
    assert (started["recipient_user_id"], started["recipient_team_id"]) == ("U1", team)
    assert slack.api.thread_texts("C1", ts(1)) == ["Hello from ArxivScout"]
    memory = slack.world.runtime.memory
    stored = await memory.conversation.all(thread(team, ts(1)))
    assert f"slack:{team}:C1:{ts(1)}" == thread(team, ts(1)).thread
    assert [m.content for m in stored] == ["hi there", "Hello from ArxivScout"]
    # the person is named as Slack names them (users.info), the channel is public
    assert (stored[0].author, stored[0].author_name) == ("U1", "Ada")
    assert {m.audience for m in stored} == {"public"}
    seen = slack.world.model_requests()[0]["messages"][1]["content"]
    assert seen.startswith("# Question\nhi there\n") and BOT_USER not in seen

    await slack.a.event(message("and a follow-up", ts(2), thread_ts=ts(1)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(1)) == ["Hello from ArxivScout", "Second answer"]


async def test_what_is_ignored(slack):
    team = f"T{time.time_ns()}"
    events = [
        message("no mention, not in a bot thread", ts(10)),
        message("in a thread the bot is not in", ts(11), thread_ts=ts(9)),
        message("from a bot", ts(12), bot_id="B2", thread_ts=ts(1)),
        message("edited", ts(13), subtype="message_changed", thread_ts=ts(1)),
        message("the bot itself", ts(14), user=BOT_USER, thread_ts=ts(1)),
    ]
    for event in events:
        assert (await slack.a.event(event, team=team)).status == 200
    await slack.settle()
    assert slack.api.of("chat.postMessage") == []
    assert slack.world.model_requests() == []


async def test_retries_are_answered_once_even_on_another_instance(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("only once"))
    event = mention("hello", ts(20))
    await slack.a.event(event, team=team, event_id="EvSame")
    await slack.b.event(event, team=team, event_id="EvSame", retry=1)
    await slack.a.event(event, team=team, event_id="EvSame", retry=2)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(20)) == ["only once"]
    assert len(slack.world.model_requests()) == 1


async def test_one_turn_at_a_time_per_thread_in_arrival_order(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("answer 1", delay=0.3), text("answer 2"), text("answer 3"))
    await slack.a.event(mention("question 1", ts(30)), team=team)
    # a follow-up without a mention, sent at once, to the other instance
    await slack.b.event(message("question 2", ts(31), thread_ts=ts(30)), team=team)
    await slack.a.event(mention("question 3", ts(32), thread_ts=ts(30)), team=team)
    await slack.settle()
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(30)))
    assert [m.content for m in stored] == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
    ]


async def test_concurrent_events_in_one_thread_on_two_instances_keep_order(slack):
    team = f"T{time.time_ns()}"
    memory = slack.world.runtime.memory
    # the bot is already in the thread
    await memory.presence.join(
        Scope(team, thread_id(team, "C1", ts(40)), channel="C1", user="U1"), reference=ts(40)
    )
    slack.world.model.script(*[text(f"answer {i}", delay=0.05) for i in range(6)])
    for i in range(6):
        sender = slack.a if i % 2 else slack.b
        await sender.event(message(f"question {i}", ts(41 + i), thread_ts=ts(40)), team=team)
    await slack.settle()
    stored = [m.content for m in await memory.conversation.all(thread(team, ts(40)))]
    assert stored == [x for i in range(6) for x in (f"question {i}", f"answer {i}")]


async def test_forged_and_stale_signatures_are_rejected(slack):
    team = f"T{time.time_ns()}"
    body = json.dumps({"type": "event_callback", "team_id": team, "event_id": "EvForged",
                       "event": mention("forged", ts(50))})  # fmt: skip
    forged = await slack.a.post(body, "application/json", signature=sign("wrong-secret", body))
    stale = await slack.a.post(
        body, "application/json", signature=sign(SECRET, body, int(time.time()) - 600)
    )
    missing = await slack.a.post(body, "application/json", signature={})
    assert forged.status == stale.status == missing.status == 401
    await slack.settle()
    assert slack.world.model_requests() == []


async def test_summarize_command_shortcut_and_expand(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT is arXiv 2310.08560."))
    await slack.a.event(mention("Can you get me the paper MemGPT", ts(60)), team=team)
    await slack.settle()

    # /summarize with no link: the caller's most recent thread with the bot in this channel
    response = await slack.a.command("/summarize", "", slack.api.response_url + "1", team=team)
    assert response.status == 200
    await slack.settle()
    summary_post = slack.api.thread_texts("C1", ts(60))[-1]
    assert summary_post.startswith("Stored as [Summary ID: sum_")
    summary_id = summary_post.split("[Summary ID: ")[1].split("]")[0]

    response = await slack.a.command("/expand", summary_id, slack.api.response_url + "2", team=team)
    assert response.status == 200
    await slack.settle()
    expanded = await slack.api.response("2")  # answered after the ack, to response_url
    assert expanded["response_type"] == "ephemeral"
    assert "UTC] [Ada] Can you get me the paper MemGPT" in expanded["text"]  # who, and when
    assert expanded["blocks"] == [{"type": "markdown", "text": expanded["text"]}]

    # the message shortcut from a reply in the thread, and /summarize with a thread link
    slack.world.model.script(text("More."))
    await slack.a.event(mention("one more thing", ts(61), thread_ts=ts(60)), team=team)
    await slack.settle()
    await slack.a.shortcut(
        "summarize_thread",
        {"ts": ts(62), "thread_ts": ts(60)},
        slack.api.response_url + "3",
        team=team,
    )
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(60))[-1].startswith("Stored as [Summary ID: sum_")
    link = f"https://x.slack.com/archives/C1/p{ts(60).replace('.', '')}"
    await slack.a.command("/summarize", link, slack.api.response_url + "4", team=team)
    await slack.settle()
    assert "Nothing to summarize" in slack.api.thread_texts("C1", ts(60))[-1]
    assert len(await slack.world.runtime.memory.summaries.for_thread(thread(team, ts(60)))) == 2


async def test_summarize_without_any_thread_explains(slack):
    response = await slack.a.command(
        "/summarize", "", slack.api.response_url + "9", team=f"T{time.time_ns()}"
    )
    assert "no thread with you in this channel" in await response.text()


async def test_workspaces_do_not_share_papers(slack):
    team_a, team_b = f"TA{time.time_ns()}", f"TB{time.time_ns()}"
    slack.world.model.script(
        tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})), text("Saved."),
        text("Answer in A."), text("Answer in B."),
    )  # fmt: skip
    await slack.a.event(mention("save MemGPT", ts(70)), team=team_a)
    await slack.settle()
    await slack.a.event(
        mention("what does MemGPT page between?", ts(71), channel="C2"), team=team_a
    )
    await slack.b.event(mention("what does MemGPT page between?", ts(72)), team=team_b)
    await slack.settle()
    contexts = {r["messages"][1]["content"] for r in slack.world.model_requests()[-2:]}
    seen_a = next(c for c in contexts if "main context and an archival store" in c)
    assert f"[arXiv:{MEMGPT_ID}]" in seen_a  # another thread of the same workspace finds it
    seen_b = next(c for c in contexts if c is not seen_a)
    assert MEMGPT_ID not in seen_b and "(no relevant passages in the knowledge base)" in seen_b


async def test_direct_messages_and_formatting(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(  # the paper is shown first: only a paper shown is linked
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})),
        text("**Bold** see [arXiv:2310.08560] & more"),
    )
    await slack.a.event(
        message("hello in a DM", ts(80), channel="D1", channel_type="im"), team=team
    )
    await slack.settle()
    post = slack.api.of("chat.postMessage")[-1]
    assert post["channel"] == "D1" and "thread_ts" not in post
    update = slack.api.of("chat.update")[-1]
    # standard Markdown in a markdown block (no mrkdwn conversion, no escaping); the model's
    # arXiv references become links to the paper
    expected = "**Bold** see [arXiv:2310.08560](https://arxiv.org/abs/2310.08560) & more"
    assert update["blocks"][0] == {"type": "markdown", "text": expected}
    assert [b["type"] for b in update["blocks"]] == ["markdown", "actions"]  # 👍/👎 after it
    assert update["text"] == expected
    stored = await slack.world.runtime.memory.conversation.all(
        Scope(team, thread_id(team, "D1", "dm"), channel="D1", visibility=Visibility.DM)
    )
    assert [m.content for m in stored] == [
        "hello in a DM",
        "**Bold** see [arXiv:2310.08560] & more",
    ]
    assert {m.audience for m in stored} == {"dm:D1"}


async def test_private_channels_keep_their_memory_to_themselves(slack):
    team = f"T{time.time_ns()}"
    slack.api.private_channels.add("C9")  # a private channel with a C id, as Slack makes now
    slack.world.model.script(text("in G1"), text("in C9"))
    # one turn at a time: the scripted model answers in call order
    await slack.a.event(mention("hello G1", ts(95), channel="G1"), team=team)
    await slack.settle()
    await slack.a.event(mention("hello C9", ts(96), channel="C9"), team=team)
    await slack.settle()
    memory = slack.world.runtime.memory
    for channel, n in (("G1", 95), ("C9", 96)):
        stored = await memory.conversation.all(thread(team, ts(n), channel))
        assert [m.content for m in stored] == [f"hello {channel}", f"in {channel}"]
        assert {m.audience for m in stored} == {f"private:{channel}"}


async def test_a_direct_message_that_mentions_the_bot_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Answer in the DM"), text("a second answer"))
    # Slack sends a DM as a message.im event only (never app_mention), mention or not
    dm = message(f"<@{BOT_USER}> hello there", ts(85), channel="D2", channel_type="im")
    assert (await slack.a.event(dm, team=team)).status == 200
    await slack.settle()
    posts = [p for p in slack.api.of("chat.postMessage") if p["channel"] == "D2"]
    assert len(posts) == 1 and "thread_ts" not in posts[0]
    assert slack.api.of("chat.update")[-1]["text"] == "Answer in the DM"
    assert len(slack.world.model_requests()) == 1
    seen = slack.world.model_requests()[0]["messages"][1]["content"]
    assert seen.startswith("# Question\nhello there\n") and BOT_USER not in seen


async def test_message_events_without_channel_or_ts_are_acknowledged_and_ignored(slack):
    team = f"T{time.time_ns()}"
    no_channel = message(f"<@{BOT_USER}> where am I?", ts(90), channel_type="im")
    del no_channel["channel"]
    no_ts = message(f"<@{BOT_USER}> when am I?", ts(91), channel="D3", channel_type="im")
    del no_ts["ts"]
    mention_no_ts = mention("no ts", ts(92))
    del mention_no_ts["ts"]
    for event in (no_channel, no_ts, mention_no_ts):
        assert (await slack.a.event(event, team=team)).status == 200
    await slack.settle()
    assert slack.api.of("chat.postMessage") == []
    assert slack.world.model_requests() == []


async def test_healthz_checks_redis(slack):
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{slack.instances[0].url}/healthz") as response,
    ):
        assert response.status == 200 and (await response.json())["redis"] == "up"


def test_thread_links():
    assert parse_thread_link("https://t.slack.com/archives/C1/p1700000000000060") == (
        "C1",
        "1700000000.000060",
    )
    reply = "https://t.slack.com/archives/C9/p1700000001000001?thread_ts=1700000000.000060&cid=C9"
    assert parse_thread_link(reply) == ("C9", "1700000000.000060")
    assert parse_thread_link("no link") is None


async def arxivscout_slack(env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "slack", "--port", "0", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode, stderr.decode()


async def test_missing_and_wrong_tokens_are_named(cli_env):
    env = {**cli_env, "OPENAI_API_KEY": "k"}
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN", "SLACK_API_URL"):
        env.pop(name, None)
    code, err = await arxivscout_slack(env)
    assert code == 2 and "SLACK_BOT_TOKEN is not set" in err
    code, err = await arxivscout_slack({**env, "SLACK_BOT_TOKEN": "xapp-wrong-kind"})
    assert code == 2 and "SLACK_BOT_TOKEN should start with 'xoxb-'" in err
    code, err = await arxivscout_slack({**env, "SLACK_BOT_TOKEN": "xoxb-1"})
    assert code == 2 and "SLACK_SIGNING_SECRET is not set" in err
    api = MockSlackApi()
    await api.start()
    try:
        wrong = {**env, "SLACK_BOT_TOKEN": INVALID_TOKEN, "SLACK_SIGNING_SECRET": "s",
                 "SLACK_API_URL": api.base_url}  # fmt: skip
        code, err = await arxivscout_slack(wrong)
        assert code == 2 and "Slack rejected SLACK_BOT_TOKEN" in err and "invalid_auth" in err
        assert "Traceback" not in err
    finally:
        await api.close()
