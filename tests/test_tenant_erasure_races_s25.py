"""A tenant erasure (memory/governance_tenants.py, `MemoryManager.drop_tenant`) against what runs
beside it: an indexing task writing documents in the middle of it (the drop's order closes every
interleaving), another process that knew the tenant's indexes (it creates them again instead of
failing every read, a day later too, but not during a layout rebuild), the cached
vectors of the tenant's texts (deleted after the drop, so one cached again meanwhile goes too),
a rolling summary whose thread went meanwhile (no usage written back for it; one edited keeps
its usage), and a share read across the erasure (it keeps nothing, queues no turn). Real
Redis; the erasure is held on its way to Redis (tests/support/redis_gate.py), the task inside
its embedding."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from bot.background import BackgroundWork
from bot.consolidation import SUMMARY_INSTRUCTIONS, Consolidator
from bot.upkeep import Upkeep
from memory.connection import connect
from memory.context import ContextLimits
from memory.dead_letters import dead_letters
from memory.embeddings import CachedEmbedder
from memory.governance_purge import message_texts
from memory.governance_tenants import TenantErasures
from memory.keys import (
    INDEX_META_KEY,
    erased_tenant_key,
    forgetting_key,
    task_stream,
    tenant_key,
    turn_queue_key,
    upgrade_key,
    usage_key,
    usage_threads_key,
)
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.conversation import MarkConflict, Message
from memory.stores.turn_records import day_of
from memory.tasks import TaskStream
from tests.agent_world import close_world, open_world
from tests.support.redis_gate import RedisGate
from tests.support.scripted_openai import text
from tests.test_dead_letters_erasure import stream as stream
from tests.test_edit_indexing_race import HeldEmbedder
from tests.test_governance import say, word
from tests.test_platform_deletions import WAIT
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files
from tests.test_shares_after_erasure import QUESTION, dm_of, nothing_taken
from tests.test_turn_recovery_forgotten import episodic_keys


@pytest.fixture
def secret() -> str:
    return f"the vault code is {word()}"


@pytest.fixture
async def upkeep(redis_url: str, local_embedder, secret: str):
    """Upkeep whose embedding of `secret` waits (`HeldEmbedder`), its tasks on its own stream."""
    held = HeldEmbedder(local_embedder, secret)
    client = await connect(redis_url)
    memory = await MemoryManager(client, CachedEmbedder(held, client)).open()
    background = BackgroundWork(TaskStream(client, task_stream(f"s25-{uuid.uuid4().hex[:6]}")))
    upkeep = Upkeep(memory, Consolidator(memory, None), background)
    try:
        yield upkeep, held
    finally:
        held.release.set()
        await background.close()
        await memory.close()


@pytest.fixture
async def gated(redis_url: str, local_embedder):
    """A second process's memory whose Redis commands pass a gate."""
    gate = RedisGate(redis_url)
    client = await connect(await gate.start())
    memory = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    try:
        yield memory, gate
    finally:
        gate.release.set()
        await memory.close()
        await gate.close()


async def test_documents_an_indexing_task_writes_during_the_erasure_do_not_survive_it(
    upkeep, gated, tenant: str, secret: str
):
    (indexer, held), (eraser, gate) = upkeep, gated
    memory = indexer.memory
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    message = await memory.conversation.append(scope, "user", secret)
    # the turn's indexing task has read the message, and is inside its embedding
    task = {"scope": scope.to_dict(), "messages": [asdict(message)]}
    indexing = asyncio.create_task(indexer.index_episodes([task]))
    await asyncio.wait_for(held.entered.wait(), WAIT)

    # the erasure runs up to its scan of the tenant's own keys (the messages still stored)
    gate.hold(tenant_key(tenant, "*").encode())
    erasing = asyncio.create_task(TenantErasures(eraser).erase(tenant))
    await asyncio.wait_for(gate.held.wait(), WAIT)
    # the task writes its documents and checks again: the message is still there
    held.release.set()
    await asyncio.wait_for(indexing, WAIT)
    gate.release.set()
    await asyncio.wait_for(erasing, WAIT)

    assert await episodic_keys(memory, tenant) == []
    assert [k async for k in memory.redis.scan_iter(match=tenant_key(tenant, "*"))] == []


async def test_an_erasure_failing_before_its_drop_leaves_no_erased_note(memory, gated, tenant: str):
    """Its counts read, Redis goes away: nothing was dropped, so the tenant is not noted as
    erased (its queued shares and tasks would be refused for a day)."""
    eraser, gate = gated
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    await say(memory, scope, ["the okapi budget is due friday", "Noted."])
    gate.hold(eraser.episodes.key_prefix(tenant).encode())  # the last count
    erasing = asyncio.create_task(TenantErasures(eraser).erase(tenant))
    await asyncio.wait_for(gate.held.wait(), WAIT)
    gate.cut()
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(erasing, WAIT)
    gate.mend()

    assert not await memory.redis.exists(erased_tenant_key(tenant))
    assert await memory.conversation.all(scope)  # nothing dropped
    await memory.redis.delete(forgetting_key(tenant))  # its lock, left to expire
    await TenantErasures(memory).erase(tenant)


async def test_another_process_reads_and_writes_a_tenant_erased_by_one(
    memory, redis_url: str, local_embedder, tenant: str
):
    client = await connect(redis_url)
    other = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    try:
        scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
        await say(other, scope, ["the okapi budget is due friday", "Noted."])
        await other.workflows.add(scope, "find MemGPT", ["arxiv_search -> success"], "found")
        vector = await other.embedder.embed_one("okapi budget")
        assert await other.episodes.search(scope, "okapi budget", vector)  # its indexes known
        assert await other.workflows.similar(scope, vector)

        await TenantErasures(memory).erase(tenant)  # by this process

        assert await other.episodes.latest(scope) == []
        assert await other.episodes.search(scope, "okapi budget", vector) == []
        assert await other.workflows.similar(scope, vector) == []
        # written again by the other process: indexed and found (the index made again)
        await say(other, scope, ["the okapi budget moved to monday", "Noted."])
        await other.workflows.add(scope, "find okapi", ["arxiv_search -> success"], "found")
        hits = await other.episodes.search(scope, "okapi budget", vector)
        assert [e.text for e in hits if "okapi" in e.text] == ["the okapi budget moved to monday"]
        assert await other.workflows.similar(scope, vector)
    finally:
        await other.close()
        await TenantErasures(memory).erase(tenant)


async def test_the_cached_vectors_of_an_erased_tenants_texts_go_with_it(memory, tenant: str):
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    said = await say(memory, scope, [f"my badge code is {word()}", "Noted."])
    await memory.workflows.add(scope, f"find {word()}", ["arxiv_search -> success"], "found")
    workflow = (await memory.workflows.all(scope))[0]
    texts = [t for m in said for t in message_texts(m)] + [workflow]
    await memory.embedder.embed(texts)  # as turns and their tasks embed them
    keys = [memory.embedder._key(t) for t in texts]
    assert await memory.redis.exists(*keys) == len(set(keys))

    erasure = await TenantErasures(memory).erase(tenant)

    assert await memory.redis.exists(*keys) == 0
    assert erasure.cached_embeddings == len(set(keys))


async def test_a_vector_cached_again_while_the_tenant_is_dropped_goes_too(
    memory, gated, tenant: str
):
    """A task embedding one of the tenant's texts during the drop (its messages read before)
    caches it again: the cached vectors go after the drop, not before it."""
    eraser, gate = gated
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    said = await say(memory, scope, [f"my badge code is {word()}", "Noted."])
    texts = [t for m in said for t in message_texts(m)]
    await memory.embedder.embed(texts)
    keys = [memory.embedder._key(t) for t in texts]

    gate.hold(b"FT.DROPINDEX")  # the drop: the tenant's keys gone, its indexes next
    erasing = asyncio.create_task(TenantErasures(eraser).erase(tenant))
    await asyncio.wait_for(gate.held.wait(), WAIT)
    await memory.embedder.embed(texts)  # an indexing task, as the drop runs
    assert await memory.redis.exists(*keys) == len(set(keys))
    gate.release.set()
    await asyncio.wait_for(erasing, WAIT)

    assert await memory.redis.exists(*keys) == 0


async def test_a_process_reads_a_tenant_erased_over_a_day_before(
    memory, redis_url: str, local_embedder, tenant: str
):
    """Erased long ago (its note gone), the tenant back since: a process that knew its index
    reads it all the same, creating the index again."""
    client = await connect(redis_url)
    other = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    try:
        scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
        await say(other, scope, ["the okapi budget is due friday", "Noted."])
        vector = await other.embedder.embed_one("okapi budget")
        assert await other.episodes.search(scope, "okapi budget", vector)  # its index known

        await TenantErasures(memory).erase(tenant)
        await memory.redis.delete(erased_tenant_key(tenant))  # a day later, the note expired

        assert await other.episodes.latest(scope) == []
        assert await other.episodes.search(scope, "okapi budget", vector) == []
    finally:
        await other.close()
        await TenantErasures(memory).erase(tenant)


async def indexed(memory, tenant: str) -> None:
    """Until Redis has indexed the tenant's stored messages into its episodic index created
    again: FT.CREATE scans the existing keys in the background, and a search meanwhile finds
    only those scanned so far (some, or none, of the tenant's; the wider the keyspace and the
    busier the machine, the longer)."""
    while True:
        info = await memory.episodes.info(tenant)
        if not int(info["indexing"]) and float(info["percent_indexed"]) >= 1:
            return
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("rebuild", ["claimed", "recorded"])
async def test_a_process_creates_no_index_a_layout_rebuild_dropped(
    memory, redis_url: str, local_embedder, tenant: str, rebuild: str
):
    """A newer process rebuilding the indexes for its layout claims the rebuild, drops them all,
    creates them with its fields and records its layout: an older process reading meanwhile
    (the claim held, or the new layout recorded) fails, and creates none with its own layout
    (the rebuilt one would then lack the new fields); once rebuilt, it reads again."""
    client = await connect(redis_url)
    other = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    family = other.episodes.family()
    claim, recorded = upgrade_key(f"index-layout:{family}"), other.episodes._recorded()
    try:
        scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
        await say(other, scope, ["the okapi budget is due friday", "Noted."])
        vector = await other.embedder.embed_one("okapi budget")
        assert await other.episodes.search(scope, "okapi budget", vector)  # its index known
        await memory.redis.set(erased_tenant_key(tenant), "1", ex=60)  # erased once: no matter
        name = other.episodes.index_name(tenant)
        if rebuild == "claimed":
            await memory.redis.set(claim, "newlayout", ex=60)
        else:  # claimed, rebuilt but for this tenant's index yet, and recorded
            await memory.redis.hset(INDEX_META_KEY, family, recorded.replace("#", "#new"))
        await memory.redis.execute_command("FT.DROPINDEX", name)  # as `_rebuild` does

        with pytest.raises(ResponseError):
            await other.episodes.search(scope, "okapi budget", vector)
        with pytest.raises(ResponseError):
            await other.episodes.latest(scope)
        assert name not in await memory.episodes.existing_indexes()

        await memory.redis.hset(INDEX_META_KEY, family, recorded)
        await memory.redis.delete(claim)
        await memory.episodes.info(tenant)  # the rebuilding process creates it again
        await asyncio.wait_for(indexed(memory, tenant), WAIT)
        hits = await other.episodes.search(scope, "okapi budget", vector)
        assert any("okapi" in e.text for e in hits)
    finally:
        await memory.redis.hset(INDEX_META_KEY, family, recorded)
        await memory.redis.delete(claim)
        await other.close()
        await TenantErasures(memory).erase(tenant)


@pytest.mark.parametrize("gone", ["thread", "tenant"])
async def test_a_roll_whose_thread_was_forgotten_meanwhile_writes_no_usage_for_it(
    redis_url: str, tmp_path, tenant: str, gone: str
):
    """The thread forgotten while its summary is written: its call counted to the tenant and
    the day, not to the thread; the whole tenant erased: to neither."""
    world = await open_world(redis_url, tmp_path)
    memory, scope = world.runtime.memory, Scope(tenant, "rolled", "C1")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_summaries(body: dict):
        if body["messages"][0]["content"] != SUMMARY_INSTRUCTIONS:
            return world.route(body)
        asked.set()
        await answer.wait()
        return text(json.dumps({"description": "numbers", "summary": "numbers were said"}))

    world.model.router = held_summaries
    stream = TaskStream(memory.redis, task_stream(f"s25-{uuid.uuid4().hex[:6]}"))
    limits = ContextLimits(memory_tokens=400)  # a window target of 100 tokens
    upkeep = Upkeep(memory, Consolidator(memory, world.runtime.llm), BackgroundWork(stream), limits)
    try:
        for i in range(12):
            await memory.conversation.append(scope, "user", f"number {i} is {word()} " * 4)
        rolling = asyncio.create_task(upkeep.roll_summaries([{"scope": scope.to_dict()}]))
        await asyncio.wait_for(asked.wait(), WAIT)
        if gone == "thread":  # while the model writes
            await memory.governance.forget_thread(tenant, scope.thread)
        else:
            await TenantErasures(memory).erase(tenant)
        answer.set()
        with pytest.raises(MarkConflict):
            await asyncio.wait_for(rolling, WAIT)

        assert not await memory.redis.exists(usage_key(tenant, scope.thread))
        assert await memory.redis.zscore(usage_threads_key(tenant), scope.thread) is None
        tenant_usage = await memory.redis.hgetall(usage_key(tenant))
        day = await memory.redis.hgetall(usage_key(tenant, day=day_of(time.time())))
        if gone == "thread":
            assert int(tenant_usage[b"model_calls"]) >= 1
            assert int(day[b"model_calls"]) >= 1
        else:
            assert tenant_usage == {}
    finally:
        await TenantErasures(memory).erase(tenant)
        await close_world(world)


async def test_a_roll_whose_thread_was_edited_meanwhile_still_counts_its_usage(
    redis_url: str, tmp_path, tenant: str
):
    """A message of the window edited while the summary is written: the roll fails (it runs
    again), but the thread is stored, and the model call made is counted to it."""
    world = await open_world(redis_url, tmp_path)
    memory, scope = world.runtime.memory, Scope(tenant, "edited", "C1")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_summaries(body: dict):
        if body["messages"][0]["content"] != SUMMARY_INSTRUCTIONS:
            return world.route(body)
        asked.set()
        await answer.wait()
        return text(json.dumps({"description": "numbers", "summary": "numbers were said"}))

    world.model.router = held_summaries
    stream = TaskStream(memory.redis, task_stream(f"s25-{uuid.uuid4().hex[:6]}"))
    limits = ContextLimits(memory_tokens=400)  # a window target of 100 tokens
    upkeep = Upkeep(memory, Consolidator(memory, world.runtime.llm), BackgroundWork(stream), limits)
    try:
        for i in range(12):
            await memory.conversation.append(scope, "user", f"number {i} is {word()} " * 4)
        rolling = asyncio.create_task(upkeep.roll_summaries([{"scope": scope.to_dict()}]))
        await asyncio.wait_for(asked.wait(), WAIT)
        raw = await memory.redis.lindex(memory.conversation.key(scope), 0)
        edited = Message.from_json(raw)
        edited.content = "number 0 is an edited number"
        changes = {scope.thread: [(0, raw.decode(), edited.to_json())]}
        assert await memory.conversation.replace(tenant, changes) == {}  # while the model writes
        answer.set()
        with pytest.raises(MarkConflict):
            await asyncio.wait_for(rolling, WAIT)

        usage = await memory.redis.hgetall(usage_key(tenant, scope.thread))
        assert int(usage[b"model_calls"]) >= 1
        assert await memory.redis.zscore(usage_threads_key(tenant), scope.thread)
    finally:
        await TenantErasures(memory).erase(tenant)
        await close_world(world)


async def test_a_task_given_up_after_its_tenants_erasure_leaves_no_dead_letter(
    memory, stream: TaskStream, tenant: str
):
    """Queued and read before the erasure, on its last delivery during it: buried after."""
    scope = Scope(tenant, "t1", "C1")
    await stream.add("episodes", {"scope": scope.to_dict(), "messages": [], "tag": "before"})
    [task] = await stream.read(count=1, block_ms=100)
    await TenantErasures(memory).erase(tenant)
    await stream.dead_letter(task, "boom")
    # one queued after the erasure (the workspace in use again) is kept as ever
    await stream.add("episodes", {"scope": scope.to_dict(), "messages": [], "tag": "after"})
    [later] = await stream.read(count=1, block_ms=100)
    await stream.dead_letter(later, "boom")

    assert [d.payload["tag"] for d in await dead_letters(stream)] == ["after"]
    assert await stream.pending_count() == 0  # the first was acknowledged all the same
    await TenantErasures(memory).erase(tenant)


async def test_a_share_queued_before_its_tenants_erasure_is_not_read_after_it(memory, tenant):
    end = StubEnd(shared_pdf("Secret Paper"))
    files = stub_files(memory, end)
    scope = dm_of(tenant, "U1")
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await TenantErasures(memory).erase(tenant)
    try:
        await files.one(payload)
        assert await nothing_taken(memory, end, scope)
        again = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
        again.update(queued_at=time.time(), sharer="U1")  # shared anew after it: read
        await files.one(again)
        assert len(await memory.knowledge_base.papers(scope)) == 1
    finally:
        await TenantErasures(memory).erase(tenant)


class ErasingEnd(StubEnd):
    """A platform whose download returns once the share's whole tenant was erased: the read
    spans the erasure (the end is the test's, no code of ours patched)."""

    def __init__(self, data: bytes, memory, tenant: str) -> None:
        super().__init__(data)
        self.memory, self.tenant = memory, tenant

    async def fetch(self, file, max_bytes):
        await TenantErasures(self.memory).erase(self.tenant)
        return await super().fetch(file, max_bytes)


async def test_a_share_read_across_its_tenants_erasure_keeps_nothing(memory, tenant):
    end = ErasingEnd(shared_pdf("Secret Paper"), memory, tenant)
    files = stub_files(memory, end)
    scope = dm_of(tenant, "U1")
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    try:
        await files.one(payload)  # the PDF saved after the drop
        assert await memory.knowledge_base.papers(scope, everywhere=True) == []
        assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 0
        lock = forgetting_key(tenant)
        left = [k async for k in memory.redis.scan_iter(match=tenant_key(tenant, "*"))]
        assert [k for k in left if k.decode() != lock] == []
        assert await episodic_keys(memory, tenant) == []
        chunks = memory.knowledge_base.key_prefix(tenant)
        assert [k async for k in memory.redis.scan_iter(match=f"{chunks}*")] == []
        await files.one(payload)  # delivered again: nothing read, nothing queued
        assert await memory.knowledge_base.papers(scope, everywhere=True) == []
    finally:
        await TenantErasures(memory).erase(tenant)
