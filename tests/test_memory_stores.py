"""Every store's writes and reads against the real embedded Redis, and tenant isolation."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from memory.connection import connect
from memory.keys import INDEX_META_KEY, InvalidName
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.base import vector_bytes
from memory.stores.conversation import InvalidMessage
from memory.stores.entity import Entity
from memory.stores.knowledge_base import Chunk, KnowledgeBase, Paper
from memory.stores.summary import Summary, UnknownSummary
from memory.stores.tool_log import ToolLogEntry, UnknownToolLog
from memory.stores.workflow import WorkflowStore

MEMGPT = Paper(
    arxiv_id="2310.08560v2",
    title="MemGPT: Towards LLMs as Operating Systems",
    authors=["Charles Packer", "Sarah Wooders"],
    published="2023-10-12",
    categories=["cs.AI"],
)
TEXTS = [
    "MemGPT manages a hierarchy of memory tiers, paging context in and out like an operating system.",
    "Virtual context management lets a fixed-window language model appear to have unbounded memory.",
    "We evaluate on document analysis and multi-session chat.",
]


async def add_memgpt(memory, tenant: str) -> None:
    vectors = await memory.embedder.embed(TEXTS)
    chunks = [Chunk(text, "Introduction", i) for i, text in enumerate(TEXTS)]
    await memory.knowledge_base.add_paper(Scope(tenant), MEMGPT, chunks, vectors)


async def test_conversation_round_trip(memory, tenant):
    scope = Scope(tenant, "t1")
    await memory.conversation.append(scope, "user", "Can you get me the paper MemGPT")
    await memory.conversation.append(scope, "assistant", "Here it is: arXiv 2310.08560")
    messages = await memory.conversation.all(scope)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "Can you get me the paper MemGPT"
    assert all(m.thread_id == "t1" and not m.summary_id for m in messages)
    assert [t for t, _ in await memory.conversation.threads(tenant)] == ["t1"]
    segment = memory.conversation.segment(messages).render()
    assert segment.startswith("## Conversation Memory\n")
    assert "[user] Can you get me the paper MemGPT" in segment


async def test_an_append_run_again_returns_the_message_stored_the_first_time(memory, tenant):
    """A job run again (a process took it over) appends with the same `once` key: nothing is
    stored twice, and the caller gets the stored message (its id indexes it, its turn record
    names it), as it is now."""
    scope = Scope(tenant, "t-once")
    await memory.conversation.append(scope, "user", "before")
    first = await memory.conversation.append(scope, "user", "walruses?", once="job-1:question")
    again = await memory.conversation.append(scope, "user", "seals?", once="job-1:question")
    assert (again.id, again.seq, again.content, again.duplicate) == (
        first.id, first.seq, "walruses?", True
    )  # fmt: skip
    assert [m.content for m in await memory.conversation.all(scope)] == ["before", "walruses?"]


async def test_recent_conversation_is_bounded_and_oldest_first(memory, tenant):
    scope = Scope(tenant, "t")
    for i in range(30):
        await memory.conversation.append(scope, "user", f"message {i}")
    recent = await memory.conversation.recent_unsummarized(scope, limit=10)
    assert [m.content for m in recent] == [f"message {i}" for i in range(20, 30)]


@pytest.mark.parametrize("content", ["", "   ", "x" * 200_001])
async def test_bad_messages_are_refused_and_store_nothing(memory, tenant, content):
    scope = Scope(tenant, "t")
    with pytest.raises(InvalidMessage):
        await memory.conversation.append(scope, "user", content)
    assert await memory.conversation.all(scope) == []


async def test_invalid_utf8_is_stored_cleanly(memory, tenant):
    text = b"caf\xe9 and \xff bytes".decode("utf-8", "surrogateescape")
    scope = Scope(tenant, "t")
    message = await memory.conversation.append(scope, "user", text)
    stored = (await memory.conversation.all(scope))[0]
    assert stored.content == message.content
    assert "caf" in stored.content and "bytes" in stored.content


async def test_bad_tenant_and_thread_names(memory):
    with pytest.raises(InvalidName):
        await memory.conversation.append(Scope("bad tenant!", "t"), "user", "hi")
    with pytest.raises(InvalidName):
        await memory.conversation.append(Scope("ok", ""), "user", "hi")


async def test_fifty_concurrent_writers_lose_nothing_and_keep_order(memory, tenant):
    scope = Scope(tenant, "busy")

    async def writer(w: int) -> None:
        for i in range(20):
            await memory.conversation.append(scope, "user", f"w{w}:{i}")

    await asyncio.gather(*(writer(w) for w in range(50)))
    messages = await memory.conversation.all(scope)
    assert len(messages) == 1000
    by_writer: dict[str, list[int]] = {}
    for m in messages:
        w, i = m.content.split(":")
        by_writer.setdefault(w, []).append(int(i))
    assert len(by_writer) == 50
    assert all(seq == list(range(20)) for seq in by_writer.values())


async def test_summary_marking_is_atomic_with_new_messages(memory, tenant):
    scope = Scope(tenant, "t")
    for text in ("first", "second"):
        await memory.conversation.append(scope, "user", text)
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    # a message arrives while the summary is being written
    await memory.conversation.append(scope, "user", "arrived meanwhile")
    ids = await memory.conversation.mark_summarized(scope, first, raw, "sum_x")
    messages = await memory.conversation.all(scope)
    assert [m.summary_id for m in messages] == ["sum_x", "sum_x", ""]
    assert ids == [m.id for m in messages[:2]]
    recent = await memory.conversation.recent_unsummarized(scope)
    assert [m.content for m in recent] == ["arrived meanwhile"]
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    assert first == 2 and len(raw) == 1


async def test_knowledge_base_hybrid_search_and_filters(memory, tenant):
    scope = Scope(tenant)
    await add_memgpt(memory, tenant)
    assert await memory.knowledge_base.has_paper(scope, "2310.08560")
    assert await memory.knowledge_base.has_paper(scope, "2310.08560v1")
    question = "How does MemGPT manage memory tiers?"
    vector = await memory.embedder.embed_one(question)
    passages = await memory.knowledge_base.search(scope, question, vector, k=2)
    assert passages[0].content == TEXTS[0]
    assert passages[0].arxiv_id == "2310.08560" and passages[0].year == 2023
    assert "arxiv.org/abs/2310.08560" in passages[0].url
    search = memory.knowledge_base.search
    assert await search(scope, question, vector, arxiv_id="2310.08560")
    assert await search(scope, question, vector, author="Charles Packer")
    assert await search(scope, question, vector, category="cs.AI")
    assert await search(scope, question, vector, year=2023)
    assert await search(scope, question, vector, year=(2020, 2024))
    assert await search(scope, question, vector, year=2019) == []
    assert await search(scope, question, vector, author="Nobody") == []
    assert await search(scope, question, vector, arxiv_id="1605.08386") == []
    # a term only the text ranking can find (exact word, unlike the question's meaning)
    exact = await search(scope, "multi-session", await memory.embedder.embed_one("weather"), k=1)
    assert exact[0].content == TEXTS[2]
    segment = memory.knowledge_base.segment(passages).render()
    assert segment.startswith("## Knowledge Base Memory\n")
    assert "[arXiv:2310.08560] MemGPT: Towards LLMs as Operating Systems" in segment


async def test_workflows_entities_summaries_tool_logs(memory, tenant):
    scope = Scope(tenant, "t")
    await memory.workflows.add(
        scope, "find MemGPT", ["arxiv_search_candidates(MemGPT) -> success"], "found 2310.08560"
    )
    await memory.workflows.add(scope, "just chat", [], "no tools")
    vector = await memory.embedder.embed_one("get me the MemGPT paper")
    workflows = await memory.workflows.similar(scope, vector)
    assert len(workflows) == 1 and workflows[0].startswith("QUERY: find MemGPT\nSTEPS:\n1. ")

    await memory.entities.upsert(
        scope, [Entity("MemGPT", "system", "An LLM OS with memory tiers.")]
    )
    await memory.entities.upsert(scope, [Entity("memgpt", "system", "Written at UC Berkeley.")])
    entities = await memory.entities.all(scope)
    assert len(entities) == 1
    assert entities[0].description == "An LLM OS with memory tiers. Written at UC Berkeley."
    assert (await memory.entities.similar(scope, vector))[0].name == "MemGPT"

    summary = await memory.summaries.save(
        scope, Summary("t", "User asked for MemGPT", "Full text", ["msg_1"])
    )
    assert (await memory.summaries.get(scope, summary.id)).message_ids == ["msg_1"]
    assert await memory.summaries.descriptions(scope) == [(summary.id, "User asked for MemGPT")]
    assert (
        f"[Summary ID: {summary.id}] User asked for MemGPT"
        in memory.summaries.segment(await memory.summaries.descriptions(scope)).render()
    )
    with pytest.raises(UnknownSummary):
        await memory.summaries.get(scope, "sum_missing")

    log_id = await memory.tool_logs.write(
        scope,
        ToolLogEntry("t", "arxiv_search_candidates", {"query": "MemGPT"}, "x" * 10_000, "success"),
    )
    entry = await memory.tool_logs.get(scope, log_id)
    assert entry.output == "x" * 10_000 and entry.tool_input == {"query": "MemGPT"}
    await memory.tool_logs.write(scope, ToolLogEntry("t", "broken", {}, "", "error", error="boom"))
    assert [e.tool_name for e in await memory.tool_logs.recent(scope, failed_only=True)] == [
        "broken"
    ]
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(scope, "log_missing")


async def test_no_read_crosses_tenants(memory, tenant):
    mine, other = Scope(tenant, "shared-name"), Scope(tenant + "-b", "shared-name")
    await add_memgpt(memory, tenant)
    await memory.workflows.add(mine, "find MemGPT", ["arxiv_search_candidates -> success"], "ok")
    await memory.entities.upsert(mine, [Entity("MemGPT", "system", "LLM OS")])
    await memory.conversation.append(mine, "user", "secret of A")
    summary = await memory.summaries.save(mine, Summary("shared-name", "A's summary", "A", []))
    log_id = await memory.tool_logs.write(
        mine, ToolLogEntry("shared-name", "x", {}, "A", "success")
    )

    vector = await memory.embedder.embed_one("MemGPT memory tiers")
    assert await memory.knowledge_base.search(other, "MemGPT memory tiers", vector) == []
    assert not await memory.knowledge_base.has_paper(other, "2310.08560")
    assert await memory.knowledge_base.papers(other) == []
    assert await memory.workflows.similar(other, vector) == []
    assert await memory.workflows.all(other) == []
    assert await memory.entities.similar(other, vector) == []
    assert await memory.entities.all(other) == []
    assert await memory.conversation.all(other) == []
    assert await memory.conversation.threads(other.tenant) == []
    assert await memory.summaries.descriptions(other) == []
    with pytest.raises(UnknownSummary):
        await memory.summaries.get(other, summary.id)
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(other, log_id)


async def test_toolbox_registers_once_and_retrieves(memory):
    records = [
        {
            "name": "t_search",
            "description": "Search arXiv for candidate papers",
            "signature": "(query: str)",
        },
        {
            "name": "t_weather",
            "description": "Tell the weather in a city",
            "signature": "(city: str)",
        },
    ]
    await memory.toolbox.register(records)
    assert await memory.toolbox.register(records) == 0  # deduplicated by name and content
    vector = await memory.embedder.embed_one("find papers on arXiv about transformers")
    names = await memory.toolbox.similar(vector, k=50)
    assert names.index("t_search") < names.index("t_weather")


async def test_embedding_cache_returns_identical_vectors(memory):
    texts = [f"cache probe {np.random.default_rng().integers(1 << 30)}"]
    first = await memory.embedder.embed(texts)
    second = await memory.embedder.embed(texts)
    assert np.array_equal(first, second)
    assert await memory.redis.exists(memory.embedder._key(texts[0]))


def test_both_local_runtimes_give_the_same_vectors(local_embedder):
    """Questions run on ONNX Runtime, long passages on torch: one model, one vector space."""
    # more than one ONNX batch, lengths out of order: each vector must come back in its place
    short = ["What does MemGPT page between?", "hello"] + [
        f"question {i} about {'long ' * (i * 7 % 11)}context memory" for i in range(20)
    ]
    long = ["Transformers use attention over long contexts. " * 40] * 2
    onnx = local_embedder.encode_sync(short)
    assert local_embedder._onnx, "ONNX Runtime should serve short texts"
    torch_vectors = local_embedder._load_torch().encode(short, normalize_embeddings=True)
    assert np.allclose((onnx * torch_vectors).sum(axis=1), 1.0, atol=1e-4)
    assert local_embedder._runtime(long) is local_embedder._torch


async def test_an_index_of_an_older_layout_is_rebuilt_and_keeps_its_records(memory, tenant):
    """Before one index per tenant, each store had one shared index with a tenant tag. Opening
    a store drops such an index (never its records), and the tenant's own index finds them."""
    family = f"test_notes_{uuid.uuid4().hex[:8]}"

    class Notes(WorkflowStore):  # a family of its own: rebuilding it disturbs no other test
        SCHEMA = {**WorkflowStore.SCHEMA, "index": {"name": family, "prefix": f"test:{family}"}}

    store = Notes(memory.redis, memory.embedder)
    text = "QUERY: find MemGPT\nSTEPS:\n1. arxiv_search_candidates\nOUTCOME: found it"
    vector = await memory.embedder.embed_one(text)
    await memory.redis.execute_command(
        "FT.CREATE", family, "ON", "HASH", "PREFIX", 1, f"test:{family}", "SCHEMA",
        "tenant", "TAG", "text", "TEXT", "num_steps", "NUMERIC",
        "embedding", "VECTOR", "HNSW", 6, "TYPE", "FLOAT32", "DIM", memory.embedder.dims,
        "DISTANCE_METRIC", "COSINE",
    )  # fmt: skip
    await memory.redis.hset(
        f"test:{family}:{tenant}:old",
        mapping={"tenant": tenant, "text": text, "num_steps": 1, "embedding": vector_bytes(vector)},
    )
    await memory.redis.hset(INDEX_META_KEY, family, store.signature)  # the old record format

    await store.open()
    # the shared index is gone, its records are not, and their tenant has an index of its own
    assert await store.existing_indexes() == [f"{family}:{tenant}"]
    assert await memory.redis.exists(f"test:{family}:{tenant}:old")
    for _ in range(100):  # Redis indexes the existing records in the background
        found = await store.similar(Scope(tenant), vector)
        if found:
            break
        await asyncio.sleep(0.05)
    assert found == [text]
    assert await store.similar(Scope(tenant + "-b"), vector) == []
    recorded = (await memory.redis.hget(INDEX_META_KEY, family)).decode()
    assert recorded == f"{store.signature}#{store.layout()}"
    await store.open()  # the current layout: nothing is rebuilt
    assert await store.similar(Scope(tenant), vector) == [text]


def test_text_half_searches_the_topic_words_only():
    query = KnowledgeBase.text_query("Please explain the state-space models, and what they show")
    assert query is not None and query.query_string() == "(state | space | models)"
    assert KnowledgeBase.text_query("Can you explain what the papers say?") is None


async def test_search_replies_read_alike_over_resp2_and_resp3(memory, tenant, redis_url):
    await add_memgpt(memory, tenant)
    question = "How does MemGPT manage memory tiers?"
    vector = await memory.embedder.embed_one(question)
    scope = Scope(tenant)
    await memory.entities.upsert(scope, [Entity("MemGPT", "system", "an LLM OS")])
    client = await connect(f"{redis_url}?protocol=2")
    try:
        resp2 = MemoryManager(client, memory.embedder)
        for manager in (memory, resp2):
            passages = await manager.knowledge_base.search(scope, question, vector, k=3)
            assert [p.content for p in passages][:1] == [TEXTS[0]]
            assert {p.chunk_index for p in passages} == {0, 1, 2}
            assert await manager.entities.similar(scope, vector) == [
                Entity("MemGPT", "system", "an LLM OS")
            ]
    finally:
        await client.aclose()


async def test_a_changed_schema_rebuilds_each_tenants_index(memory, tenant):
    family = f"test_notes_{uuid.uuid4().hex[:8]}"

    class Notes(WorkflowStore):
        SCHEMA = {**WorkflowStore.SCHEMA, "index": {"name": family, "prefix": f"test:{family}"}}

    class NotesWithTopic(Notes):
        SCHEMA = {
            **Notes.SCHEMA,
            "fields": [*Notes.SCHEMA["fields"], {"name": "topic", "type": "tag"}],
        }

    scope = Scope(tenant)
    await Notes(memory.redis, memory.embedder).add(scope, "find MemGPT", ["search"], "found")
    store = NotesWithTopic(memory.redis, memory.embedder)
    await store.open()
    info = await store.info(tenant)
    assert "topic" in str(info["attributes"])  # the rebuilt index has the new field
    for _ in range(100):
        found = await store.all(scope)
        if found:
            break
        await asyncio.sleep(0.05)
    assert len(found) == 1 and found[0].startswith("QUERY: find MemGPT")
