"""The knowledge base's BM25 half runs unfiltered when only the audience filters, and filters
its rows in Python (`KnowledgeBase._text_admitted`): what each place finds must be what the
filtered query finds, also when the best text matches are all passages it may not see."""

from __future__ import annotations

from memory.scope import Scope, Visibility
from memory.stores.knowledge_base import Chunk, Paper

PRIVATE = "private:C_SECRET"


async def _add(memory, tenant: str, paper_id: str, texts: list[str], audience: str) -> None:
    vectors = await memory.embedder.embed(texts)
    chunks = [Chunk(text, "Results", i) for i, text in enumerate(texts)]
    paper = Paper(paper_id, f"Paper {paper_id}", source="pdf")
    await memory.knowledge_base.add_paper(Scope(tenant), paper, chunks, vectors, audience=audience)


def _public(tenant: str) -> Scope:
    return Scope(tenant, "thread-1", "C_OPEN", Visibility.PUBLIC, "U1")


def _secret(tenant: str) -> Scope:
    return Scope(tenant, "thread-2", "C_SECRET", Visibility.PRIVATE, "U1")


async def test_the_text_half_finds_a_public_passage_behind_many_private_ones(memory, tenant):
    """Thirty private passages match the question's words better than the one public passage:
    the unfiltered rows (twice the candidates) hold no public one, so the filtered query runs
    and the public passage is found; the private ones never are, outside their channel."""
    question = "zebrafish fin regeneration"
    secret = [
        f"Zebrafish fin regeneration, zebrafish fin regeneration, run {i}." for i in range(30)
    ]
    await _add(memory, tenant, "pdf-secret", secret, PRIVATE)
    await _add(memory, tenant, "pdf-open", ["A note on zebrafish and other topics."], "public")
    kb = memory.knowledge_base
    # the text half alone: the vector half would find the public passage anyway
    rows = await kb._text_admitted(
        _public(tenant),
        question,
        10,
        kb.text_query(question, 10, kb.audience_filter(_public(tenant))),
    )
    found = [decode_id(r["id"]) for r in rows]
    assert len(found) == 1 and "pdf-open" in found[0]
    passages = await kb.search(
        _public(tenant), question, (await memory.embedder.embed([question]))[0]
    )
    assert {p.arxiv_id for p in passages} == {"pdf-open"}
    inside = await kb.search(
        _secret(tenant), question, (await memory.embedder.embed([question]))[0]
    )
    assert "pdf-secret" in {p.arxiv_id for p in inside}


async def test_the_text_half_keeps_the_filtered_order_when_enough_pass(memory, tenant):
    """When enough rows pass, the unfiltered rows filtered here are the filtered query's."""
    # each a different length: BM25 scores differ, so the order has no ties to break
    texts = [f"Graph neural networks for molecules. {'filler ' * i}" for i in range(25)]
    await _add(memory, tenant, "pdf-open", texts, "public")
    await _add(memory, tenant, "pdf-secret", texts[:5], PRIVATE)
    kb = memory.knowledge_base
    question = "graph neural networks molecules"
    scope = _public(tenant)
    filtered = kb.text_query(question, 10, kb.audience_filter(scope))
    expected = [r["id"] for r in await kb._run(tenant, filtered)]
    got = [r["id"] for r in await kb._text_admitted(scope, question, 10, filtered)]
    assert got == expected and len(got) == 10


def decode_id(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
