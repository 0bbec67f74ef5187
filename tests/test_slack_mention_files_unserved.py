"""Files shared with the bot on Slack where no file service reads them (no Slack end in the
process's file service, or no file service at all): the message's question is answered once,
however Slack sends it (`message` and `app_mention`, to two processes, and their retries), and
a share with no question gets FILES_UNREAD once, not silence. Through the real adapter over
real HTTP, a real Redis and the scripted model."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from adapters.slack_files import FILES_UNREAD
from bot.turns import TurnHandler
from tests.agent_world import close_world, open_world
from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, MockSlackApi, file_share, mention
from tests.test_slack import SlackInstance, thread, ts


@contextlib.asynccontextmanager
async def unserved_world(redis_url: str, tmp_path, service: bool) -> AsyncIterator:
    """Two bot processes on one Redis and a mock Slack; no Slack token for files (`service`:
    a file service without a Slack end; else none at all)."""
    world = await open_world(redis_url, tmp_path)  # no slack_bot_token: no Slack file end
    runtime = world.runtime
    assert "slack" not in runtime.files.ends
    handler = TurnHandler(runtime.agent, watches=runtime.watches,
                          files=runtime.files if service else None)  # fmt: skip
    api = MockSlackApi(streaming=True, strict_threads=True)
    await api.start()
    session = aiohttp.ClientSession()
    instances = [SlackInstance(handler, api) for _ in range(2)]
    senders = [await instance.start(session) for instance in instances]

    class Env:
        pass

    env = Env()
    env.world, env.api, (env.a, env.b) = world, api, senders

    async def settle() -> None:
        for _ in range(3):
            for instance in instances:
                await instance.adapter.wait_idle()
            await runtime.harness.drain()

    env.settle = settle
    try:
        yield env
    finally:
        await settle()
        await session.close()
        for instance in instances:
            await instance.runner.cleanup()
            await instance.adapter.close()
        await api.close()
        await close_world(world)


@pytest.fixture(params=["no slack end", "no file service"])
async def slack(request, redis_url, tmp_path):
    async with unserved_world(redis_url, tmp_path, request.param == "no slack end") as env:
        yield env


def shared(env, n: int, question: str, **where) -> tuple[dict, dict]:
    """A PDF shared with a mention of the bot, as Slack sends it: the `message` (subtype
    `file_share`) and the `app_mention`, both with the file."""
    pdf = env.api.add_file("notes.pdf", make_pdf())
    said = f"<@{BOT_USER}> {question}".strip()
    return (
        file_share([pdf], ts(n), text=said, **where),
        {**mention(question, ts(n), **where), "text": said, "files": [pdf]},
    )


async def test_a_mention_with_a_pdf_and_a_question_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    message_event, app_mention = shared(slack, 1, "what is MemGPT?")
    assert (await slack.a.event(message_event, team=team, event_id="EvMsg")).status == 200
    assert (await slack.b.event(app_mention, team=team, event_id="EvMention")).status == 200
    await slack.settle()
    # Slack's retries of both, each to the other process
    await slack.b.event(message_event, team=team, event_id="EvMsg", retry=1)
    await slack.a.event(app_mention, team=team, event_id="EvMention", retry=1)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(1)) == ["MemGPT pages memory in and out."]
    assert len(slack.world.model_requests()) == 1
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(1)))
    assert [m.content for m in stored] == ["what is MemGPT?", "MemGPT pages memory in and out."]


async def test_a_bare_mention_with_a_pdf_is_told_files_are_not_read(slack):
    team = f"T{time.time_ns()}"
    message_event, app_mention = shared(slack, 2, "")
    await slack.b.event(app_mention, team=team, event_id="EvMention")
    await slack.a.event(message_event, team=team, event_id="EvMsg")
    await slack.b.event(message_event, team=team, event_id="EvMsg", retry=1)  # Slack's retry
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(2)) == [FILES_UNREAD]
    assert slack.world.model_requests() == []


async def test_a_dm_with_only_a_pdf_is_told_files_are_not_read(slack):
    team = f"T{time.time_ns()}"
    pdf = slack.api.add_file("notes.pdf", make_pdf())
    event = file_share([pdf], ts(3), channel="D7", channel_type="im")
    assert (await slack.a.event(event, team=team, event_id="EvDm")).status == 200
    await slack.b.event(event, team=team, event_id="EvDm", retry=1)  # Slack's retry
    await slack.settle()
    assert slack.api.thread_texts("D7", None) == [FILES_UNREAD]
    assert slack.world.model_requests() == []
