"""`search_conversations` by date and person: the model is told today's date (UTC, as the tools'
days are), dates in the wrong order are an error it can read, an empty query lists the latest
matching messages without embedding "", and "assistant" (how the bot's lines are shown) finds
the bot's own messages."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import numpy as np
import pytest

from bot.prompt import agent_system_prompt
from bot.tools import ToolContext, search_conversations
from memory.connection import connect
from memory.embeddings import CachedEmbedder
from memory.manager import MemoryManager
from memory.scope import Scope, Visibility
from memory.stores.episodic import Episode
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text

DAY = 86_400.0
START = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()  # day i is 2024-03-0{i + 1}
THREAD = "t-general"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


class RecordingEmbedder:
    """The local model as the tests' embedder, and every text it was asked to embed (an
    OpenAI embedder would refuse "")."""

    def __init__(self, inner) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.texts: list[str] = []

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return await self.inner.embed(texts)


@pytest.fixture
async def recorded(redis_url, local_embedder):
    client = await connect(redis_url)
    embedder = RecordingEmbedder(CachedEmbedder(local_embedder, client))
    manager = await MemoryManager(client, embedder).open()
    yield manager, embedder
    await manager.close()


def _said(i: int, day: int, text: str, author: str = "", name: str = "") -> Episode:
    return Episode(
        id=f"m-{i}", thread=THREAD, channel="general", author=author, author_name=name,
        role="user" if author else "assistant", text=f"{text} ({i})", ts=START + day * DAY,
        seq=i,
    )  # fmt: skip


LONG = (
    "Budget numbers are final. The review moves to Tuesday. Please bring the slides. "
    "We also need a new projector."
)
SAID = [
    _said(0, 0, "Ana: the okapi cluster is down again.", "U0ANA", "Ana Lima"),
    _said(1, 1, "Lunch is at noon on Friday.", "U0ANA", "Ana Lima"),
    _said(2, 1, "I booked the big room.", "U0BEN", "Ben Okafor"),
    _said(3, 2, "The draft of the grant is in the shared folder.", "U0ANA", "Ana Lima"),
    _said(4, 2, "I found three papers on paging for you."),  # the bot's
    _said(5, 3, LONG, "U0ANA", "Ana Lima"),  # stored with its parts
    _said(6, 4, "See you all next week.", "U0ANA", "Ana Lima"),
]


async def seeded(memory: MemoryManager, tenant: str) -> ToolContext:
    scope = Scope(tenant, THREAD, channel="general", visibility=Visibility.PUBLIC)
    await memory.episodes.add(Scope(tenant), SAID)
    return ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None)  # type: ignore[arg-type]


async def test_the_model_is_told_today_s_date_in_utc(world, tenant):
    world.model.script(text("Hello."))
    before = time.strftime("%Y-%m-%d", time.gmtime())
    await world.agent.run_turn(Scope(tenant, "t"), "What happened last week?")
    after = time.strftime("%Y-%m-%d", time.gmtime())
    system = world.model_requests()[-1]["messages"][0]["content"]
    assert any(f"Today is {day} (UTC)." in system for day in {before, after}), system[-200:]


def test_the_system_prompt_is_the_same_all_day():
    """It changes once a day, at midnight UTC, so a cached prompt prefix holds all day."""
    assert agent_system_prompt(START) == agent_system_prompt(START - 9 * 3600 + DAY - 1)
    assert "Today is 2024-03-01 (UTC)." in agent_system_prompt(START)
    assert "Today is 2024-03-02 (UTC)." in agent_system_prompt(START - 9 * 3600 + DAY)


async def test_dates_are_utc_days_and_a_reversed_range_is_an_error(world, tenant):
    ctx = await seeded(world.runtime.memory, tenant)
    harness = world.runtime.harness
    (schema,) = harness.toolbox.schemas(["search_conversations"])
    params = schema["function"]["parameters"]["properties"]
    assert "UTC" in params["since"]["description"] and "UTC" in params["until"]["description"]
    reversed_range = await harness.toolbox.execute(
        "search_conversations",
        '{"query": "grant", "since": "2024-03-05", "until": "2024-03-01"}',
        harness.tool_context(ctx.scope),
    )
    assert reversed_range.status == "error"
    assert "since (2024-03-05) is after until (2024-03-01)" in reversed_range.output


async def test_an_empty_query_lists_the_latest_matches_without_embedding(recorded, tenant):
    memory, embedder = recorded
    ctx = await seeded(memory, tenant)
    embedder.texts.clear()
    found = await search_conversations(
        ctx, "", author="Ana", since="2024-03-02", until="2024-03-04", k=2
    )
    assert "(5)" in found and "(3)" in found  # Ana's newest two in those days
    for older_or_others in ("(0)", "(1)", "(2)", "(4)", "(6)"):
        assert older_or_others not in found, found
    assert found.count("(5)") == 1  # once, however many parts it is stored with
    assert "" not in embedder.texts  # an OpenAI embedder would refuse it

    everyone = await search_conversations(ctx, "  ", since="2024-03-02", k=30)
    assert all(f"({i})" in everyone for i in range(1, 7)) and "(0)" not in everyone
    assert ctx.shown_messages >= {f"m-{i}" for i in range(1, 7)}  # its log is found by them


async def test_assistant_names_the_bot_s_own_messages(memory, tenant):
    ctx = await seeded(memory, tenant)
    for name in ("assistant", "Assistant"):
        found = await search_conversations(ctx, "papers on paging", author=name)
        assert "(4)" in found, (name, found)
        assert all(f"({i})" not in found for i in (0, 1, 2, 3, 5, 6)), found
    listed = await search_conversations(ctx, "", author="assistant")
    assert "(4)" in listed and "(3)" not in listed


async def test_the_query_may_be_left_out(world, tenant):
    """The model may call it with filters only, as the docstring offers: no query, the latest."""
    ctx = await seeded(world.runtime.memory, tenant)
    harness = world.runtime.harness
    (schema,) = harness.toolbox.schemas(["search_conversations"])
    assert "query" not in schema["function"]["parameters"]["required"]
    listed = await harness.toolbox.execute(
        "search_conversations", '{"author": "Ana", "since": "2024-03-05"}',
        harness.tool_context(ctx.scope),
    )  # fmt: skip
    assert listed.status == "success", listed.output
    assert "(6)" in listed.output and "(5)" not in listed.output
