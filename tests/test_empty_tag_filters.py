"""redisvl renders a tag filter on "" as `*` (match everything): an id that reduces to nothing
(`""`, or `"v2"`, which `base_arxiv_id` strips to "") must never become one."""

from __future__ import annotations

import pytest
from redisvl.query.filter import Tag

from memory.governance import NotFound
from memory.governance_sweeps import delete_where
from memory.scope import Scope
from memory.stores.knowledge_base import Chunk, Paper

TEXTS = ["Virtual context management pages memory.", "Tiers of memory, like an OS."]


async def _add_two_papers(memory, tenant: str) -> None:
    vectors = await memory.embedder.embed(TEXTS)
    for arxiv_id, title in [("2310.08560", "MemGPT"), ("1605.08386", "Heat-bath walks")]:
        chunks = [Chunk(text, "Introduction", i) for i, text in enumerate(TEXTS)]
        paper = Paper(arxiv_id, title, source="arxiv")
        await memory.knowledge_base.add_paper(Scope(tenant), paper, chunks, vectors)


async def _chunk_count(memory, tenant: str) -> int:
    kb = memory.knowledge_base
    return len(await memory.redis.keys(f"{kb.key_prefix(tenant)}*"))


async def test_forgetting_a_paper_by_an_empty_id_deletes_nothing(memory, tenant):
    await _add_two_papers(memory, tenant)
    assert await _chunk_count(memory, tenant) == 4
    for empty in ["v2", "", "  "]:
        with pytest.raises(NotFound, match="No paper"):
            await memory.governance.forget_paper(tenant, empty)
    assert await _chunk_count(memory, tenant) == 4
    assert len(await memory.knowledge_base.papers(Scope(tenant))) == 2
    erasure = await memory.governance.forget_paper(tenant, "2310.08560v2")  # a real one goes
    assert (erasure.papers, erasure.chunks) == (1, 2) and await _chunk_count(memory, tenant) == 2


async def test_no_deletion_runs_on_a_filter_that_matches_everything(memory, tenant):
    await _add_two_papers(memory, tenant)
    with pytest.raises(ValueError, match="filter is empty"):
        await delete_where(memory.knowledge_base, tenant, Tag("arxiv_id") == "", ["arxiv_id"])
    assert await _chunk_count(memory, tenant) == 4


async def test_a_knowledge_base_search_in_an_empty_paper_id_is_refused(memory, tenant):
    await _add_two_papers(memory, tenant)
    vector = (await memory.embedder.embed(["virtual context"]))[0]
    with pytest.raises(ValueError, match="not a paper id"):
        await memory.knowledge_base.search(Scope(tenant), "context", vector, arxiv_id="v2")
    found = await memory.knowledge_base.search(
        Scope(tenant), "context", vector, arxiv_id="2310.08560v1"
    )
    assert found and {p.arxiv_id for p in found} == {"2310.08560"}
