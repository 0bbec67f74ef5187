"""`/summarize` and `/expand` always answer: a thread edited while the model writes its note is
summarized again (or said to have changed), memory down is said on every platform, and the
Summary segment lists summaries at a small budget instead of denying they exist."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest

from adapters.discord import DiscordAdapter
from adapters.terminal import TerminalChat
from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.turns import THREAD_CHANGED
from memory.context import CONVERSATION_DERIVED, ContextLimits, assemble_context
from memory.keys import joined_key
from memory.scope import Scope, Visibility
from memory.stores.conversation import message_tokens
from memory.stores.summary import Summary, compact_note
from tests.agent_world import close_world, open_world
from tests.support.discord_fakes import FakeDiscord
from tests.support.redis_gate import RedisGate
from tests.test_discord_expand_private_miss import REFUSALS, unknown_interaction
from tests.test_redis_timeouts import redis_proxy
from tests.test_slack import slack_world

MEMORY_DOWN_SAID = "unreachable right now, so {command} could not run"


def thread_scope(tenant: str, thread: str = "cli:summarize") -> Scope:
    return Scope(tenant, thread, "C1", Visibility.PUBLIC, "U1", "Ada")


async def say(world, scope: Scope, count: int) -> list[str]:
    """`count` messages in the thread; their ids."""
    conversation = world.runtime.memory.conversation
    return [
        (await conversation.append(scope, "user", f"Point {i} about MemGPT's paging.")).id
        for i in range(count)
    ]


def forget_while_writing(world, scope: Scope, message_ids: list[str]) -> None:
    """Each summary request forgets the next of `message_ids` before the model answers: the
    thread changes under the note being written, as an edit or deletion on the platform."""
    route, governance = world.route, world.runtime.memory.governance

    async def router(body: dict):
        if body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS and message_ids:
            await governance.forget_message(scope.tenant, scope.thread, message_ids.pop(0))
        return route(body)

    world.model.router = router


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


@contextlib.asynccontextmanager
async def world_behind_proxy(redis_url: str, tmp_path) -> AsyncIterator:
    async with redis_proxy(redis_url) as proxy:
        world = await open_world(proxy.url_for(redis_url), tmp_path)
        try:
            yield world, proxy
        finally:
            proxy.restore()
            await close_world(world)


# -- the thread changing while the model writes ---------------------------------------------------


async def test_a_thread_changed_once_while_summarizing_is_summarized_again(world, tenant):
    scope = thread_scope(tenant)
    ids = await say(world, scope, 4)
    forget_while_writing(world, scope, [ids[0]])
    answer = await world.runtime.turns().summarize(scope)
    assert answer.startswith("Stored as [Summary ID: sum_"), answer
    assert len(world.summary_requests) == 2
    marked = await world.runtime.memory.conversation.all(scope, forgotten=True)
    assert all(m.summary_id for m in marked)  # every message, the forgotten one too


async def test_a_thread_that_keeps_changing_is_said_to_have_changed(world, tenant):
    scope = thread_scope(tenant)
    ids = await say(world, scope, 4)
    forget_while_writing(world, scope, ids[:2])
    assert await world.runtime.turns().summarize(scope) == THREAD_CHANGED
    assert await world.runtime.memory.summaries.descriptions(scope) == []  # nothing stored


async def test_the_terminal_chat_goes_on_after_a_changed_thread(world, tenant, tmp_path):
    import io

    scope = thread_scope(tenant)
    ids = await say(world, scope, 4)
    forget_while_writing(world, scope, ids[:2])
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), scope, out=out)
    chat.interactive = False
    assert await chat.command("/summarize") is True
    assert THREAD_CHANGED in out.getvalue()


async def test_a_resent_marking_after_an_edit_keeps_its_summary(memory, tenant):
    """The marking ran but its reply was lost, and a marked message was forgotten (its summary
    rewritten) before redis-py resent it: the resend is done, not a changed thread (which
    /summarize would retry into "Nothing to summarize" over a stored summary)."""
    scope = thread_scope(tenant, "cli:resend")
    said = [await memory.conversation.append(scope, "user", f"Point {i}.") for i in range(3)]
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    summary = Summary(scope.thread, *compact_note(said), [m.id for m in said])
    record = memory.summaries.indexed(scope, summary)
    await memory.conversation.mark_summarized(scope, first, raw, summary.id, record)  # lost
    await memory.governance.forget_message(tenant, scope.thread, said[0].id)
    await memory.conversation.mark_summarized(scope, first, raw, summary.id, record)  # resent
    assert [s.id for s in await memory.summaries.for_thread(scope)] == [summary.id]
    assert "Point 0" not in (await memory.summaries.get_many(tenant, [summary.id]))[summary.id].text
    assert await memory.conversation.unsummarized(scope) == []


# -- Discord: the commands answer, whatever fails ---------------------------------------------------


def discord_adapter(world, fake: FakeDiscord) -> DiscordAdapter:
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(adapter.client)
    return adapter


async def test_discord_summarize_of_a_changing_thread_answers_in_place_of_thinking(world):
    fake = FakeDiscord()
    adapter = discord_adapter(world, fake)
    guild = fake.guild()
    thread, user = fake.thread(guild, owner_id=fake.bot.id), fake.user()
    scope = await adapter.commands.scope(fake.interaction(thread, user))
    ids = await say(world, scope, 4)
    forget_while_writing(world, scope, ids[:2])
    interaction = fake.interaction(thread, user)
    await adapter.tree.get_command("summarize").callback(interaction)
    interaction.response.defer.assert_awaited_once_with(thinking=True)
    assert fake.texts(thread.id)[-1] == THREAD_CHANGED


@pytest.mark.parametrize("refusal", REFUSALS)
async def test_a_discord_summarize_whose_defer_discord_refuses_ends_quietly(world, refusal, caplog):
    """Discord refuses the "thinking…" (too late: Unknown interaction; or the connection
    drops): nothing can answer that interaction, so nothing is tried on it and no error is
    logged (the work did not fail), as for /expand."""
    fake = FakeDiscord()
    adapter = discord_adapter(world, fake)
    thread, user = fake.thread(fake.guild(), owner_id=fake.bot.id), fake.user()
    await say(world, await adapter.commands.scope(fake.interaction(thread, user)), 2)
    interaction = fake.interaction(thread, user)
    interaction.response.defer.side_effect = REFUSALS[refusal]()
    interaction.response.send_message.side_effect = unknown_interaction()
    interaction.followup.send.side_effect = unknown_interaction()
    caplog.clear()
    await adapter.tree.get_command("summarize").callback(interaction)
    interaction.response.defer.assert_awaited_once()
    interaction.response.send_message.assert_not_awaited()
    interaction.followup.send.assert_not_awaited()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert fake.texts(thread.id) == []


async def test_discord_commands_with_redis_down_say_so(redis_url, tmp_path):
    async with world_behind_proxy(redis_url, tmp_path) as (world, proxy):
        fake = FakeDiscord()
        adapter = discord_adapter(world, fake)
        guild, user = fake.guild(), fake.user()
        thread, joined = (
            fake.thread(guild, owner_id=fake.bot.id),
            fake.thread(guild, owner_id=user.id),
        )
        proxy.cut()

        summarize = fake.interaction(thread, user)  # fails after its "thinking…"
        await adapter.tree.get_command("summarize").callback(summarize)
        summarize.response.defer.assert_awaited_once_with(thinking=True)
        assert MEMORY_DOWN_SAID.format(command="/summarize") in fake.texts(thread.id)[-1]

        summarize = fake.interaction(joined, user)  # whether it was joined: before the defer
        await adapter.tree.get_command("summarize").callback(summarize)
        summarize.response.defer.assert_not_awaited()
        args, kwargs = summarize.response.send_message.await_args
        assert MEMORY_DOWN_SAID.format(command="/summarize") in args[0]
        assert kwargs == {"ephemeral": True}

        expand = fake.interaction(thread, user)  # only to the person, as a miss
        await adapter.tree.get_command("expand").callback(expand, "sum_1")
        expand.response.defer.assert_not_awaited()
        args, kwargs = expand.response.send_message.await_args
        assert MEMORY_DOWN_SAID.format(command="/expand") in args[0]
        assert kwargs == {"ephemeral": True}


async def test_discord_summarize_with_redis_hanging_answers_before_discord_gives_up(
    redis_url, tmp_path
):
    """Whether the thread was joined is asked before the defer: a Redis that holds the EXISTS
    (no reset, so no error for a while) is said to be down in time, not left to expire."""
    gate = RedisGate(redis_url)
    world = await open_world(await gate.start(), tmp_path)
    try:
        fake = FakeDiscord()
        adapter = discord_adapter(world, fake)
        user = fake.user()
        joined = fake.thread(fake.guild(), owner_id=user.id)  # the bot must ask memory
        summarize = fake.interaction(joined, user)
        scope = await adapter.commands.scope(summarize)
        gate.hold(joined_key(scope.tenant, scope.thread).encode())
        await adapter.tree.get_command("summarize").callback(summarize)
        assert gate.held.is_set()
        summarize.response.defer.assert_not_awaited()
        args, kwargs = summarize.response.send_message.await_args
        assert MEMORY_DOWN_SAID.format(command="/summarize") in args[0]
        assert kwargs == {"ephemeral": True}
    finally:
        gate.release.set()
        await close_world(world)
        await gate.close()


# -- Slack: /expand's lazy listener answers ----------------------------------------------------------


async def test_slack_expand_with_redis_down_says_so(redis_url, tmp_path):
    async with (
        redis_proxy(redis_url) as proxy,
        slack_world(proxy.url_for(redis_url), tmp_path) as slack,
    ):
        team = f"T{time.time_ns()}"
        proxy.cut()
        try:
            response = await slack.a.command(
                "/expand", "sum_1", slack.api.response_url + "down", team=team
            )
            assert response.status == 200
            said = await slack.api.response("down")
        finally:
            proxy.restore()
        assert said["response_type"] == "ephemeral"
        assert MEMORY_DOWN_SAID.format(command="/expand") in said["text"]


# -- the Summary segment at a small budget ----------------------------------------------------------


async def save_summaries(memory, scope: Scope, descriptions: list[str]) -> list[Summary]:
    summaries = [Summary(scope.thread, d, "...", []) for d in descriptions]
    for summary in summaries:
        await memory.summaries.save(scope, summary)
    return summaries


async def test_an_oversized_description_is_cut_and_the_segments_fit_the_budget(memory, tenant):
    scope = Scope(tenant, "small")
    *_, newest = await save_summaries(
        memory, scope, ["Early talk", "Reading list", "MemGPT paging " * 200]
    )
    for i in range(150):  # a window far larger than the budget
        await memory.conversation.append(scope, "user", f"Message {i} on the seminar plan.")
    limits = ContextLimits(memory_tokens=3000)  # a Summary share of 150 tokens
    context = await assemble_context(memory, scope, "What did we say?", limits)
    summary = context.segment("Summary").text
    assert f"[Summary ID: {newest.id}] MemGPT paging" in summary and "…" in summary
    assert "no summaries" not in summary
    derived = sum(s.tokens for s in context.segments if s.name in CONVERSATION_DERIVED)
    assert derived <= limits.memory_tokens


async def test_summaries_that_do_not_fit_are_said_to_exist(memory, tenant):
    scope = Scope(tenant, "tiny")
    await save_summaries(memory, scope, ["Early talk", "Reading list", "MemGPT paging"])
    context = await assemble_context(memory, scope, "q", ContextLimits(memory_tokens=120))
    summary = context.segment("Summary").text
    assert "(3 summaries, too long to list)" in summary and "no summaries" not in summary


async def test_a_window_within_its_cap_is_shown_whole_at_a_small_budget(memory, tenant):
    """ensure_window compacts only past the cap: a window within it must be shown whole, or
    a message would be in no segment (neither the window, a summary nor Episodic Memory)."""
    scope = Scope(tenant, "small-window")
    await save_summaries(
        memory, scope, ["Discussion of sparse attention papers and their long context results"]
    )
    limits = ContextLimits(memory_tokens=300)
    for i in range(14):
        await memory.conversation.append(scope, "user", f"Point {i} about the seminar plan")
    window = await memory.conversation.unsummarized(scope)
    assert sum(message_tokens(window, memory.model)) <= limits.window_cap
    context = await assemble_context(memory, scope, "q", limits)
    assert context.recent_messages == context.window_messages == 14
    assert not context.window_overflows(limits.window_cap)  # nor compacted for nothing
    assert all(m.content in context.segment("Conversation").text for m in window)


async def test_the_segments_fit_every_budget_that_holds_the_window_at_its_cap(memory, tenant):
    """From 400 tokens up, a window within its cap and the Summary segment (its newest lines
    within its share, or the note that they exist) fit the budget."""
    scope = Scope(tenant, "fit")
    await save_summaries(memory, scope, ["MemGPT paging " * 200])  # a line longer than the note
    for i in range(20):
        await memory.conversation.append(scope, "user", f"Point {i} about the seminar plan")
    window = await memory.conversation.unsummarized(scope)
    tokens = sum(message_tokens(window, memory.model))
    vector = (await memory.embedder.embed(["q"]))[0]
    for budget in range(400, 2 * tokens + 240):
        limits = ContextLimits(memory_tokens=budget)
        if tokens > limits.window_cap:
            continue
        context = await assemble_context(memory, scope, "q", limits, vector=vector)
        assert context.recent_messages == len(window), budget
        assert context.memory_tokens <= budget, budget
