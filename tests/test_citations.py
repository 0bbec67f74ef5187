"""Passage citations: numbered passages, unshown citations removed and counted, the Sources
list (section, page, link), pages kept from PDFs through ingestion, and a whole turn."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from bot.citations import (
    HOLD_CHARS,
    CitationStream,
    SourceRegistry,
    add_citations,
    cite,
    passage_link,
)
from memory.embeddings import CachedEmbedder
from memory.ingest.chunking import chunk_paragraphs
from memory.ingest.pdf import pdf_paragraphs, read_pdf
from memory.ingest.pipeline import ingest
from memory.scope import Scope
from memory.stores.knowledge_base import KnowledgeBase, Passage
from memory.tokens import encoding_for
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID, MEMGPT_TITLE
from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import call, text, tool_calls

ARXIV_URL = f"https://arxiv.org/abs/{MEMGPT_ID}v2"
PDF_URL = "https://files.example.com/shared/notes.pdf"


def arxiv_passage(chunk: int, section: str = "2 Method", page: int | None = 4) -> Passage:
    return Passage(
        MEMGPT_ID, MEMGPT_TITLE, section, chunk, f"MemGPT passage {chunk}.", ARXIV_URL, 2023,
        0.5, page=page,
    )  # fmt: skip


def pdf_passage(chunk: int, page: int | None = 3) -> Passage:
    return Passage("local-abc123", "Team notes", "", chunk, "Notes.", PDF_URL, None, 0.5, page=page)


def registry_of(count: int) -> SourceRegistry:
    return SourceRegistry([arxiv_passage(i) for i in range(count)])


# -- numbering --------------------------------------------------------------------------------


def test_the_segment_and_tool_results_share_the_turns_numbers():
    context = [arxiv_passage(0), arxiv_passage(1)]
    segment = KnowledgeBase.segment(context).render()
    registry = SourceRegistry(context)  # numbered as the segment shows them
    assert f"[1] [arXiv:{MEMGPT_ID}] {MEMGPT_TITLE} (2023) — section: 2 Method — page 4" in segment
    assert f"\n[2] [arXiv:{MEMGPT_ID}]" in segment

    found = [arxiv_passage(5), arxiv_passage(1), pdf_passage(0)]  # chunk 1 was shown already
    numbers = registry.numbers(found)
    assert numbers == [3, 2, 4]
    shown = KnowledgeBase.segment(found, numbers).render()
    assert "[3] [arXiv:" in shown and "\n[2] [arXiv:" in shown and "\n[4] [arXiv:local-" in shown
    assert registry.numbers([arxiv_passage(5)]) == [3] and len(registry) == 4
    assert registry.get(4) == pdf_passage(0) and registry.get(5) is None
    with pytest.raises(ValueError):
        KnowledgeBase.segment(found, [1])


def test_passages_read_again_from_a_tool_log_get_this_turns_numbers():
    earlier = SourceRegistry([arxiv_passage(8), arxiv_passage(1)])
    logged = KnowledgeBase.segment([arxiv_passage(8), arxiv_passage(1)], [1, 2]).render()
    unnumbered = KnowledgeBase.segment([pdf_passage(2, page=None)]).render()
    unnumbered = unnumbered.replace("[1] [arXiv:", "[arXiv:")  # as logged before numbers
    registry = SourceRegistry([arxiv_passage(1)])  # this turn showed chunk 1 as [1]
    again = registry.renumber(logged + "\n\n" + unnumbered.split("\n\n", 1)[1])
    headers = [line for line in again.splitlines() if "] [arXiv:" in line]
    assert [(h[:3], h.rsplit(" ", 1)[1]) for h in headers] == [
        ("[2]", "8"),
        ("[1]", "1"),
        ("[3]", "2"),
    ]
    assert "\n[3] [arXiv:local-abc123] Team notes — chunk 2\nLink: " in again
    assert registry.get(2) == Passage(
        MEMGPT_ID, MEMGPT_TITLE, "2 Method", 8, "MemGPT passage 8.", ARXIV_URL, 2023, 0.0, page=4
    )
    assert registry.get(3).content == "Notes." and registry.get(3).page is None
    assert earlier.get(1).chunk_index == 8  # each turn numbers on its own


# -- citations in the answer ------------------------------------------------------------------


def test_a_citation_to_an_unshown_number_is_removed_and_counted():
    cited = cite("MemGPT pages memory [1]. It also flies [7]. And swims [9], fast.", registry_of(2))
    body = cited.text.split("\n\nSources:\n")[0]
    assert body == "MemGPT pages memory [1]. It also flies. And swims, fast."
    assert cited.removed == 2
    assert [s.number for s in cited.sources] == [1]


@pytest.mark.parametrize(
    ("answer", "body", "removed", "numbers"),
    [
        ("A [1, 3] b [2].", "A [1, 3] b [2].", 0, [1, 3, 2]),
        ("A [1, 7] b [2;9].", "A [1] b [2].", 2, [1, 2]),
        ("A [2-4].", "A [2-4].", 0, [2, 3, 4]),
        ("A [3–7].", "A [3, 4].", 3, [3, 4]),
        ("A [1-2, 4].", "A [1-2, 4].", 0, [1, 2, 4]),
        ("A [6-8] b [1][8].", "A b [1].", 4, [1]),
        ("A [1, 2, 3, 8].", "A [1-3].", 1, [1, 2, 3]),
    ],
)
def test_ranges_and_lists(answer, body, removed, numbers):
    cited = cite(answer, registry_of(4))
    assert cited.text.split("\n\nSources:\n")[0] == body
    assert cited.removed == removed
    assert [s.number for s in cited.sources] == numbers


def test_brackets_that_are_not_citations_are_left_alone():
    answer = (
        "In [2023] they wrote x[7] and [7](https://example.com) and `[7]`:\n"
        "```\nvalues[9] = [8]\n```\n[8]: https://example.com/ref"
    )
    cited = cite(answer, registry_of(2))
    assert cited.text == answer and cited.removed == 0 and cited.sources == []


@pytest.mark.parametrize(
    "answer",
    [
        "Scores are normalised to [0, 1] before ranking.",  # a 0: never a passage number
        "a matrix of shape [2, 3] is used",  # after a naming noun
        "See equation [3]",
        "See Eq. [3] and Fig. [2].",
        "The table [2] lists them; step [4] repeats.",
        "Batches of size [8, 16] fit.",
        "Values in [2, 5] are clipped.",  # an interval after a preposition, 5 not shown
        "It maps x to [1, 9].",
        "Set x = [2, 3] and y ∈ [4, 6].",  # after a math sign
        "Indices [01] and [1.5] and [1]st and [1000] stay.",  # not the shape of a citation
    ],
)
def test_brackets_in_no_citation_position_are_left_alone(answer):
    cited = cite(answer, registry_of(1))
    assert cited.text == answer and cited.removed == 0 and cited.sources == []


@pytest.mark.parametrize(
    "answer", ["Probabilities lie in [0, 1].", "It flies [7].", "Paging [1, 2] and [3-5]."]
)
def test_with_no_passage_shown_the_answer_is_left_as_written(answer):
    cited = cite(answer, SourceRegistry())
    assert cited.text == answer and cited.removed == 0 and cited.sources == []


@pytest.mark.parametrize(
    ("answer", "body", "numbers"),
    [
        ("As shown in [1, 2], it pages.", "As shown in [1, 2], it pages.", [1, 2]),  # both shown
        ("As described in [7].", "As described in.", []),  # one number after "in": a citation
        ("It pages in a loop [1, 9].", "It pages in a loop [1].", [1]),  # "loop" names nothing
        ("**Paging** [1]. The end. [9] Next.", "**Paging** [1]. The end. Next.", [1]),
        ("Memory is tiered [2]\nand paged [8].", "Memory is tiered [2]\nand paged.", [2]),
    ],
)
def test_brackets_in_citation_position_are_checked(answer, body, numbers):
    cited = cite(answer, registry_of(2))
    assert cited.text.split("\n\nSources:\n")[0] == body
    assert [s.number for s in cited.sources] == numbers


# -- citations while the answer streams -------------------------------------------------------


async def streamed(pieces: list[str], registry: SourceRegistry) -> list[str]:
    """What the platform is sent for `pieces`, one model reply."""
    sent: list[str] = []
    stream = CitationStream(registry, sent.append)
    for piece in pieces:
        await stream(piece)
    await stream.flush()
    return sent


def splits(text: str) -> list[list[str]]:
    """`text` in two pieces at every place, and one character at a time."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


STREAMED = [
    "MemGPT pages memory [1]. It also flies [7]. And swims [9], fast.",
    "A [1, 7] b [2;9] c [12] d [2-4].",
    "Normalised to [0, 1], of shape [2, 3], see equation [3]; x[7] and [7](https://x.org).",
    "Ref [8]: https://example.com/ref and `[7]` and [7]:a.",
    "Open [1, 2 never closed, and [a] and [ 1 ] end [7]",
]


@pytest.mark.parametrize("answer", STREAMED)
async def test_the_stream_shows_what_cite_delivers_however_it_is_split(answer):
    registry = registry_of(2)
    body = cite(answer, registry).text.split("\n\nSources:\n")[0]
    for pieces in splits(answer):
        sent = await streamed(pieces, registry)
        assert "".join(sent) == body, pieces
        shown = ""
        for piece in sent:  # no made-up number is ever on screen, not even for a while
            shown += piece
            assert "[7]" not in shown.replace("`[7]`", "").replace("[7](", "").replace("x[7]", "")
            assert "[9]" not in shown and "[12]" not in shown and "[2;9]" not in shown


async def test_the_stream_holds_a_bracket_only_until_it_can_tell():
    sent: list[str] = []
    stream = CitationStream(registry_of(2), sent.append)
    await stream("Paging [")
    assert sent == ["Paging"]  # the space may belong to a citation, and goes with it
    await stream("1")
    await stream("]")
    assert sent == ["Paging"]  # "[1](" would be a link: one more character tells
    await stream(" and [x")
    assert "".join(sent) == "Paging [1] and [x"
    await stream(" [" + "1, " * HOLD_CHARS)  # too long for a citation: it is text
    held = "".join(sent)  # all of it as text but the last space: a citation may follow it
    assert held.endswith("[x [" + "1, " * (HOLD_CHARS - 1) + "1,")
    await stream.flush()
    await stream("[7]")  # a new reply; its end is held until it ends
    assert "[7]" not in "".join(sent)
    await stream.flush()
    assert "".join(sent).endswith("1, ")
    empty: list[str] = []
    await CitationStream(SourceRegistry(), empty.append)("It flies [7].")
    assert empty == ["It flies [7]."]  # nothing shown: nothing to check


def test_the_sources_list_gives_section_page_and_link():
    registry = SourceRegistry([arxiv_passage(0, "2 Method", 4), pdf_passage(3, page=2)])
    registry.number(arxiv_passage(1, "", None))
    cited = cite("Paging [2]. Tiers [1]. Again [2]. Bare [3].", registry)
    body, sources = cited.text.split("\n\nSources:\n")
    assert body == "Paging [2]. Tiers [1]. Again [2]. Bare [3]."
    assert sources.splitlines() == [  # in the order first cited
        f"- [2] [Team notes]({PDF_URL}#page=2) — p. 2",
        f"- [1] [{MEMGPT_TITLE}](https://arxiv.org/abs/{MEMGPT_ID}) — §2 Method — p. 4",
        f"- [3] [{MEMGPT_TITLE}](https://arxiv.org/abs/{MEMGPT_ID})",
    ]
    assert [(s.number, s.arxiv_id, s.page) for s in cited.sources] == [
        (2, "local-abc123", 2), (1, MEMGPT_ID, 4), (3, MEMGPT_ID, None)
    ]  # fmt: skip


def test_links():
    assert passage_link(arxiv_passage(0)) == f"https://arxiv.org/abs/{MEMGPT_ID}"
    assert passage_link(pdf_passage(0, page=7)) == f"{PDF_URL}#page=7"
    assert passage_link(pdf_passage(0, page=None)) == PDF_URL
    local = Passage("local-1", "Scan", "", 0, "x", "file:///tmp/a.pdf#old", None, 0.1, page=2)
    assert passage_link(local) == ""  # stored before local PDFs had no link: no server path
    assert passage_link(Passage("local-2", "No link", "", 0, "x", "", None, 0.1)) == ""


def test_an_answer_without_numbers_keeps_the_named_and_supported_fallback():
    passage = Passage(
        MEMGPT_ID, MEMGPT_TITLE, "", 0,
        "MemGPT pages information between a main context and an archival store.",
        ARXIV_URL, 2023, 0.5,
    )  # fmt: skip
    rests = "MemGPT pages information between its main context and an archival store."
    cited = cite(rests, SourceRegistry([passage]))
    assert (
        cited.text == f"{rests}\n\nSources:\n- [{MEMGPT_TITLE}](https://arxiv.org/abs/{MEMGPT_ID})"
    )
    assert [(s.number, s.arxiv_id) for s in cited.sources] == [(None, MEMGPT_ID)]
    assert cite("MemGPT is a paper.", SourceRegistry([passage])).text == "MemGPT is a paper."
    assert add_citations("The weather is fine.", [passage]) == "The weather is fine."


# -- pages ------------------------------------------------------------------------------------


def test_pdf_paragraphs_keep_their_page():
    pdf = read_pdf(make_pdf(page_break_after=1))
    pages = dict(zip((t[:20] for _, t in pdf.paragraphs), pdf.paragraph_pages, strict=True))
    assert pages["Large language model"] == 1 and pages["The hierarchical mem"] == 2
    assert [p for _, _, p in pdf.located()] == pdf.paragraph_pages
    assert pdf_paragraphs(make_pdf()) == pdf.paragraphs  # the pairs API is unchanged


def test_chunks_start_on_the_page_of_their_first_token():
    enc = encoding_for("gpt-4o")
    words = " ".join(f"w{i}" for i in range(150))
    paragraphs = [("A", words, 1), ("A", words, 2), ("A", words, 3), ("B", "short", 5)]
    chunks = chunk_paragraphs(paragraphs, enc, max_tokens=200, overlap=16)
    assert [c.page for c in chunks if c.section == "B"] == [5]
    a_chunks = [c for c in chunks if c.section == "A"]
    assert a_chunks[0].page == 1 and a_chunks[-1].page in (2, 3)
    assert [c.page for c in a_chunks] == sorted(c.page for c in a_chunks)
    long = chunk_paragraphs([("S", words * 4, 9)], enc, max_tokens=64, overlap=8)
    assert len(long) > 3 and {c.page for c in long} == {9}
    assert {c.page for c in chunk_paragraphs([("S", words)], enc)} == {None}  # pairs: no page


async def test_pages_survive_ingestion_and_search(redis_url, local_embedder, tenant, tmp_path):
    client = Redis.from_url(redis_url)
    kb = KnowledgeBase(client, CachedEmbedder(local_embedder, client))
    await kb.open()
    try:
        path = tmp_path / "team-notes.pdf"
        path.write_bytes(make_pdf(title="Team notes", page_break_after=1))
        report = await ingest(
            [str(path)], Scope(tenant), kb, kb.embedder, encoding_for("gpt-4o"), None,
            progress=False,
        )  # fmt: skip
        assert not report.failed
        question = "hierarchical memory archival store vector index"
        vector = (await kb.embedder.embed([question]))[0]
        passages = await kb.search(Scope(tenant), question, vector, k=5)
        method = next(p for p in passages if p.section == "2 Method")
        intro = next(p for p in passages if p.section == "1 Introduction")
        assert (intro.page, method.page) == (1, 2)
        assert passage_link(method) == "" and method.url == ""  # no server path, stored or shown
        assert "— section: 2 Method — page 2 — chunk" in KnowledgeBase.segment([method]).render()
        # a record from before pages: no page, and no page in its header or link
        await client.hdel(kb.chunk_key(tenant, method.arxiv_id, method.chunk_index), "page")
        again = await kb.search(Scope(tenant), question, vector, k=5)
        old = next(p for p in again if p.chunk_index == method.chunk_index)
        assert old.page is None and passage_link(old) == ""
    finally:
        await client.aclose()


# -- a whole turn -----------------------------------------------------------------------------


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_keeps_shown_citations_drops_made_up_ones_and_lists_sources(world, tenant):
    scope = Scope(tenant, "t")
    world.model.script(
        tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})),
        tool_calls(call("search_knowledge_base", {"query": "archival store paging"})),
        text("MemGPT pages memory between a main context and an archival store [1]. "
             "It was also tested on Mars [7]."),
    )  # fmt: skip
    result = await world.agent.run_turn(scope, "How does MemGPT manage memory?")
    shown = [m["content"] for m in world.model_requests()[-1]["messages"] if m["role"] == "tool"]
    assert (
        shown[-1].startswith("## Knowledge Base Memory\n")
        and f"[1] [arXiv:{MEMGPT_ID}]" in shown[-1]
    )
    body, sources = result.answer.split("\n\nSources:\n")
    assert body == (
        "MemGPT pages memory between a main context and an archival store [1]. "
        "It was also tested on Mars."
    )
    assert result.citations_removed == 1
    assert [s.number for s in result.sources] == [1]
    first = result.sources[0]
    assert sources == (
        f"- [1] [{MEMGPT_TITLE}](https://arxiv.org/abs/{MEMGPT_ID})"
        + (f" — §{first.section}" if first.section else "")
        + (f" — p. {first.page}" if first.page else "")
    )
    assert first.page in (1, 2) if first.section != "Abstract" else first.page is None
    stored = await world.runtime.memory.conversation.all(scope)
    assert stored[-1].content == result.answer  # what is delivered is what is remembered

    # Next turn: the context shows the passages numbered; the same chunk found again by the
    # tool keeps its number, a citation beyond what was shown goes.
    world.model.script(
        tool_calls(call("search_knowledge_base", {"query": "archival store paging"})),
        text("It pages memory [1, 2] and more [40]."),
    )
    again = await world.agent.run_turn(scope, "What does MemGPT page, and between what?")
    request = world.model_requests()[-1]["messages"]
    context = request[1]["content"].split("## Knowledge Base Memory")[1].split("## Workflow")[0]
    tool = [m["content"] for m in request if m["role"] == "tool"][-1]
    headers = {line.split("] [arXiv:")[1]: line.split("]")[0] for line in context.splitlines()
               if line.startswith("[") and "] [arXiv:" in line}  # fmt: skip
    assert headers and sorted(headers.values()) == [f"[{i}" for i in range(1, len(headers) + 1)]
    for line in tool.splitlines():
        if "] [arXiv:" in line:  # the same chunk, the same number as in the context
            assert headers[line.split("] [arXiv:")[1]] == line.split("]")[0]
    assert again.citations_removed == 1 and [s.number for s in again.sources] == [1, 2]
    assert "[40]" not in again.answer and again.answer.startswith(
        "It pages memory [1, 2] and more."
    )


async def test_a_streamed_turn_never_shows_a_made_up_citation(world, tenant):
    scope = Scope(tenant, "t")
    world.model.script(  # the server streams 8 characters at a time: brackets split across them
        tool_calls(
            call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID}),
            content="Fetching it [3]. ",  # nothing shown yet: no bracket can be a citation
        ),
        tool_calls(call("search_knowledge_base", {"query": "archival store paging"})),
        tool_calls(
            call("search_knowledge_base", {"query": "MemGPT main context"}),
            content="Checking [1] and [1, 40]. ",  # between tools: the numbers shown so far
        ),
        text("MemGPT pages memory [1]. Values in [0, 1] are scores; it was tested on Mars [17]."),
    )
    sent: list[str] = []
    result = await world.agent.run_turn(
        scope, "How does MemGPT manage memory?", on_delta=sent.append
    )
    body = "MemGPT pages memory [1]. Values in [0, 1] are scores; it was tested on Mars."
    assert "".join(sent) == "Fetching it [3]. Checking [1] and [1]. " + body
    assert result.answer.split("\n\nSources:\n")[0] == body and result.citations_removed == 1
