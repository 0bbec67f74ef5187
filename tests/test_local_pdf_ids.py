"""A PDF the operator ingests from a file is the team's own (`local-…`), whatever its name: a
name like `2024.12345.pdf` makes it no arXiv paper (which guests and other organisations may
read, linked to arxiv.org), and no `file://` link shows users the server's paths."""

from __future__ import annotations

from bot.citations import passage_link
from memory.ingest.pipeline import ingest
from memory.scope import Scope, Visibility
from memory.tokens import encoding_for
from tests.support.pdfs import make_pdf


async def test_a_pdf_named_like_an_arxiv_id_stays_local_and_unlinked(memory, tenant, tmp_path):
    notes = tmp_path / "2024.12345.pdf"
    notes.write_bytes(make_pdf(title="Paging budgets of the Zanzibar team"))
    kb = memory.knowledge_base
    report = await ingest([str(notes)], Scope(tenant), kb, memory.embedder,
                          encoding_for("gpt-4o"), None, progress=False)  # fmt: skip
    [(paper_id, _, _)] = report.ingested
    assert paper_id.startswith("local-")
    member = Scope(tenant, channel="C1", user="U1")
    guest = Scope(tenant, channel="C7", visibility=Visibility.PRIVATE, user="G1", walled=True)
    [record] = await kb.papers(member)
    assert record["arxiv_id"] == paper_id and record["url"] == ""
    assert await kb.papers(guest) == [] and await kb.paper(guest, "2024.12345") is None

    vector = (await memory.embedder.embed(["Zanzibar paging budgets"]))[0]
    passages = await kb.search(member, "Zanzibar paging", vector, k=5)
    assert passages and {p.arxiv_id for p in passages} == {paper_id}
    assert all(p.url == "" and passage_link(p) == "" for p in passages)
    shown = kb.segment(passages).render()
    assert "file:" not in shown and str(tmp_path) not in shown and "arxiv.org" not in shown
    assert await kb.search(guest, "Zanzibar paging", vector, k=5) == []
