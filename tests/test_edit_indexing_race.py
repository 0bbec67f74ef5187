"""An indexing task that embeds a message's old text while that message's edit is followed:
the edit replaces the text, takes the old one out and indexes the new one; the task then
writes the old text over it. Its check after writing (bot/upkeep.py `_take_out`) must take
out what it wrote and leave the new text indexed. The race is made for real: the task is
held inside its embedding (an embedding backend that waits) while the edit runs."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, replace

import numpy as np
import pytest

from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import Upkeep
from memory.connection import connect
from memory.embeddings import CachedEmbedder, Embedder
from memory.governance_purge import message_texts
from memory.keys import task_stream
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.base import decode
from memory.tasks import TaskStream
from tests.test_platform_deletions import WAIT, found


class HeldEmbedder:
    """The local model; a call that embeds a text containing `held` waits for `release`
    first (announcing it with `entered`), so a test can act while a task is inside it."""

    def __init__(self, inner: Embedder, held: str) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.held = held
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def embed(self, texts: list[str]) -> np.ndarray:
        if any(self.held in text for text in texts):
            self.entered.set()
            await self.release.wait()
        return await self.inner.embed(texts)


@pytest.fixture
def old() -> str:
    """The text the message is edited from: written by no other test."""
    return f"what about the zebra{uuid.uuid4().hex[:8]} budget"


@pytest.fixture
async def held(local_embedder, old: str) -> HeldEmbedder:
    return HeldEmbedder(local_embedder, old)


@pytest.fixture
async def upkeep(redis_url: str, held: HeldEmbedder):
    """Upkeep over a memory whose embedding backend is `held`, its tasks on its own stream."""
    client = await connect(redis_url)
    memory = await MemoryManager(client, CachedEmbedder(held, client)).open()
    stream = TaskStream(client, task_stream(f"edit-race-{uuid.uuid4().hex[:6]}"))
    background = BackgroundWork(stream)
    upkeep = Upkeep(memory, Consolidator(memory, None), background)
    background.handle(upkeep.handlers())
    try:
        yield upkeep
    finally:
        held.release.set()
        await background.close()
        await memory.close()


async def episodic_texts(memory, tenant: str) -> list[str]:
    """The text of every episodic document of the tenant (messages and parts), from Redis."""
    prefix = memory.episodes.key_prefix(tenant)
    keys = [key async for key in memory.redis.scan_iter(match=f"{prefix}*")]
    return [decode(await memory.redis.hget(key, "text")) or "" for key in keys]


async def test_an_old_text_written_while_its_edit_was_followed_is_taken_out(
    upkeep: Upkeep, held: HeldEmbedder, old: str, tenant: str
):
    memory, background = upkeep.memory, upkeep.background
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    new = f"what about the okapi{uuid.uuid4().hex[:8]} grant"
    source = "C1:1700000002.000000"
    message = await memory.conversation.append(scope, "user", old, source=source)

    # the turn's indexing task, held inside its embedding of the old text
    task = {"scope": scope.to_dict(), "messages": [asdict(message)]}
    indexing = asyncio.create_task(upkeep.index_episodes([task]))
    await asyncio.wait_for(held.entered.wait(), WAIT)

    # meanwhile the edit is followed to completion: the new text stored and indexed
    await upkeep.message_edited(tenant, {scope.thread: "C1"}, source, new, time.time())
    await background.drain()
    assert [m.content for m in await memory.conversation.all(scope)] == [new]
    assert await episodic_texts(memory, tenant) == [new]
    assert not indexing.done()

    # released: the task writes the old text (over the new one), then checks again
    held.release.set()
    await asyncio.wait_for(indexing, WAIT)
    await background.drain()

    assert await episodic_texts(memory, tenant) == [new]
    # the old text's vectors, embedded and cached by the task after the edit, are gone too
    said = message_texts(replace(message, content=old))  # the message, as its episode
    assert [await memory.redis.exists(memory.embedder._key(t)) for t in said] == [0] * len(said)
    hits = await found(memory, scope, f"{old} {new}")
    assert new in hits and not any(old.split()[-2] in hit for hit in hits)
