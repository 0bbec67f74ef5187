"""A summary of a thread of several people keeps who said what: the deterministic note names
each speaker, the model is asked over lines that name them, and an expanded summary shows each
original message with its speaker and its date (UTC, whatever the host's time zone).

A real Redis, the real consolidator, and the scripted model (tests/agent_world.py)."""

from __future__ import annotations

import os
import time

import pytest

from bot.consolidation import Consolidator
from memory.scope import Scope, Visibility
from tests.agent_world import close_world, open_world

WHEN = 1_700_000_000.0  # 2023-11-14 22:13 UTC; 2023-11-15 07:13 in Tokyo


@pytest.fixture
def tokyo():
    """The host's local time zone is Tokyo's, so a note dated in local time would show it."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def three_voices(memory, tenant: str) -> Scope:
    """Ada asks, Bo answers, the assistant adds to it: one public thread."""
    thread = f"slack:{tenant}:C1:1.1"
    ada = Scope(tenant, thread, "C1", Visibility.PUBLIC, "U1", "Ada")
    bo = Scope(tenant, thread, "C1", Visibility.PUBLIC, "U2", "Bo")
    await memory.conversation.append(ada, "user", "Who reviews the MemGPT draft?", timestamp=WHEN)
    await memory.conversation.append(bo, "user", "I will review it by Friday.", timestamp=WHEN + 60)
    await memory.conversation.append(ada, "assistant", "Noted: Bo reviews it.", timestamp=WHEN + 61)
    return ada


async def test_the_deterministic_note_and_its_expansion_name_speakers_and_utc(
    memory, tenant, tokyo
):
    scope = await three_voices(memory, tenant)
    consolidator = Consolidator(memory, None)
    try:
        summary = await consolidator.compact(scope)
        assert summary is not None
        assert summary.description.startswith("Compacted 3 messages from 2023-11-14 22:13 UTC:")
        assert summary.text.split("\n") == [
            "[Ada] Who reviews the MemGPT draft?",
            "[Bo] I will review it by Friday.",
            "[assistant] Noted: Bo reviews it.",
        ]
        expanded = await consolidator.expand_summary(scope, summary.id)
        assert (
            "[2023-11-14 22:13 UTC] [Ada] Who reviews the MemGPT draft?\n"
            "[2023-11-14 22:14 UTC] [Bo] I will review it by Friday.\n"
            "[2023-11-14 22:14 UTC] [assistant] Noted: Bo reviews it.\n"
        ) in expanded
    finally:
        await memory.drop_tenant(tenant)


async def test_the_model_is_asked_over_named_lines_and_the_expansion_names_them(world, tenant):
    memory = world.runtime.memory
    scope = await three_voices(memory, tenant)
    consolidator = Consolidator(memory, world.runtime.llm)
    try:
        stored = await consolidator.summarize_and_store(scope)
        assert stored.startswith("Stored as [Summary ID: ")
        (request,) = world.summary_requests
        assert request["messages"][1]["content"] == (
            "[Ada] Who reviews the MemGPT draft?\n"
            "[Bo] I will review it by Friday.\n"
            "[assistant] Noted: Bo reviews it."
        )
        summary_id = stored.split("[Summary ID: ")[1].split("]")[0]
        expanded = await consolidator.expand_summary(scope, summary_id)
        assert "[2023-11-14 22:13 UTC] [Ada] Who reviews" in expanded
        assert "[2023-11-14 22:14 UTC] [Bo] I will review" in expanded
    finally:
        await memory.drop_tenant(tenant)
