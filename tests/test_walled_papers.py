"""A walled place (a guest, another organisation: memory/scope.py) reads the team's arXiv
papers, a public text, but not a PDF shared in a public channel; a watch's digest outside a
public channel names only what its place may read."""

from __future__ import annotations

from memory.digest import reader
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.knowledge_base import Chunk, Paper
from memory.stores.watches import Watch

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
    await _library(memory, tenant)
    kb = memory.knowledge_base

    def watch(audience: str) -> Watch:
        return Watch("w1", tenant, "paging", 86_400, "slack", "C7", audience=audience)

    public = {p["arxiv_id"] for p in await kb.papers(reader(watch(PUBLIC)))}
    private = {p["arxiv_id"] for p in await kb.papers(reader(watch("private:C7")))}
    assert public == {ARXIV.arxiv_id, SHARED.arxiv_id}
    assert private == {ARXIV.arxiv_id, MINE.arxiv_id}
