"""A walled place (a guest, another organisation: memory/scope.py) reads the team's arXiv
papers, a public text, but not a PDF shared in a public channel; a watch's digest outside a
public channel names only what its place may read; a PDF the operator ingested from a local
file is no arXiv paper either."""

from __future__ import annotations

from adapters.slack_home import _paper_line
from memory.browse_knowledge import PaperInfo, PassageView
from memory.digest import DigestBuilder
from memory.ingest.arxiv_source import Candidate
from memory.ingest.pipeline import ingest
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.knowledge_base import (
    NOT_ARXIV_PREFIXES,
    Chunk,
    Paper,
    is_from_arxiv,
    paper_label,
)
from memory.stores.watches import Watch, WatchStore
from memory.tokens import encoding_for
from tests.support.pdfs import make_pdf

ARXIV = Paper("2310.08560", "MemGPT: paging between a main context and an archive", source="arxiv")
SHARED = Paper("pdf-0123456789abcdef", "Internal memo on paging budgets", source="pdf")
MINE = Paper("pdf-fedcba9876543210", "Our own notes on paging", source="pdf")


async def _library(memory, tenant: str) -> None:
    """An arXiv paper and a PDF shared in a public channel (both public), a PDF shared in
    private channel C7."""
    for paper, audience in ((ARXIV, PUBLIC), (SHARED, PUBLIC), (MINE, "private:C7")):
        text = f"{paper.title}: paging the context window."
        vectors = await memory.embedder.embed([text])
        await memory.knowledge_base.add_paper(
            Scope(tenant), paper, [Chunk(text)], vectors, audience=audience
        )


async def test_a_walled_place_reads_arxiv_papers_but_not_a_public_channels_pdf(memory, tenant):
    await _library(memory, tenant)
    kb = memory.knowledge_base
    guest = Scope(tenant, channel="C7", visibility=Visibility.PRIVATE, user="G1", walled=True)
    member = Scope(tenant, channel="C1", user="U1")

    assert {p["arxiv_id"] for p in await kb.papers(guest)} == {ARXIV.arxiv_id, MINE.arxiv_id}
    assert {p["arxiv_id"] for p in await kb.papers(member)} == {ARXIV.arxiv_id, SHARED.arxiv_id}
    assert await kb.paper(guest, ARXIV.arxiv_id) is not None
    assert await kb.paper(guest, SHARED.arxiv_id) is None

    vector = (await memory.embedder.embed(["paging the context window"]))[0]
    found = await kb.search(guest, "paging context window", vector, k=10)
    assert {p.arxiv_id for p in found} == {ARXIV.arxiv_id, MINE.arxiv_id}
    found = await kb.search(member, "paging context window", vector, k=10)
    assert {p.arxiv_id for p in found} == {ARXIV.arxiv_id, SHARED.arxiv_id}


async def test_a_digest_outside_a_public_channel_compares_with_what_its_place_may_read(
    memory, tenant
):
    """A new paper much like the public channel's PDF: a public channel's digest names that PDF
    as its nearest saved paper, a private place's digest never does."""
    await _library(memory, tenant)
    builder = DigestBuilder(memory.knowledge_base, WatchStore(memory.redis), memory.embedder, None)
    new = Candidate("2601.00001", SHARED.title, summary="A memo on paging budgets.")

    async def nearest(audience: str) -> str:
        watch = Watch("w1", tenant, "paging", 86_400, "slack", "C7", audience=audience)
        [item] = (await builder.rank(watch, [new], 0.0, 86_400.0)).items
        return item.near

    assert await nearest(PUBLIC) == SHARED.title
    assert await nearest("private:C7") in {ARXIV.title, MINE.title}


async def test_a_walled_place_does_not_read_a_pdf_ingested_from_a_local_file(
    memory, tenant, tmp_path
):
    """The operator's own PDFs (`local-…`, memory/ingest/pipeline.py) are public to the team,
    not arXiv's: a walled place reads none of them, by record or by search."""
    notes = tmp_path / "notes.pdf"
    notes.write_bytes(make_pdf(title="Paging budgets of the Zanzibar team"))
    kb = memory.knowledge_base
    report = await ingest([str(notes)], Scope(tenant), kb, memory.embedder,
                          encoding_for("gpt-4o"), None, progress=False)  # fmt: skip
    [(local_id, _, _)] = report.ingested
    assert local_id.startswith("local-")
    guest = Scope(tenant, channel="C7", visibility=Visibility.PRIVATE, user="G1", walled=True)
    member = Scope(tenant, channel="C1", user="U1")

    assert [p["arxiv_id"] for p in await kb.papers(member)] == [local_id]
    assert await kb.papers(guest) == [] and await kb.paper(guest, local_id) is None
    vector = (await memory.embedder.embed(["Zanzibar paging budgets"]))[0]
    assert [p.arxiv_id for p in await kb.search(member, "Zanzibar paging", vector, k=5)]
    assert await kb.search(guest, "Zanzibar paging", vector, k=5) == []


def test_no_id_we_make_passes_for_an_arxiv_id():
    for prefix in NOT_ARXIV_PREFIXES:
        assert not is_from_arxiv(f"{prefix}0123456789ab")
    assert is_from_arxiv(ARXIV.arxiv_id) and is_from_arxiv("hep-th/9901001v2")


def test_a_pdf_ingested_from_a_file_is_named_as_one_not_as_an_arxiv_paper():
    local = {"arxiv_id": "local-0123456789ab", "title": "Budget notes", "url": "file:///srv/n.pdf"}
    assert PaperInfo.of(local).label == paper_label(local["arxiv_id"]) == "PDF file"
    assert PassageView(local["arxiv_id"], "Budget notes", "", 0, "text").label == "PDF file"
    assert _paper_line(local) == "Budget notes · PDF file"  # the App Home: no server path
    without_url = PaperInfo.of({**local, "url": ""})
    assert "arxiv.org" not in without_url.url
    arxiv = {"arxiv_id": "2310.08560", "title": "MemGPT"}
    assert PaperInfo.of(arxiv).label == "arXiv:2310.08560"
    assert PaperInfo.of(arxiv).url == "https://arxiv.org/abs/2310.08560"
