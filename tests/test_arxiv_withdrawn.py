"""An arXiv version with no PDF (a withdrawn one has none; its entry's free-text comment may or
may not say so) names the version before it to ask for, not a bare HTTP 404 of its PDF link; the
entry is said withdrawn only when its comment speaks of a withdrawal."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from memory.embeddings import CachedEmbedder
from memory.ingest.arxiv_source import ArxivSource, RateLimiter
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save, ingest
from memory.scope import Scope
from memory.stores.knowledge_base import KnowledgeBase
from memory.tokens import encoding_for
from tests.support.arxiv_replay import ArxivReplay, AtomEntry
from tests.support.pdfs import make_pdf

WITHDRAWN = "This paper has been withdrawn by the author due to an error in Lemma 2"


def entry(arxiv_id: str, version: int, comment: str = "") -> AtomEntry:
    return AtomEntry(
        arxiv_id=arxiv_id, title=f"Paper {arxiv_id}", summary="An abstract.", authors=["A. Author"],
        published="2024-01-02T10:00:00Z", version=version, comment=comment,
    )  # fmt: skip


@pytest.fixture
def replay():
    server = ArxivReplay().start()
    yield server
    server.stop()


@pytest.fixture
def source(replay) -> ArxivSource:
    return ArxivSource(replay.api_url, delay_seconds=0.0, limiter=RateLimiter())


@pytest.fixture
async def kb(redis_url, local_embedder, tenant):
    client = Redis.from_url(redis_url)
    store = KnowledgeBase(client, CachedEmbedder(local_embedder, client))
    await store.open()
    yield store
    await store.drop_tenant(tenant)
    await client.aclose()


@pytest.fixture
def enc():
    return encoding_for("gpt-5-mini")


async def test_a_withdrawn_latest_version_names_the_one_before(replay, source, kb, enc, tenant):
    """The latest version, v3, is a withdrawal with no PDF: the user is told so and which
    version to ask for instead; nothing is stored."""
    replay.add_entry(entry("2401.01234", 3, WITHDRAWN))  # no PDF: arXiv has none of v3

    with pytest.raises(IngestError) as caught:
        await fetch_and_save("2401.01234", Scope(tenant), kb, kb.embedder, enc, source)

    assert str(caught.value) == (
        "arXiv has no PDF of 2401.01234v3 (its arXiv entry says it was withdrawn); "
        "ask me to save 2401.01234v2."
    )
    assert await kb.paper(Scope(tenant), "2401.01234") is None


async def test_a_missing_pdf_past_v1_names_the_version_before_whatever_the_comment(
    replay, source, kb, enc, tenant
):
    """The comment is the author's free text: a withdrawal in other words is recognised, and
    with no word of it (no comment, or one about another version being withdrawn) a missing
    PDF past v1 still names the version before it."""
    replay.add_entry(entry("2403.00001", 3, "We withdraw this paper: error in Lemma 2"))
    replay.add_entry(entry("2403.00002", 3))
    replay.add_entry(entry("2403.00003", 2, "Error in Theorem 3"))
    ids = ["2403.00001", "2403.00002", "2403.00003"]

    report = await ingest(ids, Scope(tenant), kb, kb.embedder, enc, source, progress=False)

    assert dict(report.failed) == {
        "2403.00001": "arXiv has no PDF of 2403.00001v3 (its arXiv entry says it was withdrawn); "
        "ask me to save 2403.00001v2.",
        "2403.00002": "arXiv has no PDF of 2403.00002v3 (a withdrawn version has none); "
        "ask me to save 2403.00002v2.",
        "2403.00003": "arXiv has no PDF of 2403.00003v2 (a withdrawn version has none); "
        "ask me to save 2403.00003v1.",
    }
    assert report.ingested == []


async def test_the_version_named_can_be_saved(replay, source, kb, enc, tenant):
    """Following the advice works: v3 has no PDF, v2 has one; saving the version named stores
    the paper at v2."""
    replay.add_entry(entry("2401.05678", 2))
    replay.add_entry(entry("2401.05678", 3, "Retracted by the authors"))  # the latest, unversioned
    replay.pdfs["2401.05678v2"] = make_pdf(title="Paper 2401.05678")

    with pytest.raises(IngestError) as caught:
        await fetch_and_save("2401.05678", Scope(tenant), kb, kb.embedder, enc, source)
    advice = str(caught.value)
    assert advice.endswith("ask me to save 2401.05678v2.")
    asked = advice.removesuffix(".").rsplit(" ", 1)[-1]

    paper, chunks, already = await fetch_and_save(
        asked, Scope(tenant), kb, kb.embedder, enc, source
    )

    assert (paper.arxiv_id, already) == ("2401.05678", False)
    assert chunks > 0
    record = await kb.paper(Scope(tenant), "2401.05678")
    assert record is not None and record["version"] == "v2"


async def test_only_a_withdrawal_like_v1_without_pdf_is_said_withdrawn(
    replay, source, kb, enc, tenant
):
    """A withdrawn v1 has no earlier version to suggest; a PDF missing from an ordinary v1
    keeps the download's own message; an entry whose comment speaks of a withdrawal but whose
    PDF is there is saved as any other."""
    replay.add_entry(entry("2402.00001", 1, "Withdrawal: the results are wrong"))
    replay.add_entry(entry("2402.00002", 1, "12 pages, 3 figures"))  # no PDF either
    replay.add_entry(entry("2402.00003", 2, "v1 was withdrawn in favour of this version"))
    replay.pdfs["2402.00003"] = make_pdf(title="Paper 2402.00003")
    ids = ["2402.00001", "2402.00002", "2402.00003"]

    report = await ingest(ids, Scope(tenant), kb, kb.embedder, enc, source, progress=False)

    assert dict(report.failed) == {
        "2402.00001": "arXiv has no PDF of 2402.00001v1; its arXiv entry says it was withdrawn.",
        "2402.00002": f"Downloading {replay.base}/pdf/2402.00002v1 failed: HTTP 404",
    }
    assert [arxiv_id for arxiv_id, _, _ in report.ingested] == ["2402.00003"]
