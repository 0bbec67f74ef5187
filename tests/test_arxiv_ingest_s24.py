"""arXiv's pace kept by every client, a 429 retried after its Retry-After (a long one blocking
every client at once), a newer version replacing the stored one, two saves of one paper never
interleaving, and a failed write leaving no chunks without a paper record."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from redis.asyncio import Redis

from app.runtime import arxiv_source
from app.settings import Settings
from memory.embeddings import CachedEmbedder
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import RATE_LIMITED, ArxivSource, RateLimiter
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save
from memory.keys import arxiv_blocked_key, arxiv_slot_key, papers_key
from memory.scope import Scope
from memory.stores.knowledge_base import Chunk, KnowledgeBase, Paper
from memory.tokens import encoding_for
from tests.support.arxiv_replay import MEMGPT_ID, ArxivReplay, AtomEntry, memgpt_entry
from tests.support.pdfs import make_pdf
from tests.support.redis_gate import RedisGate

PAPER_ID = "2401.00001"


@pytest.fixture
def replay():
    server = ArxivReplay().start()
    server.add_entry(memgpt_entry(), search_query="MemGPT")
    server.pdfs[MEMGPT_ID] = make_pdf(title="MemGPT")
    yield server
    server.stop()


@pytest.fixture
def source(replay) -> ArxivSource:
    return ArxivSource(replay.api_url, delay_seconds=0.0, limiter=RateLimiter())


@pytest.fixture
async def kb(redis_url, local_embedder):
    client = Redis.from_url(redis_url)
    store = KnowledgeBase(client, CachedEmbedder(local_embedder, client))
    await store.open()
    yield store
    await client.aclose()


@pytest.fixture
def enc():
    return encoding_for("gpt-5-mini")


async def test_the_agents_arxiv_client_waits_for_the_shared_slot(replay, client):
    """The factory's client (the agent's, `ingest`'s) waits while another process holds the
    slot in Redis: its request goes out only once the slot is free."""
    settings = Settings(arxiv_api_url=replay.api_url, arxiv_delay_seconds=0.2)
    source = arxiv_source(settings, client)
    assert isinstance(source.pace, SharedPace)
    # long, that it lasts past the look however the loop stalls: the wait polls the slot, so
    # its delete (below) ends it, not its lapse
    await client.set(arxiv_slot_key(), "another-process", px=10_000)
    try:
        search = asyncio.create_task(source.search_candidates("MemGPT"))
        await asyncio.sleep(0.5)  # time enough to ask, were it not waiting
        released = time.monotonic()
        await client.delete(arxiv_slot_key())  # as the other process's slot lapses
        found = await search
    finally:
        await client.delete(arxiv_slot_key())
    assert [c.arxiv_id for c in found] == [MEMGPT_ID]
    assert [at for at, path in replay.requests if path.startswith("/api/")]
    assert all(at >= released for at, path in replay.requests if path.startswith("/api/"))


async def test_a_pdf_download_takes_the_shared_slot_in_its_own_turn(replay):
    """The shared slot is taken once this process's own slot is held, not before (it would
    lapse while waiting)."""
    limiter = RateLimiter()
    held_at_pace: list[bool] = []

    async def pace() -> None:
        held_at_pace.append(limiter._lock.locked())

    source = ArxivSource(replay.api_url, delay_seconds=0.0, limiter=limiter, pace=pace)
    data = await source.download_pdf(f"{replay.base}/pdf/{MEMGPT_ID}")
    assert data.startswith(b"%PDF") and held_at_pace == [True]


async def test_a_429_is_retried_after_its_retry_after(replay, source):
    replay.busy = [(429, "1")]
    found = await source.search_candidates("MemGPT")
    assert [c.arxiv_id for c in found] == [MEMGPT_ID]
    asked = [at for at, path in replay.requests if path.startswith("/api/")]
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.9  # not before the Retry-After


async def test_a_lasting_429_says_arxiv_is_rate_limiting(replay, source):
    replay.busy = [(429, "0")] * 3  # every try of the client (one and two retries)
    with pytest.raises(IngestError) as caught:
        await source.search_candidates("MemGPT")
    assert (
        str(caught.value)
        == RATE_LIMITED
        == ("arXiv is rate limiting requests; try again in a minute.")
    )
    replay.busy = [(429, "3600")]  # too long to wait in a turn: said at once
    before = len(replay.api_paths())
    with pytest.raises(IngestError, match="rate limiting"):
        await source.paper(MEMGPT_ID)
    assert len(replay.api_paths()) == before + 1


def _version(replay: ArxivReplay, version: int, words: str) -> None:
    entry = AtomEntry(
        arxiv_id=PAPER_ID, title=f"Versioned paper ({words})", summary=f"About {words}.",
        authors=["A. Author"], published="2024-01-01T00:00:00Z", version=version,
    )  # fmt: skip
    replay.add_entry(entry)
    sections = [("1 Body", [f"This version is about {words} and nothing else at all."])]
    replay.pdfs[PAPER_ID] = make_pdf(sections, title=entry.title)


async def _chunk_texts(kb: KnowledgeBase, tenant: str) -> list[str]:
    keys = [k async for k in kb.redis.scan_iter(match=f"{kb.key_prefix(tenant)}{PAPER_ID}:*")]
    return [(await kb.redis.hget(k, "content")).decode() for k in keys]


async def test_a_newer_version_replaces_the_stored_one(replay, source, kb, enc, tenant):
    scope = Scope(tenant)
    _version(replay, 1, "apples")
    paper, chunks, present = await fetch_and_save(PAPER_ID, scope, kb, kb.embedder, enc, source)
    assert not present and (await kb.paper(scope, PAPER_ID))["version"] == "v1"

    _version(replay, 2, "oranges")
    paper, chunks, present = await fetch_and_save(
        f"{PAPER_ID}v2", scope, kb, kb.embedder, enc, source
    )
    record = await kb.paper(scope, PAPER_ID)
    assert not present and record["version"] == "v2" and paper.title.endswith("(oranges)")
    texts = await _chunk_texts(kb, tenant)
    assert len(texts) == record["chunks"] == chunks
    assert any("oranges" in t for t in texts) and not any("apples" in t for t in texts)

    asked = len(replay.api_paths())
    again = await fetch_and_save(f"{PAPER_ID}v2", scope, kb, kb.embedder, enc, source)
    assert again[2] is True and len(replay.api_paths()) == asked  # the one saved: no request
    with pytest.raises(IngestError, match="v2 is saved; this asks for v1"):
        await fetch_and_save(f"{PAPER_ID}v1", scope, kb, kb.embedder, enc, source)
    assert (await kb.paper(scope, PAPER_ID))["version"] == "v2"
    await kb.drop_tenant(tenant)


async def test_a_write_failing_partway_leaves_no_chunks_behind(kb, tenant):
    """A chunk that cannot be written (here a key of another type) fails the save: the chunks
    written before and after it go too, so search finds none without a paper record."""
    scope = Scope(tenant)
    chunks = [Chunk(text=f"passage {i} about state space models", index=i) for i in range(4)]
    vectors = np.array(await kb.embedder.embed([c.text for c in chunks]))
    await kb.redis.set(kb.chunk_key(tenant, PAPER_ID, 2), "not a hash")
    paper = Paper(arxiv_id=PAPER_ID, title="Half written", source="arxiv")
    with pytest.raises(Exception, match="WRONGTYPE"):
        await kb.add_paper(scope, paper, chunks, vectors)
    assert await kb.paper(scope, PAPER_ID) is None
    assert [k async for k in kb.redis.scan_iter(match=f"{kb.key_prefix(tenant)}*")] == []
    await kb.drop_tenant(tenant)


async def test_a_long_retry_after_fails_at_once_and_blocks_every_client(replay, client):
    """A 429 asking for 10 minutes fails the request at once and is shared: another process's
    client (its own limiter, the same Redis) fails fast while it lasts, sending nothing."""
    first, second = (
        ArxivSource(replay.api_url, 0.0, limiter=RateLimiter(), pace=SharedPace(client, 0.0))
        for _ in range(2)
    )
    replay.busy = [(429, "600")]
    try:
        with pytest.raises(IngestError) as caught:
            await first.search_candidates("MemGPT")
        asked = len(replay.requests)
        with pytest.raises(IngestError) as again:
            await second.search_candidates("MemGPT")
        with pytest.raises(IngestError, match="rate limiting"):
            await second.download_pdf(f"{replay.base}/pdf/{MEMGPT_ID}")
    finally:
        await client.delete(arxiv_blocked_key())
    expected = "arXiv is rate limiting requests; try again in about 10 minutes."
    assert str(caught.value) == str(again.value) == expected
    assert len(replay.requests) == asked == 1


async def test_a_retry_after_over_a_few_seconds_is_not_waited_in_a_request(replay, source):
    """Retry-After 30: no retry (a user would see "Searching arXiv…" for a minute); the
    request fails at once, and so does the next one of this process, sending nothing."""
    replay.busy = [(429, "30")]
    with pytest.raises(IngestError, match="try again in about 1 minute"):
        await source.search_candidates("MemGPT")
    with pytest.raises(IngestError, match="rate limiting"):
        await source.paper(MEMGPT_ID)
    assert len(replay.api_paths()) == 1


def _chunks_of(texts: list[str]) -> list[Chunk]:
    return [Chunk(text=text, index=i) for i, text in enumerate(texts)]


async def test_a_save_cancelled_beside_another_leaves_the_others_paper_whole(redis_url, kb, tenant):
    """Save A has written its chunks, its record on the way; save B of the same paper is
    cancelled meanwhile: A's record and every one of its passages stay."""
    scope = Scope(tenant)
    chunks = _chunks_of([f"passage {i} about state space models" for i in range(4)])
    vectors = np.array(await kb.embedder.embed([c.text for c in chunks]))
    paper = Paper(arxiv_id=PAPER_ID, title="Saved twice at once", source="arxiv")
    gate_a, gate_b = RedisGate(redis_url), RedisGate(redis_url)
    redis_a = Redis.from_url(await gate_a.start())
    redis_b = Redis.from_url(await gate_b.start())
    kb_a = KnowledgeBase(redis_a, kb.embedder)
    kb_b = KnowledgeBase(redis_b, kb.embedder)
    try:
        record_key = papers_key(tenant).encode()
        gate_a.hold(b"HSET\r\n$%d\r\n%s" % (len(record_key), record_key))  # A's record
        save_a = asyncio.create_task(kb_a.add_paper(scope, paper, chunks, vectors))
        await gate_a.held.wait()
        first_chunk = kb.chunk_key(tenant, PAPER_ID, 0).encode()
        gate_b.hold(b"HSET\r\n$%d\r\n%s" % (len(first_chunk), first_chunk))  # B's chunks
        save_b = asyncio.create_task(kb_b.add_paper(scope, paper, chunks, vectors))
        await asyncio.wait([asyncio.create_task(gate_b.held.wait())], timeout=1.0)
        save_b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save_b
        gate_b.cut()  # B's held write, if any, is dropped
        gate_a.release.set()
        assert await save_a == 4
    finally:
        for redis, gate in ((redis_a, gate_a), (redis_b, gate_b)):
            await redis.aclose()
            await gate.close()
    assert (await kb.paper(scope, PAPER_ID))["chunks"] == 4
    assert sorted(await _chunk_texts(kb, tenant)) == [c.text for c in chunks]
    await kb.drop_tenant(tenant)


async def test_an_older_version_saved_beside_a_newer_does_not_replace_it(
    replay, source, redis_url, kb, enc, tenant
):
    """v2 and v3 asked at once while v1 is stored: v2's save, decided before v3 landed, waits
    at the paper's lock while v3 is saved; then it finds v3 and leaves it."""
    scope = Scope(tenant)
    _version(replay, 1, "apples")
    await fetch_and_save(PAPER_ID, scope, kb, kb.embedder, enc, source)
    gate = RedisGate(redis_url)
    gated = Redis.from_url(await gate.start())
    try:
        _version(replay, 2, "oranges")
        gate.hold(b"paper-save")  # v2's lock, taken once its text is ready
        older = asyncio.create_task(
            fetch_and_save(f"{PAPER_ID}v2", scope, KnowledgeBase(gated, kb.embedder),
                           kb.embedder, enc, source)
        )  # fmt: skip
        await asyncio.wait_for(gate.held.wait(), 60)
        _version(replay, 3, "pears")
        await fetch_and_save(f"{PAPER_ID}v3", scope, kb, kb.embedder, enc, source)
        gate.release.set()
        with pytest.raises(IngestError, match="v3 is saved; this asks for v2"):
            await older
    finally:
        await gated.aclose()
        await gate.close()
    record = await kb.paper(scope, PAPER_ID)
    texts = await _chunk_texts(kb, tenant)
    assert record["version"] == "v3" and len(texts) == record["chunks"]
    assert any("pears" in t for t in texts) and not any("oranges" in t for t in texts)
    await kb.drop_tenant(tenant)


async def test_a_replacement_failing_says_the_saved_version_went(
    replay, source, kb, enc, tenant, caplog
):
    """v2 replaces v1, and its write fails (a chunk's key holds another type): v1 is gone
    already, and the error says so (without the store's own text), asking to save it again."""
    scope = Scope(tenant)
    _version(replay, 1, "apples")
    await fetch_and_save(PAPER_ID, scope, kb, kb.embedder, enc, source)
    stored = (await kb.paper(scope, PAPER_ID))["chunks"]
    _version(replay, 2, "oranges")
    long_sections = [(f"{n} Part", [f"Oranges in part {n}. " * 200]) for n in range(1, 6)]
    replay.pdfs[PAPER_ID] = make_pdf(long_sections, title="Versioned paper (oranges)")
    await kb.redis.set(kb.chunk_key(tenant, PAPER_ID, stored), "not a hash")
    with pytest.raises(IngestError) as caught:
        await fetch_and_save(f"{PAPER_ID}v2", scope, kb, kb.embedder, enc, source)
    said = str(caught.value)
    assert "WRONGTYPE" not in said and "ResponseError" not in said  # the operator's log's
    assert said == (
        "something went wrong on my side while saving it, and the saved version (v1) was "
        "removed; save it again"
    )  # the paper named by whoever says it (the Save answer, the tool call, the report)
    logged = [r for r in caplog.records if r.getMessage().startswith("replacing the saved")]
    assert logged and logged[0].exc_info  # not a service's failure: its traceback logged
    assert await kb.paper(scope, PAPER_ID) is None
    await kb.drop_tenant(tenant)


async def test_a_save_leaves_no_chunk_of_the_paper_that_no_record_lists(kb, tenant):
    """Chunks of the paper that no record lists (a save that died before its record): a new
    save of it, with fewer chunks, leaves none of them for search to find."""
    scope = Scope(tenant)
    paper = Paper(arxiv_id=PAPER_ID, title="Saved again", source="arxiv")
    old = _chunks_of([f"old passage {i} about state space models" for i in range(5)])
    await kb.add_paper(scope, paper, old, np.array(await kb.embedder.embed([c.text for c in old])))
    await kb.redis.hdel(papers_key(tenant), PAPER_ID)  # as if its record never made it
    new = _chunks_of(["new passage about attention", "another new passage"])
    await kb.add_paper(scope, paper, new, np.array(await kb.embedder.embed([c.text for c in new])))
    assert sorted(await _chunk_texts(kb, tenant)) == sorted(c.text for c in new)
    assert (await kb.paper(scope, PAPER_ID))["chunks"] == 2
    await kb.drop_tenant(tenant)
