"""Very long model answers: stored whole, delivered in a few messages, indexed within caps, and
summarized in requests that fit the model's window, however long the span."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from adapters.text import FENCE, MAX_PARTS, split_for_delivery, split_message
from bot.consolidation import CONTINUED, PARTS_HEADER, Consolidator
from memory.scope import Scope
from memory.stores.conversation import MAX_MESSAGE_CHARS, InvalidMessage
from memory.stores.episodic import EMBEDDED_CHARS, INDEXED_CHARS, Episode, EpisodicStore
from memory.tokens import count_tokens
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text

WORDS = ["memory", "paging", "context", "archival", "retrieval", "agent", "summary", "window"]
LONG_CHARS = 250_000


def prose(seed: int, chars: int) -> str:
    """About `chars` characters of lowercase sentences in paragraphs, with a fenced code block
    now and then; no surrounding whitespace (the agent strips an answer)."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    size = 0
    while size < chars:
        if len(paragraphs) % 7 == 6:
            lines = [f"step_{i} = page({rng.choice(WORDS)!r})" for i in range(rng.randint(3, 40))]
            block = "\n".join([f"{FENCE}python", *lines, FENCE])
        else:
            sentences = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))) + "."
                for _ in range(rng.randint(2, 8))
            ]
            block = " ".join(sentences)
        paragraphs.append(block)
        size += len(block) + 2
    return "\n\n".join(paragraphs)


def request_tokens(body: dict, model: str) -> int:
    return count_tokens("".join(m["content"] or "" for m in body["messages"]), model)


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


# -- storing ----------------------------------------------------------------------------------


async def test_only_a_persons_message_has_a_length_limit(memory, tenant):
    scope = Scope(tenant, "t")
    answer = prose(1, LONG_CHARS)
    assert len(answer) > MAX_MESSAGE_CHARS
    stored = await memory.conversation.append(scope, "assistant", answer)
    with pytest.raises(InvalidMessage, match="limited to"):
        await memory.conversation.append(scope, "user", answer)
    assert [m.content for m in await memory.conversation.all(scope)] == [answer]
    assert stored.content == answer


async def test_a_250k_answer_is_the_reply_stored_whole_and_the_thread_goes_on(world, tenant):
    scope, memory = Scope(tenant, "t"), world.runtime.memory
    answer = prose(2, LONG_CHARS)
    world.model.script(text(answer))
    reply = await world.runtime.turns().handle(scope, "tell me everything about paging")
    assert reply.result is not None and reply.result.stop_reason == "final"
    assert reply.text == answer
    _, stored = await memory.conversation.all(scope)
    assert (stored.role, stored.content) == ("assistant", answer)

    # the background: indexed within the caps, then rolled into a summary in requests that fit
    await world.runtime.harness.drain()
    hits = [
        k async for k in memory.redis.scan_iter(match=memory.episodes.key(tenant, stored.id) + "*")
    ]
    assert 2 <= len(hits) <= 1 + MAX_PARTS  # the message and its parts, not thousands
    kept = await memory.redis.hget(memory.episodes.key(tenant, stored.id), "text")
    assert kept.decode().startswith(answer[:INDEXED_CHARS]) and len(kept) < INDEXED_CHARS + 100
    limit = world.runtime.harness.consolidator.request_tokens
    assert len(world.summary_requests) >= 3  # chunks of the long answer, then their combination
    assert all(request_tokens(r, memory.model) <= limit for r in world.summary_requests)
    assert [m.id for m in await memory.conversation.unsummarized(scope)] == []

    world.model.script(text("Yes, that was the whole account."))
    follow = await world.runtime.turns().handle(scope, "was that everything?")
    assert follow.text == "Yes, that was the whole account."
    sent = world.model_requests()[-1]
    assert request_tokens(sent, memory.model) < count_tokens(answer, memory.model) // 4
    assert (await memory.conversation.all(scope))[1].content == answer  # still whole


async def test_the_turn_guard_compacts_a_message_larger_than_the_window(world, tenant):
    """With no background roll, the next turn's own guard makes room: the huge message is
    compacted (no model call), the messages after it stay, and the turn is answered."""
    scope, memory = Scope(tenant, "t"), world.runtime.memory
    answer = prose(3, LONG_CHARS)
    await memory.conversation.append(scope, "user", "tell me everything")
    huge = await memory.conversation.append(scope, "assistant", answer)
    await memory.conversation.append(scope, "user", "thanks, one more thing")
    world.model.script(text("Here is the one more thing."))
    reply = await world.runtime.turns().handle(scope, "what did we cover?")
    assert reply.text == "Here is the one more thing."
    assert world.summary_requests == []  # the guard wrote its note without the model
    window = await memory.conversation.unsummarized(scope)
    assert huge.id not in {m.id for m in window}
    assert [m.content for m in window][-3:] == [
        "thanks, one more thing", "what did we cover?", "Here is the one more thing."
    ]  # fmt: skip
    cap = world.runtime.harness.limits.window_cap
    sent = world.model_requests()[-1]
    assert request_tokens(sent, memory.model) < count_tokens(answer, memory.model) // 4
    assert await world.runtime.harness.consolidator.ensure_window(scope, cap) is None  # done


# -- delivering -------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [2_000, 11_000])
def test_delivery_caps_the_parts_and_says_how_much_is_left_out(limit):
    answer = prose(4, LONG_CHARS)
    every = split_message(answer, limit)
    parts = split_for_delivery(answer, limit)
    assert len(every) > MAX_PARTS and len(parts) == MAX_PARTS
    assert all(len(p) <= limit for p in parts)
    assert parts[:-1] == every[: MAX_PARTS - 1]
    shown, note = parts[-1].split("\n\n… (answer truncated here: ")
    assert every[MAX_PARTS - 1].startswith(shown)
    hidden = int(note.split(" more characters")[0].replace(",", ""))
    assert hidden == sum(map(len, every[MAX_PARTS - 1 :])) - len(shown)
    assert note.endswith("ask me to continue)")
    for part in parts:  # every code block is closed in the message that opens it
        fences = [line for line in part.splitlines() if line.strip().startswith(FENCE)]
        assert len(fences) % 2 == 0


def test_delivery_of_a_short_answer_is_plain_splitting():
    answer = prose(5, 9_000)
    assert split_for_delivery(answer, 2_000) == split_message(answer, 2_000)
    assert len(split_for_delivery(answer, 2_000, max_parts=1)) == 1


# -- indexing ---------------------------------------------------------------------------------


class RecordingEmbedder:
    """The test's embedder: the local model, and every text it was asked to embed."""

    def __init__(self, inner) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.texts: list[str] = []

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return await self.inner.embed(texts)


async def test_episodic_memory_embeds_and_keeps_a_bounded_part_of_a_huge_message(memory, tenant):
    embedder = RecordingEmbedder(memory.embedder)
    store = EpisodicStore(memory.redis, embedder)
    await store.open()
    answer = prose(6, LONG_CHARS)
    episode = Episode("msg_huge", "t", role="assistant", text=answer, ts=1.0)
    await store.add(Scope(tenant, "t"), [episode])
    assert 2 <= len(embedder.texts) <= 1 + MAX_PARTS
    assert all(len(t) <= EMBEDDED_CHARS for t in embedder.texts)
    kept = (await memory.redis.hget(store.key(tenant, "msg_huge"), "text")).decode()
    hidden = f"{len(answer) - INDEXED_CHARS:,} more characters"
    assert kept.startswith(answer[:INDEXED_CHARS]) and hidden in kept


# -- summarizing long spans -------------------------------------------------------------------


def windowed_consolidator(world, window: int) -> Consolidator:
    """The consolidator of a model whose context window is `window` tokens."""
    return Consolidator(world.runtime.memory, world.runtime.llm, window=window)


async def test_30000_messages_are_summarized_in_requests_that_fit_the_window(world, tenant):
    scope, memory = Scope(tenant, "t"), world.runtime.memory
    rng = random.Random(7)
    said = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(30_000)]
    for start in range(0, len(said), 1_000):  # the appends of one tick are one pipeline
        await asyncio.gather(*(
            memory.conversation.append(scope, "user" if i % 2 == 0 else "assistant", f"m{i} {s}")
            for i, s in enumerate(said[start : start + 1_000], start)
        ))  # fmt: skip
    roller = windowed_consolidator(world, 4_000)
    (summary,) = await roller.roll(scope, 200)
    requests = world.summary_requests
    assert all(request_tokens(r, memory.model) <= roller.request_tokens for r in requests)
    chunks = [r for r in requests if not r["messages"][1]["content"].startswith(PARTS_HEADER)]
    combining = len(requests) - len(chunks)
    assert combining >= 2  # too many notes for one request: combined level by level
    lines = [line for r in chunks for line in r["messages"][1]["content"].split("\n")]
    messages = {m.id: m for m in await memory.conversation.all(scope)}
    assert lines == [f"[{messages[i].role}] {messages[i].content}" for i in summary.message_ids]
    assert len(summary.message_ids) >= 29_000


async def test_a_few_huge_messages_are_summarized_whole_in_pieces_that_fit(world, tenant):
    scope, memory = Scope(tenant, "t"), world.runtime.memory
    said = [prose(10 + i, 60_000) for i in range(3)]
    for i, content in enumerate(said):
        await memory.conversation.append(scope, "assistant" if i % 2 else "user", content)
    await memory.conversation.append(scope, "user", "and now?")
    roller = windowed_consolidator(world, 8_000)
    result = await roller.summarize_and_store(scope)
    requests = world.summary_requests
    assert all(request_tokens(r, memory.model) <= roller.request_tokens for r in requests)
    chunks = [r["messages"][1]["content"] for r in requests]
    chunks = [c for c in chunks if not c.startswith(PARTS_HEADER)]
    # every piece of every message was sent once, in order: nothing was cut away
    sent = "".join(
        line.removeprefix(CONTINUED) if line.startswith(CONTINUED) else "\n" + line
        for chunk in chunks
        for line in chunk.split("\n")
    )
    expected = "".join(
        "\n" + line
        for m in await memory.conversation.all(scope)
        for line in f"[{m.role}] {m.content}".split("\n")
    )
    assert sent == expected
    assert result.startswith("Stored as [Summary ID:") and "(4 messages)" in result
