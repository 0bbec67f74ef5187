"""What a turn taught goes with its question, through failures and late writes
(memory/governance_learned.py): a forget that fails half-way is redone whole; a background
write that learned from an edited or forgotten question's text, late or delivered again, leaves
nothing of it; an import keeps the per-question records; no line an entity ever had stays in
the embedding cache. Real Redis, scripted model; failures come from an injected embedder."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import numpy as np
import pytest

from bot.harness import ENTITY_INSTRUCTIONS
from bot.upkeep import ARTIFACTS
from memory.connection import connect
from memory.embeddings import CachedEmbedder
from memory.manager import MemoryManager
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_governance_learned import KESTREL, ask, kestrel, workflow_queries

WAIT = 30.0  # seconds a test waits for the background before it gives up


class FaultyEmbedder:
    """An embedding backend that holds its next call until `release` is set (when `holding`),
    then answers it, and fails the next `failures` calls after it, as an embedding service
    that stalls or is down."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.failures = 0
        self.holding = False
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def embed(self, texts: list[str]) -> np.ndarray:
        if self.holding:
            self.holding = False
            self.held.set()
            await self.release.wait()
            return await self.inner.embed(texts)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the embedding service is down")
        return await self.inner.embed(texts)


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def until(check) -> None:
    """Wait (bounded) until the background made `check()` true."""
    async with asyncio.timeout(WAIT):
        while not await check():
            await asyncio.sleep(0.02)


async def pieces(world, tenant: str) -> list[str]:
    return [e.description for e in await kestrel(world, tenant)]


async def stored_question(world, scope: Scope, question: str, taught: str):
    """A question stored in `scope`, and its turn's background task (no tools), which teaches
    `taught` of Kestrel: the task as a turn queues it, and the stored question."""
    stored = await world.runtime.memory.conversation.append(scope, "user", question)
    task = {
        "scope": scope.to_dict(), "question": question, "answer": "Kestrel: yes.",
        "steps": [], "turn": "", "asked": {"id": stored.id, "seq": stored.seq, "text": question},
    }  # fmt: skip
    world.entities = [{"name": KESTREL, "type": "system", "description": taught}]
    return task, stored


def lessons(world, held: asyncio.Event, release: asyncio.Event):
    """The model's entity extraction: the zebra text teaches a zebra piece (held until
    `release`), any other text an okapi one."""

    async def route(body: dict[str, Any]):
        if body["messages"][0]["content"] != ENTITY_INSTRUCTIONS:
            return world.route(body)
        exchange = body["messages"][-1]["content"]
        piece = "An okapi grant."
        if "zebra" in exchange:
            held.set()
            await release.wait()
            piece = "A zebra farm."
        return text(json.dumps([{"name": KESTREL, "type": "system", "description": piece}]))

    return route


async def a_zebra_turn(world, scope: Scope) -> tuple[asyncio.Event, asyncio.Event]:
    """A turn asked "Is Kestrel a zebra?" whose entity extraction is held; (held, release)."""
    held, release = asyncio.Event(), asyncio.Event()
    world.model.router = lessons(world, held, release)
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": KESTREL})), text("Kestrel: ok.")
    )
    await world.agent.run_turn(scope, "Is Kestrel a zebra?", source="C1:9.1")
    async with asyncio.timeout(WAIT):
        await held.wait()
    return held, release


async def edit_to_okapi(world, tenant: str) -> None:
    await world.runtime.harness.upkeep.message_edited(
        tenant, {"t": "C1"}, "C1:9.1", "Is Kestrel an okapi grant?", time.time()
    )


async def test_a_forget_that_fails_half_way_is_redone_whole(world, tenant, redis_url):
    """The lessons go before the thread: a failure leaves the thread, and Forget thread again
    finds its questions."""
    await ask(world, Scope(tenant, "ta", user="U1"), "What is Kestrel billing?", "Bills monthly.")
    await ask(world, Scope(tenant, "tb", user="U2"), "Does Kestrel page?", "Pages at night.")
    faulty = FaultyEmbedder(world.runtime.memory.embedder.inner)
    client = await connect(redis_url)
    memory = await MemoryManager(client, CachedEmbedder(faulty, client)).open()
    try:
        faulty.failures = 1  # rebuilding Kestrel without the thread's piece fails once
        with pytest.raises(ConnectionError):
            await memory.governance.forget_thread(tenant, "ta")
        erasure = await memory.governance.forget_thread(tenant, "ta")
    finally:
        await memory.close()
    assert erasure.messages > 0
    assert await pieces(world, tenant) == ["Pages at night."]
    assert await workflow_queries(world, tenant) == ["QUERY: Does Kestrel page?"]


async def test_an_edit_followed_while_the_old_text_is_learned_leaves_only_the_new(world, tenant):
    scope = Scope(tenant, "t", "C1", user="U1")
    _, release = await a_zebra_turn(world, scope)
    await edit_to_okapi(world, tenant)  # followed while the old text's extraction is held
    await until(lambda: pieces_are(world, tenant, ["An okapi grant."]))
    release.set()
    await world.runtime.harness.drain()
    assert await pieces(world, tenant) == ["An okapi grant."]
    assert await workflow_queries(world, tenant) == ["QUERY: Is Kestrel an okapi grant?"]


async def pieces_are(world, tenant: str, expected: list[str]) -> bool:
    return await pieces(world, tenant) == expected


async def test_the_old_texts_task_delivered_again_after_the_edit_brings_nothing_back(world, tenant):
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    _, release = await a_zebra_turn(world, scope)
    entries = await harness.memory.redis.xrange(harness.background.stream.stream)
    [task] = [
        json.loads(fields[b"payload"])
        for _, fields in entries
        if fields[b"kind"] == ARTIFACTS.encode()
    ]  # the turn's task, as queued (it is in hand: held)
    release.set()
    await harness.drain()
    assert await pieces(world, tenant) == ["A zebra farm."]
    await edit_to_okapi(world, tenant)
    await harness.drain()
    assert await pieces(world, tenant) == ["An okapi grant."]

    await harness.write_artifacts([task])  # delivered again (a lost acknowledgement)
    assert await pieces(world, tenant) == ["An okapi grant."]
    assert await workflow_queries(world, tenant) == ["QUERY: Is Kestrel an okapi grant?"]


async def test_a_forgotten_questions_piece_goes_when_its_failed_discard_is_delivered_again(
    world, tenant
):
    memory, harness = world.runtime.memory, world.runtime.harness
    await ask(world, Scope(tenant, "tb", user="U2"), "Does Kestrel page?", "Pages at night.")
    scope = Scope(tenant, "ta", user="U1")
    question = "Is Kestrel our secret launch?"
    task, stored = await stored_question(world, scope, question, "A secret launch.")
    faulty = FaultyEmbedder(memory.entities.line_embedder)
    memory.entities.line_embedder = faulty  # the entity lines' embedding backend
    faulty.holding = True  # the piece's write waits while the question is forgotten
    first = asyncio.create_task(harness.write_artifacts([task]))
    async with asyncio.timeout(WAIT):
        await faulty.held.wait()
    await memory.governance.forget_message(tenant, "ta", stored.id)
    faulty.failures = 1  # the piece is written, then taking it out fails
    faulty.release.set()
    with pytest.raises(ConnectionError):
        await first
    assert await pieces(world, tenant) == ["Pages at night. A secret launch."]

    await harness.write_artifacts([task])  # delivered again
    assert await pieces(world, tenant) == ["Pages at night."]


async def test_an_import_keeps_what_each_question_taught(world, tenant, other):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", user="U1")
    asked = await ask(world, scope, "What is Kestrel?", "A billing service.")
    await ask(world, scope, "Does Kestrel page?", "Pages at night.")
    records = [json.loads(json.dumps(r)) async for r in memory.portability.export_tenant(tenant)]
    await memory.portability.import_records(other, records)
    assert await pieces(world, other) == ["A billing service. Pages at night."]

    erasure = await memory.governance.forget_message(other, "t", asked)
    assert (erasure.entities, erasure.workflows) == (1, 1)
    assert await pieces(world, other) == ["Pages at night."]
    assert await workflow_queries(world, other) == ["QUERY: Does Kestrel page?"]


@pytest.fixture
def other() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def test_no_line_an_entity_had_stays_in_the_embedding_cache(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", user="U1")
    first = await ask(world, scope, "What is Kestrel billing?", "Bills monthly.")
    lines = [e.line() for e in await kestrel(world, tenant)]
    second = await ask(world, scope, "Does Kestrel page?", "Pages at night.")
    lines += [e.line() for e in await kestrel(world, tenant)]
    await memory.governance.forget_message(tenant, "t", first)
    lines += [e.line() for e in await kestrel(world, tenant)]
    await memory.governance.forget_message(tenant, "t", second)
    assert await kestrel(world, tenant) == [] and len(set(lines)) == 3
    cached = memory.embedder
    assert not await memory.redis.exists(*(cached._key(line) for line in lines))


async def test_reindexing_entities_caches_none_of_their_lines(world, tenant):
    memory = world.runtime.memory
    await ask(world, Scope(tenant, "t", user="U1"), "What is Kestrel billing?", "Bills monthly.")
    [entity] = await kestrel(world, tenant)
    assert await memory.entities.reindex() >= 1  # `arxivscout reindex`
    assert not await memory.redis.exists(memory.embedder._key(entity.line()))


async def held_write(world, tenant: str, user: str, secret: str):
    """A turn's background write for a new question, held just after it noted what it teaches
    (its entity line is being embedded): the task, the stored question and the release."""
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, f"t-{user}", user=user)
    question = f"Is Kestrel {secret}?"
    task, stored = await stored_question(world, scope, question, f"{secret}.")
    faulty = FaultyEmbedder(memory.entities.line_embedder)
    memory.entities.line_embedder = faulty
    faulty.holding = True
    running = asyncio.create_task(harness.write_artifacts([task]))
    async with asyncio.timeout(WAIT):
        await faulty.held.wait()
    return running, stored, faulty.release


async def test_a_write_noted_before_a_forget_that_lands_after_its_lessons_went_is_undone(
    world, tenant
):
    """The forget took the question's lessons before the write landed, and the write checks
    before the message is a tombstone: the record's mark tells it, and it takes its piece out."""
    memory = world.runtime.memory
    await ask(world, Scope(tenant, "tb", user="U2"), "Does Kestrel page?", "Pages at night.")
    running, stored, release = await held_write(world, tenant, "U1", "A secret launch")
    await memory.governance.learned.forget(tenant, [stored.id])  # a forget's first step
    release.set()
    await running
    assert await pieces(world, tenant) == ["Pages at night."]


async def test_a_write_landing_after_its_authors_erasure_is_undone(world, tenant):
    memory = world.runtime.memory
    await ask(world, Scope(tenant, "tb", user="U2"), "Does Kestrel page?", "Pages at night.")
    running, _, release = await held_write(world, tenant, "U1", "A secret launch")
    await memory.governance.forget_person(tenant, "U1")
    release.set()
    await running
    assert "secret" not in " ".join(await pieces(world, tenant))


async def test_a_task_delivered_again_does_not_undo_an_edit_on_the_memory_page(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "ta", user="U1")
    question = "Is Kestrel a launch?"
    task, _ = await stored_question(world, scope, question, "A secret launch.")
    await harness.write_artifacts([task])
    key = memory.entities.key(scope, KESTREL)
    await memory.governance.edit_entity(
        tenant, key.removeprefix(memory.entities.key_prefix(tenant)), "A public tool."
    )
    await harness.write_artifacts([task])  # its batch delivered again (another task failed)
    assert await pieces(world, tenant) == ["A public tool."]


async def test_a_query_rewrite_never_brings_back_a_workflow_deleted_meanwhile(world, tenant):
    """The background's QUERY rewrite read the workflow, then a forget deleted it: the rewrite
    (a compare-and-set) writes nothing, rather than re-create it without its question."""
    memory = world.runtime.memory
    asked = await ask(world, Scope(tenant, "t", user="U1"), "Is Kestrel a zebra?", "A zebra farm.")
    prefix = memory.workflows.key_prefix(tenant)
    [key] = [
        k for k in await memory.governance.learned.taught(tenant, asked) if k.startswith(prefix)
    ]
    old = (await memory.redis.hget(key, "text")).decode()
    await memory.governance.forget_message(tenant, "t", asked)
    assert not await memory.redis.exists(key)
    new = old.replace("Is Kestrel a zebra?", "Is Kestrel an okapi?")
    assert not await memory.workflows.requery(key, asked, old, new)
    assert not await memory.redis.exists(key)
