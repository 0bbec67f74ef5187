"""Ingestion: chunking, PDF text, arXiv lookups against a local replay server, the pipeline."""

from __future__ import annotations

import itertools
import json
import tarfile
import time

import pytest
from redis.asyncio import Redis

from memory.embeddings import CachedEmbedder
from memory.ingest.arxiv_source import ArxivSource, RateLimiter
from memory.ingest.chunking import chunk_paragraphs
from memory.ingest.clean import clean_extracted_text
from memory.ingest.errors import IngestError
from memory.ingest.pdf import pdf_paragraphs, read_pdf
from memory.ingest.pipeline import fetch_and_save, ingest
from memory.ingest.unarxive import read_unarxive
from memory.scope import Scope
from memory.stores.knowledge_base import KnowledgeBase
from memory.tokens import encoding_for
from tests.support.arxiv_replay import (
    MEMGPT_ID,
    MEMGPT_TITLE,
    SHARED,
    ArxivReplay,
    load_fixtures,
    memgpt_entry,
)
from tests.support.pdfs import make_blank_pdf, make_encrypted_pdf, make_pdf

SAMPLE = SHARED / "benchmarks" / "unarxive" / "unarXive_data_sample.tar.gz"


@pytest.fixture(scope="module")
def enc():
    return encoding_for("gpt-4o")


@pytest.fixture(scope="module")
def replay():
    server = ArxivReplay().start()
    server.add_entry(memgpt_entry(), search_query="MemGPT")
    server.pdfs[MEMGPT_ID] = make_pdf(title=MEMGPT_TITLE)
    server.pdfs["1605.08386"] = make_pdf(title="Heat-bath random walks with Markov bases")
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
def scope(tenant) -> Scope:
    """The tenant-wide scope ingestion writes to."""
    return Scope(tenant)


@pytest.fixture(scope="module")
def sample_lines(tmp_path_factory) -> list[bytes]:
    """The first three papers of the shared unarXive sample, read from the tar.gz at test time."""
    with tarfile.open(SAMPLE.resolve(), "r:gz") as tar:
        member = next(m for m in tar if m.name.endswith(".jsonl"))
        stream = tar.extractfile(member)
        assert stream is not None
        return [stream.readline() for _ in range(3)]


# -- chunking ---------------------------------------------------------------------------------


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_chunks_respect_size_overlap_and_sections(enc):
    paragraphs = [
        ("A", _words("alpha", 12)),
        ("A", "   "),
        ("A", _words("apple", 12)),
        ("A", _words("avocado", 12)),
        ("B", _words("beta", 600)),  # longer than a chunk: cut into windows
        ("B", _words("banana", 10)),
        ("C", ""),
        ("C", _words("gamma", 5)),
    ]
    chunks = chunk_paragraphs(paragraphs, enc, max_tokens=64, overlap=8)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(len(enc.encode(c.text)) <= 64 for c in chunks)
    assert {c.section for c in chunks} == {"A", "B", "C"}
    for chunk in chunks:  # never across a section boundary
        letters = {w[0] for w in chunk.text.split() if w[0].isalpha()}
        assert letters == {chunk.section.lower()[0] if chunk.section != "C" else "g"}
    a_chunks = [c for c in chunks if c.section == "A"]
    assert "alpha0" in a_chunks[0].text and "apple11" in a_chunks[0].text  # whole paragraphs packed
    b_chunks = [c for c in chunks if c.section == "B"]
    assert len(b_chunks) > 5
    for prev, nxt in itertools.pairwise(b_chunks):  # consecutive chunks overlap
        assert prev.text.split()[-1] in nxt.text.split()[:8]
    for prev, nxt in itertools.pairwise(a_chunks):
        assert prev.text.split()[-1] in nxt.text.split()
    assert "banana9" in b_chunks[-1].text
    assert chunks[-1].section == "C" and chunks[-1].text == _words("gamma", 5)


def test_chunking_edge_cases(enc):
    assert chunk_paragraphs([], enc) == []
    assert chunk_paragraphs([("x", "  \n ")], enc) == []
    with pytest.raises(ValueError):
        chunk_paragraphs([("", "text")], enc, max_tokens=16, overlap=16)
    # lone surrogates and control characters are dropped, so Redis gets valid UTF-8
    chunks = chunk_paragraphs(
        [("S\ud800", "caf\u00e9 \udcff ok\x00 \u4e2d\u6587 " * 50)], enc, 32, 4
    )
    for chunk in chunks:
        chunk.text.encode("utf-8")
        chunk.section.encode("utf-8")
        assert "\x00" not in chunk.text and "\ufffd" not in chunk.text
    assert clean_extracted_text("a\ud83db\x07c") == "abc"


def test_chunking_is_fast_on_a_large_text(enc):
    paragraphs = [(f"S{i // 50}", _words("word", 120)) for i in range(2000)]  # ~2 MB of text
    started = time.perf_counter()
    chunks = chunk_paragraphs(paragraphs, enc)
    assert time.perf_counter() - started < 5
    assert all(len(c.text) > 0 for c in chunks)


# -- PDF --------------------------------------------------------------------------------------


def test_pdf_text_by_section():
    pdf = read_pdf(make_pdf(title="A Test Paper"))
    assert pdf.title == "A Test Paper" and pdf.pages == 2
    sections = [s for s, _ in pdf.paragraphs]
    headings = list(dict.fromkeys(s for s in sections if s))
    assert headings == ["1 Introduction", "2 Method", "3 Results"]
    text = " ".join(t for _, t in pdf.paragraphs)
    assert "fixed context window" in text and "multi-session chat" in text  # both pages
    intro = [t for s, t in pdf.paragraphs if s == "1 Introduction"]
    assert len(intro) == 2 and intro[0].startswith("Large language models")


def test_pdf_dehyphenates_and_accepts_paths(tmp_path):
    long_word = "The system performs well on multi-session conversations. " * 30
    data = make_pdf([("1 Introduction", [long_word])])
    path = tmp_path / "p.pdf"
    path.write_bytes(data)
    text = " ".join(t for _, t in pdf_paragraphs(path))
    assert "multi-session conversations" in text and "- " not in text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (make_encrypted_pdf(), "encrypted"),
        (make_blank_pdf(), "no extractable text"),
        (b"<html>not a pdf</html>", "not a PDF"),
        (b"", "not a PDF"),
        (b"%PDF-1.7\n garbage", "cannot open"),
    ],
)
def test_unreadable_pdfs_give_clear_errors(data, message):
    with pytest.raises(IngestError, match=message):
        read_pdf(data)


def test_truncated_pdf():
    data = make_pdf()
    with pytest.raises(IngestError):
        read_pdf(data[: len(data) // 3])


# -- arXiv ------------------------------------------------------------------------------------


async def test_lookup_valid_versioned_and_batched(replay, source):
    before = len(replay.api_paths())
    hits = await source.lookup(["1605.08386", "2104.12255v1", MEMGPT_ID])
    assert len(replay.api_paths()) == before + 1  # one id_list request for the batch
    heat = hits["1605.08386"].paper
    assert heat.title == "Heat-bath random walks with Markov bases"
    assert heat.authors == ["Caprice Stanley", "Tobias Windisch"]
    assert heat.published == "2016-05-26" and heat.categories == ["math.CO", "math.ST"]
    assert heat.url == "https://arxiv.org/abs/1605.08386v1"  # the abs link is not rewritten
    assert hits["2104.12255v1"].paper.arxiv_id == "2104.12255"
    memgpt = hits[MEMGPT_ID]
    assert memgpt.paper.title == MEMGPT_TITLE and memgpt.paper.published == "2023-10-12"
    assert memgpt.paper.authors[0] == "Charles Packer" and len(memgpt.paper.authors) == 7
    assert memgpt.pdf_url == f"{replay.base}/pdf/{MEMGPT_ID}v2"


async def test_unknown_and_malformed_ids(replay, source):
    with pytest.raises(IngestError, match=r"no paper with id 0000\.0000"):
        await source.paper("0000.0000")
    before = list(replay.requests)
    with pytest.raises(IngestError, match="not a valid arXiv id"):
        await source.paper("abc")
    assert replay.requests == before  # refused before any request
    # arXiv's own "Error" entry for a malformed id (HTTP 400) is a clear error too
    status, body = load_fixtures()["id", "abc"]
    replay.add_response("id", "2401.99999", body, status)
    with pytest.raises(IngestError, match="incorrect id format for abc"):
        await source.paper("2401.99999")
    replay.add_response("id", "2401.99998", body, 200)
    with pytest.raises(IngestError, match="incorrect id format"):
        await source.paper("2401.99998")


async def test_search_candidates(replay, source):
    found = await source.search_candidates("MemGPT", max_results=5)
    assert [c.arxiv_id for c in found] == [MEMGPT_ID]
    assert found[0].title == MEMGPT_TITLE and found[0].pdf_url.startswith(replay.base)
    assert found[0].as_dict()["published"] == "2023-10-12"
    testing = await source.search_candidates("testing", max_results=3)
    assert len(testing) == 3 and all(c.arxiv_id and c.summary for c in testing)
    assert await source.search_candidates("no such thing", max_results=3) == []


async def test_requests_are_rate_limited(replay):
    slow = ArxivSource(replay.api_url, delay_seconds=0.3, limiter=RateLimiter())
    start = len(replay.requests)
    hit = await slow.paper(MEMGPT_ID)
    await slow.download_pdf(hit.pdf_url)
    await slow.search_candidates("MemGPT")
    await slow.download_pdf(hit.pdf_url)
    times = [t for t, _ in replay.requests[start:]]
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.3, gaps
    assert max(gaps) < 1.0, gaps  # the arxiv client's own delay is not added on top


async def test_pdf_download_errors(replay, source):
    with pytest.raises(IngestError, match="HTTP 404"):
        await source.download_pdf(f"{replay.base}/pdf/9999.99999")


# -- pipeline ---------------------------------------------------------------------------------


async def test_ingest_arxiv_ids_dedup_and_failures(replay, source, kb, enc, scope):
    ids = [MEMGPT_ID, "1605.08386v1", "0000.0000", "abc", f"{MEMGPT_ID}v2"]
    report = await ingest(ids, scope, kb, kb.embedder, enc, source, progress=False)
    assert sorted(i for i, _, _ in report.ingested) == ["1605.08386", MEMGPT_ID]
    assert report.skipped == [(MEMGPT_ID, "listed more than once")]
    failed = dict(report.failed)
    assert "no paper with id 0000.0000" in failed["0000.0000"]
    assert "not a valid arXiv id" in failed["abc"]
    assert report.chunks == sum(n for _, _, n in report.ingested) > 0
    assert 0 < report.seconds_embedding <= report.seconds
    papers = {p["arxiv_id"]: p for p in await kb.papers(scope)}
    assert set(papers) == {"1605.08386", MEMGPT_ID}
    assert papers[MEMGPT_ID]["title"] == MEMGPT_TITLE
    hits = await kb.search(
        scope, "virtual context management", await kb.embedder.embed_one("memory tiers")
    )
    assert hits and hits[0].arxiv_id in papers

    before = len(replay.api_paths())
    again = await ingest(ids[:2], scope, kb, kb.embedder, enc, source, progress=False)
    assert again.ingested == [] and len(again.skipped) == 2
    assert len(replay.api_paths()) == before  # nothing fetched for papers already stored
    assert await kb.chunk_count(scope, MEMGPT_ID) == papers[MEMGPT_ID]["chunks"]


async def test_fetch_and_save(source, kb, enc, scope):
    paper, chunks, present = await fetch_and_save(MEMGPT_ID, scope, kb, kb.embedder, enc, source)
    assert (paper.arxiv_id, paper.title, present) == (MEMGPT_ID, MEMGPT_TITLE, False)
    assert chunks >= 2 and paper.published == "2023-10-12"
    again = await fetch_and_save(f"{MEMGPT_ID}v2", scope, kb, kb.embedder, enc, source)
    # the version saved (an older one asked for: tests/test_arxiv_ingest_s24.py)
    assert again[1:] == (chunks, True)
    for bad, message in [("0000.0000", "no paper"), ("abc", "not a valid arXiv id")]:
        with pytest.raises(IngestError, match=message):
            await fetch_and_save(bad, scope, kb, kb.embedder, enc, source)
    assert [p["arxiv_id"] for p in await kb.papers(scope)] == [MEMGPT_ID]


async def test_ingest_pdf_files(tmp_path, kb, enc, scope):
    local = tmp_path / "notes.pdf"
    local.write_bytes(make_pdf(title="My Notes"))
    untitled = tmp_path / "untitled.pdf"
    untitled.write_bytes(make_pdf(title=""))
    locked = tmp_path / "locked.pdf"
    locked.write_bytes(make_encrypted_pdf())
    missing = str(tmp_path / "missing.pdf")
    sources = [str(local), str(untitled), str(locked), missing, str(local)]
    report = await ingest(sources, scope, kb, kb.embedder, enc, None, progress=False)
    ingested = {i: t for i, t, _ in report.ingested}
    local_id = next(i for i, title in ingested.items() if title == "My Notes")
    assert len(local_id) == len("local-") + 12 and local_id.startswith("local-")
    # no PDF title: the file name (one named like an arXiv id: tests/test_local_pdf_ids.py)
    [untitled_id] = [i for i, title in ingested.items() if title == "untitled"]
    assert untitled_id.startswith("local-") and untitled_id != local_id
    papers = {p["arxiv_id"]: p for p in await kb.papers(scope)}
    assert set(papers) == {local_id, untitled_id}
    assert all(p["url"] == "" for p in papers.values())  # no file:// link to the server's files
    failed = dict(report.failed)
    assert "encrypted" in failed[str(locked)] and "no such file" in failed[missing]
    assert report.skipped == [(local_id, "listed more than once")]


async def test_ingest_unarxive_sample_with_bad_lines(tmp_path, sample_lines, kb, enc, scope):
    broken = {"paper_id": "2212.00001", "metadata": {"title": "No body"}}
    path = tmp_path / "sample.jsonl"
    path.write_bytes(
        sample_lines[0] + b"{not json\n" + sample_lines[1] + json.dumps(broken).encode() + b"\n"
        + sample_lines[2]
    )  # fmt: skip
    errors: list[IngestError] = []
    items = list(read_unarxive(path, on_error=errors.append))
    assert [p.arxiv_id for p, _ in items] == ["2212.11867", "2212.11831", "2212.11808"]
    assert [str(e).split(": ")[0] for e in errors] == [f"{path}, line 2", f"{path}, line 4"]
    paper, paragraphs = items[0]
    assert paper.authors == ["Marcus Michelen", "Xuan-Truong Vu"]
    assert paper.published == "2022-12-22" and "math.PR" in paper.categories
    assert paragraphs[0][0] == "Abstract" and paragraphs[1][0] == "Introduction"
    assert not any("{{" in text for _, text in paragraphs)
    with pytest.raises(IngestError, match="line 2: not valid JSON"):
        list(read_unarxive(path))

    report = await ingest([str(path)], scope, kb, kb.embedder, enc, None, progress=False)
    assert len(report.ingested) == 3 and len(report.failed) == 2
    assert "line 2" in report.failed[0][1] and "missing field 'body_text'" in report.failed[1][1]
    sections = await kb.search(scope, "zeros of derivatives of random polynomials",
                               await kb.embedder.embed_one("zeros of random polynomials"),
                               arxiv_id="2212.11867")  # fmt: skip
    assert sections and all(s.arxiv_id == "2212.11867" and s.section for s in sections)


async def test_unarxive_from_tar_gz(tmp_path, sample_lines):
    jsonl = tmp_path / "inner" / "papers.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_bytes(b"".join(sample_lines[:2]))
    archive = tmp_path / "papers.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(jsonl, arcname="unarXive/papers.jsonl")
    assert [p.arxiv_id for p, _ in read_unarxive(archive)] == ["2212.11867", "2212.11831"]
    with pytest.raises(IngestError, match="no such file"):
        list(read_unarxive(tmp_path / "nope.jsonl"))


async def test_odd_text_is_handled(tmp_path, kb, enc, scope):
    def line(paper_id: str, body: list[dict], abstract: str = "") -> bytes:
        record = {"paper_id": paper_id, "metadata": {"title": f"Paper {paper_id}"},
                  "abstract": {"text": abstract}, "body_text": body}  # fmt: skip
        return json.dumps(record).encode() + b"\n"

    invalid_utf8 = line("2212.00011", [{"section": "Intro", "text": "caf\u00e9 QQQ ok"}])
    invalid_utf8 = invalid_utf8.replace(b"QQQ", b"\xff\xfe\xc3")  # bytes that are not UTF-8
    surrogate = line("2212.00012", [{"section": "S\ud800", "text": "lone \udc00 surrogate text"}])
    empty = line("2212.00013", [{"section": "Intro", "text": "   "}])
    huge = line("2212.00014", [{"section": "Long", "text": _words("token", 3000)}])
    path = tmp_path / "odd.jsonl"
    path.write_bytes(invalid_utf8 + surrogate + empty + huge)
    report = await ingest([str(path)], scope, kb, kb.embedder, enc, None, progress=False)
    assert sorted(i for i, _, _ in report.ingested) == ["2212.00011", "2212.00012", "2212.00014"]
    assert len(report.failed) == 1 and "2212.00013 has no text" in report.failed[0][1]
    huge_chunks = dict((i, n) for i, _, n in report.ingested)["2212.00014"]
    assert huge_chunks > 10
    vector = await kb.embedder.embed_one("surrogate text")
    hits = await kb.search(scope, "surrogate", vector, arxiv_id="2212.00012")
    assert [(h.section, h.content) for h in hits] == [("S", "lone surrogate text")]
    hits = await kb.search(scope, "cafe", vector, arxiv_id="2212.00011")
    assert hits[0].content == "caf\u00e9 ok"  # the invalid bytes are dropped, the rest kept


async def test_unusable_sources_are_reported(tmp_path, kb, enc, scope):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    report = await ingest([str(odd), "not an id"], scope, kb, kb.embedder, enc, None,
                          progress=False)  # fmt: skip
    failed = dict(report.failed)
    assert "unsupported file type" in failed[str(odd)]
    assert "not a valid arXiv id" in failed["not an id"]
    assert await kb.papers(scope) == []
