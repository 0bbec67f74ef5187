"""A summary Slack will not take in its thread (the channel archived since, the linked message
gone, before or after its placeholder) comes to the command's response_url, saying why, rather
than never, and what it cannot carry is said with what to do; a turn refused for good is said
once, never for a deleted message nor a failure Slack did not refuse (memory's own); one
place's refusal leaves the workspace's streaming on; a Summarize thread shortcut memory was
only slow to take is summarized once; a link to a DM's message outside threads is the DM's
conversation, as the shortcut takes it. Over real HTTP to the mock Web API, a real Redis and
the scripted model, as tests/test_slack_summarize_checks.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import StreamReader, StreamWriter
from urllib.parse import urlparse

import pytest

from adapters.platform_ids import slack_source
from adapters.slack import thread_id
from adapters.slack_summarize import SUMMARIZING
from adapters.spine import NOT_SHOWN, Job
from adapters.text import split_for_delivery
from memory.keys import edited_message_key
from memory.scope import Scope, Visibility
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text
from tests.support.slack_api import MockSlackApi, mention, message
from tests.test_slack_summarize_checks import (
    a_thread,
    ask,
    new_stream,
    slack_process,
    summaries,
    told,
    ts,
)

SUMMARY = "Stored as [Summary ID: sum_"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


@pytest.fixture
async def api():
    api = MockSlackApi(streaming=True)
    api.private_channels.add("C3")
    api.members.update({"C1": {"U1", "U2"}, "C3": {"U1"}})
    await api.start()
    yield api
    await api.close()


async def settle(world, bot) -> None:
    for _ in range(3):
        await bot.wait_idle()
        await world.runtime.harness.drain()


async def summarized_elsewhere(world, api, team: str, n: int) -> list[str]:
    """`/summarize <link>` in C1 of Ada's thread `n` in C3: what she is told."""
    stream = new_stream()
    async with slack_process(world, api, stream) as (bot, sender):
        await ask(sender, team, f"https://x.slack.com/archives/C3/p{ts(n).replace('.', '')}",
                  "U1", "ada")  # fmt: skip
        await settle(world, bot)
    return told(api, "ada")


async def test_a_summary_of_an_archived_channel_s_thread_comes_to_the_response_url(world, api):
    team = f"T{time.time_ns()}"
    await a_thread(world, api, team, new_stream(), 1)
    said = api.thread_texts("C3", ts(1))
    api.fail("chat.postMessage", "is_archived", times=20)  # archived since: Slack takes none
    first, summary = await summarized_elsewhere(world, api, team, 1)
    assert first == SUMMARIZING
    why, shown = summary.split("\n\n", 1)
    assert why.startswith("_I cannot post in that thread: its channel is archived")
    assert shown.startswith(SUMMARY)
    assert api.thread_texts("C3", ts(1)) == said
    assert await summaries(world, team, 1) == 1


async def test_a_summary_of_a_thread_whose_message_is_gone_comes_to_the_response_url(world, api):
    team = f"T{time.time_ns()}"
    await a_thread(world, api, team, new_stream(), 2)
    api.strict_threads = True
    api.known_ts.discard(ts(2))  # deleted since: Slack takes no reply under it
    first, summary = await summarized_elsewhere(world, api, team, 2)
    assert first == SUMMARIZING
    why, shown = summary.split("\n\n", 1)
    assert why.startswith("_I cannot post in that thread: its message no longer exists")
    assert shown.startswith(SUMMARY)


async def test_a_summary_slack_will_not_take_after_its_placeholder_comes_to_the_response_url(
    world, api
):
    """A run before posted the placeholder; the channel archived since, the summary's edit and
    a post anew both refused: the summary comes to the response_url, and why."""
    team = f"T{time.time_ns()}"
    await a_thread(world, api, team, new_stream(), 3)
    api.fail("chat.update", "is_archived", times=20)
    api.fail("chat.postMessage", "is_archived", times=20)
    async with slack_process(world, api, new_stream()) as (bot, _):
        scope = Scope(team, thread_id(team, "C3", ts(3)), "C3", Visibility.PRIVATE, "U1")
        reply = {"channel": "C3", "thread_ts": ts(3), "response_url": api.response_url + "ada"}
        job = Job("summarize", scope, reply=reply, progress={"placeholder": ts(3)})
        await bot.pipeline.run(job)
        await settle(world, bot)
    [summary] = told(api, "ada")
    why, shown = summary.split("\n\n", 1)
    assert why.startswith("_I cannot post in that thread: its channel is archived")
    assert shown.startswith(SUMMARY)
    assert await summaries(world, team, 3) == 1


async def test_what_the_response_url_cannot_carry_is_said_with_what_to_do(world, api):
    """A long answer Slack will not take in an archived channel's thread, after "Summarizing…"
    took one of the response_url's 5 posts: its first parts, then the note of what was left out,
    which asks for the question elsewhere (inviting the bot would not help)."""
    team = f"T{time.time_ns()}"
    api.fail("chat.startStream", "is_archived", times=20)
    api.fail("chat.postMessage", "is_archived", times=20)
    long = "\n\n".join(f"Paragraph {n}: " + "words of the answer " * 250 for n in range(12))
    async with slack_process(world, api, new_stream()) as (bot, _):
        world.model.script(text(long))
        scope = Scope(team, thread_id(team, "C3", ts(9)), "C3", Visibility.PRIVATE, "U1")
        reply = {"channel": "C3", "thread_ts": ts(9), "response_url": api.response_url + "ada"}
        job = Job("turn", scope, "tell me at length", reply=reply, progress={"responded": 1})
        await bot.pipeline.run(job)
        await settle(world, bot)
    total = len(split_for_delivery(bot.pipeline.platform.render(long), 11_000))
    *parts, note = told(api, "ada")
    assert len(parts) == 3 and total > 4
    assert note.startswith(f"_Slack lets me post only 5 messages here, so {total - 3} of {total}")
    assert "Ask again in a channel I can post in" in note


async def test_a_deleted_message_s_placeholder_slack_refuses_is_left_unsaid(world, api):
    """A run that died showed "Thinking…"; the message deleted and the channel archived since:
    the placeholder's edit refused for good is logged, nothing posted in its stead."""
    team = f"T{time.time_ns()}"
    async with slack_process(world, api, new_stream()) as (bot, _):
        scope = Scope(team, thread_id(team, "C1", ts(10)), "C1", user="U1")
        source = slack_source("C1", ts(10))
        await world.runtime.memory.governance.note_deleted(team, source)
        api.fail("chat.update", "is_archived", times=20)
        job = Job("turn", scope, "a question", reply={"channel": "C1", "thread_ts": ts(10)},
                  source=source, progress={"placeholder": ts(10)})  # fmt: skip
        await bot.pipeline.run(job)
        await settle(world, bot)
    assert api.thread_texts("C1", ts(10)) == []
    assert api.of("chat.postMessage") == []


async def test_a_channel_s_refusal_leaves_the_workspace_s_streaming_on(world, api):
    """chat.startStream refused in one archived thread: the next turn elsewhere still streams.
    Slack refuses the notice there too (a mention has no response_url): it goes to a DM."""
    team = f"T{time.time_ns()}"
    api.fail("chat.startStream", "is_archived")
    api.fail("chat.postMessage", "is_archived", times=2)  # its placeholder, then the notice
    async with slack_process(world, api, new_stream()) as (bot, sender):
        world.model.script(text("Streamed."))  # the first turn is not run
        await sender.event(mention("hi", ts(11), channel="C1"), team=team)
        await settle(world, bot)
        await sender.event(mention("hello", ts(12), channel="C1"), team=team)
        await settle(world, bot)
    assert api.thread_texts("C1", ts(11)) == []
    assert api.thread_texts(api.dm_channel("U1"), None) == [
        f"About your message in <#C1>: {NOT_SHOWN}"
    ]
    assert len(api.of("chat.startStream")) == 2
    assert api.thread_texts("C1", ts(12))[-1].startswith("Streamed.")


async def test_a_turn_slack_refuses_to_show_for_good_is_said_where_it_can_be(world, api):
    """The placeholder refused for good (not in passing): the turn is not run, and the person is
    told rather than left waiting, where Slack takes it."""
    team = f"T{time.time_ns()}"
    api.fail("chat.startStream", "restricted_action")
    api.fail("chat.postMessage", "restricted_action")  # the placeholder only
    async with slack_process(world, api, new_stream()) as (bot, sender):
        world.model.script(text("never shown"))
        await sender.event(mention("hi", ts(4), channel="C1"), team=team)
        await settle(world, bot)
    assert api.thread_texts("C1", ts(4)) == [NOT_SHOWN]


async def test_a_turn_failing_for_another_reason_than_slack_is_not_said_unshown(world, api):
    """Memory's own error (a key of the wrong type) before anything was sent: Slack refused
    nothing, so the person is not told to ask elsewhere; it is logged."""
    team = f"T{time.time_ns()}"
    source = slack_source("C1", ts(13))
    await world.runtime.memory.redis.set(edited_message_key(team, source), "not a hash")
    async with slack_process(world, api, new_stream()) as (bot, sender):
        world.model.script(text("never run"))
        await sender.event(mention("hi", ts(13), channel="C1"), team=team)
        await settle(world, bot)
    assert api.thread_texts("C1", ts(13)) == []
    assert world.model_requests() == []


async def test_a_link_to_a_dm_message_outside_threads_summarizes_the_dm(world, api):
    team = f"T{time.time_ns()}"
    async with slack_process(world, api, new_stream()) as (bot, sender):
        world.model.script(text("The budget is 7 million."))
        await sender.event(message("What is the budget?", ts(5), channel="D1",
                                   channel_type="im"), team=team)  # fmt: skip
        await settle(world, bot)
        link = f"https://x.slack.com/archives/D1/p{ts(5).replace('.', '')}"
        url = api.response_url + "ada"
        response = await sender.command("/summarize", link, url, team=team, channel="D1")
        assert await response.text() == SUMMARIZING
        await settle(world, bot)
    assert api.thread_texts("D1", None)[-1].startswith(SUMMARY)
    assert api.thread_texts("D1", ts(5)) == []
    dm = Scope(team, thread_id(team, "D1", "dm"), "D1", Visibility.DM, "U1")
    assert len(await world.runtime.memory.summaries.for_thread(dm)) == 1


async def test_a_shortcut_memory_was_only_slow_to_take_is_summarized_once(
    redis_url, tmp_path, api, caplog
):
    """Redis slow to answer past the shortcut's 2 s: its task lands all the same, and its
    summary is queued from the shortcut's process too; both under the task's event id, so
    the thread is summarized once."""
    caplog.set_level(logging.WARNING, logger="adapters.slack_summarize")
    proxy = SlowRedis(redis_url)
    world = await open_world(await proxy.start(), tmp_path)
    try:
        team, stream = f"T{time.time_ns()}", new_stream()
        await a_thread(world, api, team, stream, 6)
        said = api.thread_texts("C3", ts(6))
        async with slack_process(world, api, stream) as (bot, sender):
            proxy.hold()  # Redis's answers wait; what is sent to it lands at once
            shortcut = asyncio.create_task(
                sender.shortcut(
                    "summarize_thread",
                    {"ts": ts(6), "user": "U1"},
                    api.response_url + "ada",
                    team=team,
                    channel="C3",
                )
            )
            await gave_up(shortcut, caplog)
            proxy.release()  # answered once the shortcut gave its task up
            response = await asyncio.wait_for(shortcut, 60)
            assert response.status == 200
            assert "a shortcut in C3 not queued" in caplog.text  # it missed its deadline
            await settle(world, bot)
        [summary] = api.thread_texts("C3", ts(6))[len(said) :]  # one post: no second summary
        assert summary.startswith(SUMMARY)
        assert await summaries(world, team, 6) == 1
        assert told(api, "ada") == []
    finally:
        try:
            await close_world(world)
        finally:
            await proxy.close()


async def gave_up(shortcut: asyncio.Task, caplog) -> None:
    """Until the shortcut said its task was not queued (its 2 s for memory past) or answered;
    bounded, so a shortcut that never gives up fails the test rather than hanging it."""
    for _ in range(1200):
        if "not queued" in caplog.text or shortcut.done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the shortcut never gave its task up")


class SlowRedis:
    """A TCP proxy to Redis whose answers, while held, wait until released (the test releases
    them once the shortcut's 2 s for memory passed, short of the client's 5 s socket
    timeout); what clients send reaches Redis at once."""

    def __init__(self, redis_url: str) -> None:
        self.target = urlparse(redis_url)
        self.host, self.port = self.target.hostname or "127.0.0.1", self.target.port or 6379
        self._answering = asyncio.Event()
        self._answering.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        where = self.target.netloc.rsplit("@", 1)  # its credentials, if any, kept
        netloc = f"{where[0]}@127.0.0.1:{port}" if len(where) == 2 else f"127.0.0.1:{port}"
        return self.target._replace(netloc=netloc).geturl()

    def hold(self) -> None:
        """Redis's answers wait from now on, until `release`."""
        self._answering.clear()

    def release(self) -> None:
        self._answering.set()

    async def close(self) -> None:
        self.release()
        assert self._server is not None
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _connect(self, client_in: StreamReader, client_out: StreamWriter) -> None:
        try:
            redis_in, redis_out = await asyncio.open_connection(self.host, self.port)
        except OSError:  # Redis gone: the client sees its connection closed
            client_out.close()
            return
        for pipe in (
            self._pipe(client_in, redis_out, False),
            self._pipe(redis_in, client_out, True),
        ):
            task = asyncio.create_task(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: StreamReader, sink: StreamWriter, answers: bool) -> None:
        try:
            while chunk := await source.read(65536):
                if answers:
                    await self._answering.wait()
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.close()
