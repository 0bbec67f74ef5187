"""Summaries audit (s28): a window cut while a roll holds its thread says so and leaves the cut
messages to recall; /summarize on a thread never taken part in says so and writes nothing;
/summarize keeps its lock through a long note; its usage does not bring an erased thread back.

Real Redis, the scripted model; a roll holds its thread's lock by a model call held open."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import replace

import pytest

from bot.consolidation import LOCK_SECONDS, NO_THREAD, SUMMARY_INSTRUCTIONS
from memory.context import assemble_context, newest_that_fit, window_cut_note
from memory.keys import summarized_count_key, summarizing_key, usage_key
from memory.scope import Scope, Visibility
from memory.stores.base import Segment
from memory.tokens import count_tokens
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text

PASTED = (
    "Pasted abstract: the Zorblax protocol shards a retriever's index over quokka nodes, "
    "replicates each shard thrice, and answers a query from the nearest replica in 4 ms. "
) * 3
FILLER = "Let us keep going with the reading list for the seminar, paper by paper"


def is_summary_request(body: dict) -> bool:
    return bool(body.get("messages")) and body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS


async def routed(world, body: dict):
    """The world's own answer to a harness call (awaited: an entity answer is a coroutine)."""
    reply = world.route(body)
    return await reply if inspect.isawaitable(reply) else reply


def thread_scope(tenant: str, thread: str) -> Scope:
    return Scope(tenant, thread, "C1", Visibility.PUBLIC, "U1", "Ada")


def hold_summaries(world) -> tuple[asyncio.Event, asyncio.Event]:
    """Summary requests wait for the returned `release` (`asked` is set once one waits): a
    roll's model call that holds its thread's lock as long as the test needs."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def router(body: dict):
        if is_summary_request(body):
            asked.set()
            await release.wait()
        return await routed(world, body)

    world.model.router = router
    return asked, release


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path, memory_tokens=1200)
    yield world
    await close_world(world)


@pytest.fixture
async def small_window_world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path, window=2000)  # summary requests of 1,000
    yield world
    await close_world(world)


async def test_a_window_cut_while_a_roll_holds_it_says_so_and_its_cut_messages_are_recalled(
    world, tenant
):
    memory, upkeep = world.runtime.memory, world.runtime.harness.upkeep
    scope = thread_scope(tenant, "slack:T:C1:5.0")
    said = [await memory.conversation.append(scope, "user", PASTED)]
    for i in range(70):  # far past the window's cap, and past the whole budget
        said.append(await memory.conversation.append(scope, "user", f"{FILLER} ({i})."))
    await upkeep.after_messages(scope, said, 0)  # indexed (no roll queued)
    await world.runtime.harness.drain()

    asked, release = hold_summaries(world)
    roll = asyncio.create_task(world.runtime.harness.consolidator.roll(scope, 300))
    await asked.wait()  # the roll holds the thread's lock, its model call open
    try:
        world.model.script(text("The Zorblax protocol shards the index."))
        reply = await world.runtime.turns().handle(scope, "What did the Zorblax abstract say?")
        assert reply.text == "The Zorblax protocol shards the index."
        seen = world.model_requests()[-1]["messages"][1]["content"]
        conversation, episodic = seen.split("## Episodic Memory", 1)
        assert "earlier messages of this thread are not shown here" in conversation
        assert "Zorblax" not in conversation.split("# Question", 1)[1].split("\n", 2)[2]
        assert "Zorblax protocol shards" in episodic.split("## ", 1)[0]  # recalled

        limits = world.runtime.harness.limits
        context = await assemble_context(memory, scope, "the Zorblax abstract", limits)
        shown = set(context.message_ids)
        assert 0 < context.recent_messages == len(shown) < context.window_messages
        assert said[0].id in {e.id for e in context.episodes} and said[0].id not in shown
        assert not shown & {e.id for e in context.episodes}  # nothing shown twice
        for segment in context.segments:  # counts stay exact, the note's tokens too
            assert segment.tokens == count_tokens(segment.text, memory.model)
        assert context.memory_tokens <= limits.memory_tokens
    finally:
        release.set()
        await roll


async def test_summarize_on_a_thread_never_taken_part_in_says_so_and_writes_nothing(world, tenant):
    scope = thread_scope(tenant, "slack:T:C9:7.0")
    assert await world.runtime.turns().summarize(scope) == NO_THREAD
    # a roll task for it (as after the thread's erasure) writes nothing either
    assert await world.runtime.harness.consolidator.roll(scope, 300) == []
    redis = world.runtime.memory.redis
    assert not await redis.exists(summarized_count_key(tenant, scope.thread))
    assert not world.summary_requests


async def test_summarize_renews_its_lock_through_a_long_note(small_window_world, tenant):
    world, memory = small_window_world, small_window_world.runtime.memory
    scope = thread_scope(tenant, "cli:long-note")
    for i in range(60):  # more than one request: notes on chunks, then combined
        await memory.conversation.append(scope, "user", f"{FILLER}, point {i} of many.")
    lock, ttls = summarizing_key(tenant, scope.thread), []

    async def router(body: dict):
        if is_summary_request(body):
            ttls.append(await memory.redis.pttl(lock))
            await memory.redis.pexpire(lock, 5000)  # as if the call took most of the lock's time
        return await routed(world, body)

    world.model.router = router
    answer = await world.runtime.turns().summarize(scope)
    assert answer.startswith("Stored as [Summary ID: sum_"), answer
    assert len(ttls) >= 3
    assert all(ttl > 5000 for ttl in ttls[1:])  # renewed before each further request
    assert all(ttl <= LOCK_SECONDS * 1000 for ttl in ttls)


async def test_summarize_does_not_count_usage_to_a_thread_erased_meanwhile(world, tenant):
    memory = world.runtime.memory
    scope = thread_scope(tenant, "cli:erased-while-summarized")
    for i in range(4):
        await memory.conversation.append(scope, "user", f"{FILLER}, point {i}.")

    async def router(body: dict):
        if is_summary_request(body):
            await memory.governance.forget_thread(tenant, scope.thread)
        return await routed(world, body)

    world.model.router = router
    answer = await world.runtime.turns().summarize(scope)
    assert answer == NO_THREAD  # erased: the retry finds no message
    assert not await memory.redis.exists(usage_key(tenant, scope.thread))
    assert not await memory.redis.exists(summarized_count_key(tenant, scope.thread))
    assert int(await memory.redis.hget(usage_key(tenant), "model_calls") or 0) >= 1


def test_a_cut_window_keeps_its_newest_message_even_past_the_cap():
    """A window cut to its cap while a roll runs: a newest message longer than the cap (a
    long answer) is still shown, with the note, when the whole room allows it; otherwise the
    cut takes the cap, and the window's rendering fits its budget."""
    model = "gpt-4o-mini"
    segment = Segment(
        "Conversation", "the thread", "read it", [f"[user] short {i}" for i in range(40)]
    )
    segment.items.append("[assistant] " + "a long answer " * 300)
    newest = count_tokens(replace(segment, items=segment.items[-1:]).render(), model)
    room, cap = newest + 100, newest // 2  # the whole window does not fit room
    text, tokens, shown = newest_that_fit(segment, room, model, window_cut_note, cut_budget=cap)
    assert shown >= 1 and "a long answer" in text and "earlier messages" in text
    assert tokens == count_tokens(text, model) <= room
    short = Segment(
        "Conversation", "the thread", "read it", [f"[user] short {i}" for i in range(400)]
    )
    text, tokens, shown = newest_that_fit(short, 1500, model, window_cut_note, cut_budget=500)
    assert 0 < shown < 400 and tokens == count_tokens(text, model) <= 500
    assert text.count("earlier messages") == 1
