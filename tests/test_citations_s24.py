"""A made-up "[arXiv:id]" is never a link (cite and the stream unbracket it), the knowledge-base
search finds a paper by its id however the model writes it, and a long answer cut to a few
messages keeps its Sources list."""

from __future__ import annotations

import pytest

from adapters.text import link_arxiv, split_for_delivery, split_message
from bot.citations import CitationStream, SourceRegistry, cite
from bot.tools import search_knowledge_base
from memory.scope import Scope
from memory.stores.knowledge_base import Passage
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID, MEMGPT_TITLE
from tests.support.scripted_openai import call, text, tool_calls

MADE_UP = "2401.99999"


def memgpt_passage(chunk: int) -> Passage:
    content = "MemGPT pages memory between a main context and an archival store. " * 3
    return Passage(
        MEMGPT_ID, MEMGPT_TITLE, "2 Method", chunk, content,
        f"https://arxiv.org/abs/{MEMGPT_ID}v2", 2023, 0.5, page=4,
    )  # fmt: skip


# -- a bracketed paper id ---------------------------------------------------------------------

ANSWER = (
    f"MemGPT pages memory [1] [arXiv:{MEMGPT_ID}v2]. A follow-up extends it [arXiv:{MADE_UP}]; "
    f"see `[arXiv:{MADE_UP}]` and [a link](https://x.org) [arXiv:{MADE_UP}](https://x.org)."
)
DELIVERED = (
    f"MemGPT pages memory [1] [arXiv:{MEMGPT_ID}v2]. A follow-up extends it arXiv:{MADE_UP}; "
    f"see `[arXiv:{MADE_UP}]` and [a link](https://x.org) [arXiv:{MADE_UP}](https://x.org)."
)


def test_a_made_up_paper_id_is_left_as_text_not_linked():
    cited = cite(ANSWER, SourceRegistry([memgpt_passage(0)]))
    assert cited.text.split("\n\nSources:\n")[0] == DELIVERED
    linked = link_arxiv(cited.text)
    assert f"(https://arxiv.org/abs/{MEMGPT_ID}v2)" in linked
    assert f"arxiv.org/abs/{MADE_UP}" not in linked and f"`[arXiv:{MADE_UP}]`" in linked

    nothing_shown = cite(f"Read [arXiv:{MADE_UP}] [7].", SourceRegistry())
    assert nothing_shown.text == f"Read arXiv:{MADE_UP} [7]."

    searched = SourceRegistry()  # a search result or a saved paper, shown without passages
    searched.show_paper(f"{MADE_UP}v3")
    assert cite(f"Read [arXiv:{MADE_UP}].", searched).text == f"Read [arXiv:{MADE_UP}]."


async def test_the_stream_unbrackets_a_made_up_id_however_it_is_split():
    registry = SourceRegistry([memgpt_passage(0)])
    splits = [[ANSWER[:i], ANSWER[i:]] for i in range(1, len(ANSWER))] + [list(ANSWER)]
    for pieces in splits:
        sent: list[str] = []
        stream = CitationStream(registry, sent.append)
        for piece in pieces:
            await stream(piece)
            shown = "".join(sent)  # never a made-up id linkable on screen, not for a moment
            assert f"arxiv.org/abs/{MADE_UP}" not in link_arxiv(shown), pieces
        await stream.flush()
        assert "".join(sent) == DELIVERED, pieces


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_links_the_papers_its_tools_showed_and_no_other(world, tenant):
    scope = Scope(tenant, "t")
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})),
        text(f"MemGPT [arXiv:{MEMGPT_ID}] pages memory; its sequel is [arXiv:{MADE_UP}]."),
    )
    sent: list[str] = []
    result = await world.agent.run_turn(scope, "Find MemGPT", on_delta=sent.append)
    delivered = f"MemGPT [arXiv:{MEMGPT_ID}] pages memory; its sequel is arXiv:{MADE_UP}."
    assert result.answer == delivered and "".join(sent) == delivered


async def test_a_turn_links_a_paper_the_person_named_without_a_tool(world, tenant):
    """An id the model was shown in its question (or memory) is no invention: it stays a link."""
    scope = Scope(tenant, "t-named")
    world.model.script(text(f"[arXiv:{MEMGPT_ID}] pages memory; [arXiv:{MADE_UP}] does not."))
    result = await world.agent.run_turn(scope, f"What does {MEMGPT_ID}v2 do?")
    assert result.answer == f"[arXiv:{MEMGPT_ID}] pages memory; arXiv:{MADE_UP} does not."


async def test_a_made_up_id_stays_unlinked_in_the_next_turn(world, tenant):
    """The stored answer has it unbracketed, and memory counts only bracketed (once shown) ids."""
    scope = Scope(tenant, "t-twice")
    world.model.script(text(f"Its sequel is [arXiv:{MADE_UP}]."), text(f"Yes, [arXiv:{MADE_UP}]."))
    first = await world.agent.run_turn(scope, "What came after MemGPT?")
    again = await world.agent.run_turn(scope, "Say it again")
    assert first.answer == f"Its sequel is arXiv:{MADE_UP}."
    assert again.answer == f"Yes, arXiv:{MADE_UP}."


async def test_a_paper_an_earlier_answer_cited_is_shown_by_searching_conversations(world, tenant):
    """search_conversations brings back an old answer's "[arXiv:id]": citing it is no invention."""
    from bot.llm import ToolCall
    from memory.stores.episodic_episode import Episode

    said = f"MemGPT [arXiv:{MEMGPT_ID}] pages its memory like an operating system."
    await world.runtime.memory.episodes.add(Scope(tenant), [Episode(
        id="m-old", thread="t-old", channel="old", audience="public", author="bot",
        author_name="ArxivScout", text=said, ts=1_767_600_000.0, seq=0, role="assistant",
    )])  # fmt: skip
    sources = SourceRegistry()
    call = ToolCall("c1", "search_conversations", '{"query": "MemGPT memory", "where": "team"}')
    output, _ = await world.runtime.harness.run_tool(Scope(tenant, "t-new"), call, 1, sources)
    assert said in output and sources.shows_paper(MEMGPT_ID) and not sources.shows_paper(MADE_UP)


# -- the knowledge-base search by paper id ----------------------------------------------------


async def test_the_paper_filter_takes_the_id_as_the_tools_show_it(world, tenant):
    scope = Scope(tenant, "t")
    saved = f"Saved [arXiv:{MEMGPT_ID}]; not [arXiv:{MADE_UP}]."
    world.model.script(tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})),
                       text(saved))  # fmt: skip
    result = await world.agent.run_turn(scope, "Save MemGPT")
    assert result.answer == saved.replace(f"[arXiv:{MADE_UP}]", f"arXiv:{MADE_UP}")
    ctx = world.runtime.harness.tool_context(scope)
    for written in [
        MEMGPT_ID, f"arXiv:{MEMGPT_ID}", f"arxiv: {MEMGPT_ID}v2",
        f"https://arxiv.org/abs/{MEMGPT_ID}v1", f"https://arxiv.org/pdf/{MEMGPT_ID}.pdf",
    ]:  # fmt: skip
        found = await search_knowledge_base(ctx, "archival store paging", arxiv_id=written)
        assert f"[arXiv:{MEMGPT_ID}]" in found, (written, found)
    missing = await search_knowledge_base(ctx, "paging", arxiv_id=f"arXiv:{MADE_UP}")
    assert missing.startswith(f"Paper {MADE_UP} is not in the knowledge base")
    with pytest.raises(ValueError):
        await search_knowledge_base(ctx, "paging", arxiv_id="v2")


# -- a long answer cut to a few messages ------------------------------------------------------


def test_a_truncated_answer_keeps_its_sources_list():
    registry = SourceRegistry([memgpt_passage(0), memgpt_passage(1)])
    long = ("MemGPT pages memory [1], and tiers it [2]. " * 40 + "\n\n") * 20
    cited = cite(long, registry)
    sources = cited.text[cited.text.index("Sources:\n") :]
    parts = split_for_delivery(link_arxiv(cited.text), 2000)
    assert len(parts) == 8 and all(len(p) <= 2000 for p in parts)
    assert parts[-1].endswith(link_arxiv(sources))
    assert "answer truncated here" in parts[-2]  # the body is cut, in the parts before

    many = "\n".join(f"- [{i}] [A title {i}](https://x.org/{i})" + " x" * 900 for i in range(9))
    too_many = f"{long}\n\nSources:\n{many}"  # a list longer than the parts: cut as before
    cut = split_for_delivery(too_many, 2000)
    assert len(cut) == 8 and all(len(p) <= 2000 for p in cut) and "truncated" in cut[-1]
    short = cite("MemGPT pages memory [1].", registry).text
    assert split_for_delivery(short, 2000) == split_message(short, 2000)
