"""Rolling summaries: every message is always either in the recent window (unsummarized) or
covered by exactly one top-level summary, whatever appends, rolls and guards run, and at once."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from bot.consolidation import (
    MAX_TOP_SUMMARIES,
    PARTS_HEADER,
    SUMMARY_INSTRUCTIONS,
    Consolidator,
    SummaryInProgress,
)
from bot.llm import LLMError
from memory.keys import summarized_count_key
from memory.scope import Scope
from memory.stores.conversation import ConversationStore, message_tokens
from memory.tokens import count_tokens
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import error, text

WORDS = [
    "memory",
    "paging",
    "context",
    "archival",
    "retrieval",
    "agent",
    "summary",
    "window",
    "token",
    "recall",
]


def sentence(i: int, words: int) -> str:
    """A distinct message of about `words` words."""
    rng = random.Random(i)
    return f"message {i}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def is_summary_request(body: dict) -> bool:
    return bool(body.get("messages")) and body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS


async def append_many(memory, scope: Scope, start: int, count: int, words: int = 20) -> None:
    for i in range(start, start + count):
        role = "user" if i % 2 == 0 else "assistant"
        await memory.conversation.append(scope, role, sentence(i, words))


async def tokens(memory, scope: Scope) -> int:
    return await memory.conversation.unsummarized_tokens(scope, memory.model)


async def leaf_ids(memory, scope: Scope, summary) -> list[str]:
    """The message ids of a summary's subtree, from its level-0 descendants, in order."""
    if not summary.children:
        assert summary.level == 0
        return list(summary.message_ids)
    ids: list[str] = []
    for child_id in summary.children:
        child = await memory.summaries.get(scope, child_id)
        assert child.parent == summary.id and child.level < summary.level
        ids += await leaf_ids(memory, scope, child)
    return ids


async def check_invariant(memory, scope: Scope) -> None:
    """Every message is unsummarized or in exactly one top-level summary's subtree; the
    summarized ones are a prefix; the top-level summaries cover it in order."""
    messages = await memory.conversation.all(scope)
    ids = [m.id for m in messages]
    assert len(set(ids)) == len(ids)
    unsummarized = await memory.conversation.unsummarized(scope)
    k = len(messages) - len(unsummarized)
    assert [m.id for m in unsummarized] == ids[k:]
    assert all(m.summary_id for m in messages[:k])
    assert not any(m.summary_id for m in messages[k:])
    tops = await memory.summaries.for_thread(scope)
    assert [sid for sid, _ in await memory.summaries.descriptions(scope)] == [s.id for s in tops]
    covered: list[str] = []
    for top in tops:
        assert top.parent == ""
        assert await leaf_ids(memory, scope, top) == top.message_ids
        covered += top.message_ids
    assert covered == ids[:k]  # each summarized message in exactly one top-level summary, in order
    leaf_of = {m.id: m.summary_id for m in messages[:k]}
    for message_id, summary_id in leaf_of.items():
        assert message_id in (await memory.summaries.get(scope, summary_id)).message_ids


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def model_consolidator(world) -> Consolidator:
    return Consolidator(world.runtime.memory, world.runtime.llm)


# -- the conversation store -------------------------------------------------------------------


async def test_unsummarized_matches_a_full_scan_and_explicit_timestamps_are_kept(memory, tenant):
    scope = Scope(tenant, "t")
    dated = await memory.conversation.append(scope, "user", "from 2020", timestamp=1_600_000_000.0)
    now = await memory.conversation.append(scope, "assistant", "from now")
    assert dated.timestamp == 1_600_000_000.0 and abs(now.timestamp - time.time()) < 60
    await Consolidator(memory, None).compact(scope)
    await memory.conversation.append(scope, "user", "after", timestamp=1_700_000_000.5)
    await memory.conversation.append(scope, "assistant", "reply")
    stored = await memory.conversation.all(scope)
    assert [m.timestamp for m in stored][::2] == [1_600_000_000.0, 1_700_000_000.5]

    def scan(messages):
        return [m for m in messages if not m.summary_id]

    expected = scan(stored)
    assert [m.content for m in expected] == ["after", "reply"]
    assert await memory.conversation.unsummarized(scope) == expected
    count_key = summarized_count_key(tenant, "t")
    assert int(await memory.redis.get(count_key)) == 2  # kept by the marking script
    # a thread from before the counter, and counters that lie: the prefix is found again
    for bad in (None, "0", "1", "3", "999"):
        if bad is None:
            await memory.redis.delete(count_key)
        else:
            await memory.redis.set(count_key, bad)
        assert await memory.conversation.unsummarized(scope) == expected, bad
        assert int(await memory.redis.get(count_key)) == 2, bad
        assert await memory.conversation.unsummarized_snapshot(scope) == (
            2,
            [m.to_json() for m in expected],
        )
    # an empty thread, and a thread with nothing summarized
    assert await memory.conversation.unsummarized(Scope(tenant, "empty")) == []
    fresh = Scope(tenant, "fresh")
    await append_many(memory, fresh, 0, 5)
    assert await memory.conversation.unsummarized(fresh) == await memory.conversation.all(fresh)


async def test_marking_must_extend_the_summarized_prefix(memory, tenant):
    from memory.stores.conversation import MarkConflict

    scope = Scope(tenant, "t")
    await append_many(memory, scope, 0, 4)
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    with pytest.raises(MarkConflict):  # messages 2..3 while 0..1 are unsummarized
        await memory.conversation.mark_summarized(scope, first + 2, raw[2:], "sum_gap")
    assert await memory.conversation.mark_summarized(scope, first, raw[:2], "sum_a")
    await memory.conversation.mark_summarized(scope, 2, raw[2:3], "sum_b")
    assert [m.summary_id for m in await memory.conversation.all(scope)] == [
        "sum_a", "sum_a", "sum_b", "",
    ]  # fmt: skip
    assert [m.content for m in await memory.conversation.unsummarized(scope)] == [sentence(3, 20)]


async def test_unsummarized_tokens_are_the_rendered_items(memory, tenant):
    scope = Scope(tenant, "t", user="U1", user_name="Alice")
    await memory.conversation.append(scope, "user", "Which papers page memory?\nLike MemGPT.")
    await memory.conversation.append(scope, "assistant", "MemGPT (arXiv 2310.08560) does.")
    await memory.conversation.append(Scope(tenant, "t"), "user", "  indented\n\n/slash start")
    messages = await memory.conversation.unsummarized(scope)
    assert [m.speaker for m in messages] == ["Alice", "assistant", "user"]
    rendered = ConversationStore.segment(messages).render()
    body = "\n\n".join(m.line for m in messages)
    assert rendered.endswith("\n\n" + body)
    assert "[Alice] Which papers page memory?" in rendered
    assert await tokens(memory, scope) == count_tokens(body, memory.model)
    costs = message_tokens(messages, memory.model)
    for k in range(1, len(messages) + 1):  # the newest k alone: exact too
        newest = "\n\n".join(m.line for m in messages[-k:])
        assert sum(costs[-k:]) == count_tokens(newest, memory.model)


# -- rolling -------------------------------------------------------------------------------


async def test_roll_waits_for_the_target_then_leaves_half(memory, tenant):
    scope, roller = Scope(tenant, "t"), Consolidator(memory, None)
    target = 300
    i = 0
    while True:  # fill up to just under the target
        await memory.conversation.append(scope, "user", sentence(i, 20))
        i += 1
        if await tokens(memory, scope) > target:
            break
        assert await roller.roll(scope, target) == []
        assert await memory.summaries.for_thread(scope) == []
    assert len(await memory.conversation.unsummarized(scope)) == i  # nothing marked yet

    (summary,) = await roller.roll(scope, target)
    left = await memory.conversation.unsummarized(scope)
    assert 0 < await tokens(memory, scope) <= target // 2
    # the newest that fit are kept: one more would not fit
    all_messages = await memory.conversation.all(scope)
    one_more = all_messages[len(all_messages) - len(left) - 1 :]
    assert sum(message_tokens(one_more, memory.model)) > target // 2
    assert summary.message_ids == [m.id for m in all_messages[: len(all_messages) - len(left)]]
    assert summary.description.startswith(f"Compacted {len(summary.message_ids)} messages")
    await check_invariant(memory, scope)

    # hysteresis: one more message does not start another roll; running it twice changes nothing
    await memory.conversation.append(scope, "user", sentence(i, 20))
    assert await roller.roll(scope, target) == []
    assert await roller.roll(scope, target) == []
    assert len(await memory.summaries.for_thread(scope)) == 1
    await check_invariant(memory, scope)


async def test_a_failed_model_call_raises_marks_nothing_and_is_retried(world, tenant):
    memory, roller = world.runtime.memory, model_consolidator(world)
    scope, target = Scope(tenant, "t"), 200
    await append_many(memory, scope, 0, 12)
    backlog = await tokens(memory, scope)
    assert target < backlog <= 2 * target
    before = await memory.conversation.all(scope)

    answers = iter([error(500), error(503), text("no JSON in this answer"), text('{"x": 1}')])
    world.model.router = lambda body: next(answers) if is_summary_request(body) else None
    with pytest.raises(LLMError):  # two attempts, both failing
        await roller.roll(scope, target)
    with pytest.raises(LLMError):  # an answer with no JSON
        await roller.roll(scope, target)
    with pytest.raises(ValueError):  # JSON, but no note
        await roller.roll(scope, target)
    assert await memory.conversation.all(scope) == before  # nothing marked
    assert await memory.summaries.for_thread(scope) == []  # no summary left behind

    world.model.router = world.route  # the model is back: the retried task succeeds
    (summary,) = await roller.roll(scope, target)
    assert summary.description.startswith("User asked for MemGPT")
    assert await tokens(memory, scope) <= target // 2
    await check_invariant(memory, scope)

    # past twice the target the foreground is about to compact: fall back, do not raise
    world.model.router = lambda body: error(500) if is_summary_request(body) else None
    await append_many(memory, scope, 100, 12)
    assert await tokens(memory, scope) > 2 * target
    (fallback,) = await roller.roll(scope, target)
    assert fallback.description.startswith("Compacted ")
    assert await tokens(memory, scope) <= target // 2
    await check_invariant(memory, scope)


async def test_long_batches_are_written_in_chunks_then_combined(world, tenant):
    memory, roller = world.runtime.memory, model_consolidator(world)
    scope, target, limit = Scope(tenant, "t"), 200, 500
    await append_many(memory, scope, 0, 30, words=25)
    (summary,) = await roller.roll(scope, target, model_tokens_per_request=limit)
    requests = world.summary_requests
    chunks, combine = requests[:-1], requests[-1]
    assert len(chunks) >= 3
    assert combine["messages"][1]["content"].startswith(PARTS_HEADER)
    assert "[Part 1]" in combine["messages"][1]["content"]
    for request in requests:
        sent = "".join(m["content"] for m in request["messages"])
        assert count_tokens(sent, memory.model) <= limit
    # the chunks hold every summarized message once, in order
    lines = [
        line for r in chunks for line in r["messages"][1]["content"].split("\n") if line.strip()
    ]
    messages = {m.id: m for m in await memory.conversation.all(scope)}
    assert lines == [f"[{messages[i].role}] {messages[i].content}" for i in summary.message_ids]
    await check_invariant(memory, scope)

    # the same batch within one request's budget is one request
    other = Scope(tenant, "other")
    await append_many(memory, other, 0, 30, words=25)
    world.summary_requests.clear()
    await roller.roll(other, target)
    assert len(world.summary_requests) == 1


async def test_summaries_of_summaries_keep_the_segment_short(memory, tenant):
    scope, roller = Scope(tenant, "t"), Consolidator(memory, None)
    target, i, most = 150, 0, 0
    for _ in range(40):
        await append_many(memory, scope, i, 4)
        i += 4
        await roller.roll(scope, target)
        tops = await memory.summaries.for_thread(scope)
        most = max(most, len(tops))
        assert len(tops) <= MAX_TOP_SUMMARIES
        await check_invariant(memory, scope)
    assert most == MAX_TOP_SUMMARIES  # they did pile up
    tops = await memory.summaries.for_thread(scope)
    merged = tops[0]
    assert merged.level >= 2 and merged.children  # merged, then merged again
    assert merged.description.startswith(f"{len(merged.children)} earlier summaries")
    assert merged.description.count("earlier summaries") == 1  # a merge of merges says what
    assert "Compacted" in merged.description  # they covered, not "6 earlier summaries: 6 ..."

    expanded = await roller.expand_summary(scope, merged.id)
    originals = {m.id: m for m in await memory.conversation.all(scope)}
    assert f"Original messages ({len(merged.message_ids)})" in expanded
    for message_id in merged.message_ids:
        assert originals[message_id].content in expanded
    assert originals[merged.message_ids[0]].content == sentence(0, 20)  # from the very start

    child = await memory.summaries.get(scope, merged.children[-1])
    assert child.parent == merged.id
    assert child.id not in [sid for sid, _ in await memory.summaries.descriptions(scope)]
    child_view = await roller.expand_summary(scope, child.id)
    assert f"Original messages ({len(child.message_ids)})" in child_view


async def test_merged_summaries_are_written_by_the_model(world, tenant):
    memory, roller = world.runtime.memory, model_consolidator(world)
    scope = Scope(tenant, "t")
    for i in range(MAX_TOP_SUMMARIES + 1):
        await append_many(memory, scope, 2 * i, 2)
        await roller.compact(scope)
    assert len(await memory.summaries.for_thread(scope)) == MAX_TOP_SUMMARIES + 1
    (merged,) = await roller.roll(scope, target_tokens=10_000)  # nothing to roll, only merge
    (request,) = world.summary_requests
    assert request["messages"][1]["content"].startswith(PARTS_HEADER)
    assert merged.description.startswith("User asked for MemGPT") and merged.level == 1
    tops = await memory.summaries.for_thread(scope)
    assert len(tops) == MAX_TOP_SUMMARIES // 2 and tops[0].id == merged.id
    expanded = await roller.expand_summary(scope, merged.id)
    assert f"Original messages ({len(merged.message_ids)})" in expanded
    assert sentence(0, 20) in expanded
    await check_invariant(memory, scope)


# -- the foreground guard ------------------------------------------------------------------


async def test_ensure_window_compacts_without_the_model(world, tenant):
    memory, roller = world.runtime.memory, model_consolidator(world)
    scope, cap = Scope(tenant, "t"), 400
    await append_many(memory, scope, 0, 8)
    assert await tokens(memory, scope) <= cap
    assert await roller.ensure_window(scope, cap) is None
    await append_many(memory, scope, 8, 20)
    assert await tokens(memory, scope) > cap
    summary = await roller.ensure_window(scope, cap)
    assert summary is not None and summary.description.startswith("Compacted ")
    assert 0 < await tokens(memory, scope) <= cap // 2
    assert world.model.requests == []  # no model call in the foreground
    await check_invariant(memory, scope)


async def test_ensure_window_waits_briefly_for_a_summary_then_gives_up(memory, tenant):
    scope, roller = Scope(tenant, "t"), Consolidator(memory, None)
    await append_many(memory, scope, 0, 30)
    conversation = memory.conversation
    assert await conversation.claim_summarizing(scope, "background", 60)
    started = time.monotonic()
    assert await roller.ensure_window(scope, 200) is None  # held throughout: no compaction
    waited = time.monotonic() - started
    assert 0.9 <= waited < 5.0  # gave up after its wait, not the 60 s hold (a loaded machine
    # may stall the event loop for a second)
    assert await memory.summaries.for_thread(scope) == []
    with pytest.raises(SummaryInProgress):
        await roller.roll(scope, 200)

    # released within the wait (early in it: a stalled event loop still lands it inside)
    async def release_soon() -> None:
        await asyncio.sleep(0.05)
        await conversation.release_summarizing(scope, "background")

    release = asyncio.create_task(release_soon())
    assert await roller.ensure_window(scope, 200) is not None
    await release
    assert await tokens(memory, scope) <= 100
    await check_invariant(memory, scope)


# -- concurrency ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_model", [False, True], ids=["deterministic", "model"])
async def test_the_invariant_holds_under_concurrent_turns_rolls_and_guards(
    world, tenant, with_model
):
    memory = world.runtime.memory
    roller = model_consolidator(world) if with_model else Consolidator(memory, None)

    async def slow_summaries(body):  # widen the window in which a roll holds its snapshot
        if is_summary_request(body):
            await asyncio.sleep(random.uniform(0.0, 0.03))
        return world.route(body)

    world.model.router = slow_summaries
    scope, target, cap = Scope(tenant, "busy"), 150, 600
    turns, per_turn = 8, 16
    done = asyncio.Event()
    outcomes: list[object] = []

    async def turn(t: int) -> None:
        for i in range(per_turn):
            role = "user" if i % 2 == 0 else "assistant"
            await memory.conversation.append(scope, role, f"turn {t} step {i}: " + sentence(i, 8))
            await asyncio.sleep(random.uniform(0, 0.005))

    async def background() -> None:
        while not done.is_set():
            results = await asyncio.gather(
                roller.roll(scope, target),
                roller.roll(scope, target),
                roller.ensure_window(scope, cap),
                return_exceptions=True,
            )
            outcomes.extend(results)
            await asyncio.sleep(0)

    async def turns_then_done() -> None:
        await asyncio.gather(*(turn(t) for t in range(turns)))
        done.set()

    await asyncio.gather(turns_then_done(), background(), background())
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, SummaryInProgress) for e in errors), errors
    assert any(isinstance(o, list) and o for o in outcomes)  # rolls did run meanwhile

    messages = await memory.conversation.all(scope)
    assert len(messages) == turns * per_turn  # nothing lost
    for t in range(turns):  # each turn's messages in its order
        steps = [
            int(m.content.split()[3][:-1]) for m in messages if m.content.startswith(f"turn {t} ")
        ]
        assert steps == list(range(per_turn))
    await check_invariant(memory, scope)
    assert len(await memory.summaries.for_thread(scope)) <= MAX_TOP_SUMMARIES

    await roller.roll(scope, target)  # quiet again: one roll brings the window down
    assert await tokens(memory, scope) <= target
    await check_invariant(memory, scope)
