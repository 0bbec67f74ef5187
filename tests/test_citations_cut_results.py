"""A search result the harness cuts short numbers, and so lets the answer cite, only the passages
the model was shown whole: one cut at the limit, and those after it, are unnumbered and get
their numbers when `read_tool_log` shows them, the cut one whole from its header. A passage
whole only without its number is numbered all the same (unnumbered, it could never be cited).
Reading a log on from inside a passage always gets past where it was asked to read from, under
whatever numbers the reading turn gives. And the Sources list tells two chunks of one paper
apart when their section and page do not."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bot.citations import SourceRegistry, cite
from bot.tools import (
    LOG_INPUT_CHARS,
    LOG_NOTE_CHARS,
    TOOL_RESULT_CHARS,
    ToolContext,
    read_tool_log,
    shown_passages,
)
from memory.scope import Scope
from memory.stores.knowledge_base import Chunk, KnowledgeBase, Paper, Passage
from memory.stores.tool_log import ToolLogEntry
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, text, tool_calls

PAGING = "2402.00002"  # the long passages the tool finds
ZEBRA = "2401.00001"  # the short ones the question's context shows
NUMBERED = re.compile(r"^\[(?P<n>\d+)\] \[arXiv:", re.M)
READ_ON = re.compile(r'read_tool_log\("(?P<log>log_\w+)", offset=(?P<offset>\d+)\)\]\Z')


def paging_text(i: int) -> str:
    """About 950 characters: three passages and a bit overrun one tool result."""
    words = f"Archival paging, part {i}, moves memory between a main context and a store. "
    return (words * 14)[:950]


def paging_passage(i: int) -> Passage:
    return Passage(PAGING, "Paging Memory", "", i, paging_text(i), "", 2024, 0.5)


def whole_under(shown: str, number: int, arxiv_id: str, chunk: int, content: str) -> bool:
    """Whether `shown` has the passage under `number`, its header and all of its text."""
    item = (
        re.escape(f"[{number}] [arXiv:{arxiv_id}] ")
        + rf"[^\n]* — chunk {chunk}\nLink: [^\n]*\n"
        + re.escape(content)
        + r"(?:\n\n|\Z)"
    )
    return re.search(item, shown, re.M) is not None


def test_a_cut_search_result_numbers_only_the_passages_shown_whole():
    passages = [paging_passage(i) for i in range(5)]
    registry = SourceRegistry()
    output = shown_passages(passages, registry)
    seen = output[:TOOL_RESULT_CHARS]  # what the harness hands the model
    assert len(output) > TOOL_RESULT_CHARS
    whole = [i for i, p in enumerate(passages) if f"chunk {i}\nLink: \n{p.content}\n\n" in seen]
    assert whole == [0, 1] and len(registry) == 2  # the third is cut: not registered
    assert [int(n) for n in NUMBERED.findall(seen)] == [1, 2]  # no number on a cut passage
    assert [int(n) for n in NUMBERED.findall(output)] == [1, 2]  # nor on any after it
    for number, passage in enumerate(passages[:2], start=1):
        assert whole_under(seen, number, PAGING, passage.chunk_index, passage.content)

    cited = cite("Paging moves memory [1]. Its store is archival [3]. Tiers [5].", registry)
    assert cited.removed == 2 and [s.number for s in cited.sources] == [1]
    assert cited.text.split("\n\nSources:\n")[0] == (
        "Paging moves memory [1]. Its store is archival. Tiers."
    )

    fits = shown_passages(passages[2:4], registry)  # a result that fits: every one numbered
    assert len(fits) <= TOOL_RESULT_CHARS
    assert [int(n) for n in NUMBERED.findall(fits)] == [3, 4] and len(registry) == 4


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def save(world, scope: Scope, arxiv_id: str, title: str, texts: list[str]) -> None:
    memory = world.runtime.memory
    chunks = [Chunk(t, "", i) for i, t in enumerate(texts)]
    vectors = np.array(await memory.embedder.embed(texts))
    paper = Paper(arxiv_id, title, ["A. Author"], "2024-01-01", ["cs.CL"], "", "", "arxiv")
    await memory.knowledge_base.add_paper(scope, paper, chunks, vectors)


def cited_whole(result, shown: str, paging: list[str]) -> list[int]:
    """The chunks the answer's Sources list names, each checked shown whole under its number."""
    for source in result.sources:
        chunk = source.chunk_index
        assert source.arxiv_id == PAGING and chunk is not None
        assert whole_under(shown, source.number, PAGING, chunk, paging[chunk]), source
    return sorted(s.chunk_index for s in result.sources)


async def test_a_turn_cites_only_passages_it_read_whole_and_reads_the_cut_one_on(world, tenant):
    """The model cites every number it was shown; the Sources list names only passages it
    was shown whole under that number. Reading on from the cut shows the cut passage whole, from
    its header, and each one after it, under this turn's numbers: all are citable then."""
    zebra = [f"Zebra stripes, note {i}, confuse biting flies on the savanna." for i in range(5)]
    await save(world, Scope(tenant), ZEBRA, "Zebra Stripes", zebra)
    paging = [paging_text(i) for i in range(6)]
    await save(world, Scope(tenant), PAGING, "Paging Memory", paging)
    reading_on = False

    def model(body: dict):
        routed = world.route(body)
        if routed is not None:
            return routed
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            search = {"query": "archival paging main context", "k": 6, "arxiv_id": PAGING}
            return tool_calls(call("search_knowledge_base", search))
        note = READ_ON.search(results[-1])
        if note is not None and reading_on:
            read = {"log_id": note["log"], "offset": int(note["offset"])}
            return tool_calls(call("read_tool_log", read))
        numbers = sorted({int(n) for r in results for n in NUMBERED.findall(r)})
        return text(f"Paging moves memory between tiers [{', '.join(map(str, numbers))}].")

    world.model.router = model
    question = "Why do zebras have stripes?"  # its context shows the zebra passages, 1 to 5
    cut = await world.agent.run_turn(Scope(tenant, "t-cut"), question)
    request = world.model_requests()[-1]["messages"]
    context = request[1]["content"]
    assert f"[arXiv:{ZEBRA}]" in context and f"[arXiv:{PAGING}]" not in context
    (first,) = [m["content"] for m in request if m["role"] == "tool"]
    assert "[Truncated." in first  # the search was cut, and not read on
    assert cited_whole(cut, first, paging) and cut.citations_removed == 0
    assert len(cut.sources) < len(paging)

    reading_on = True
    read = await world.agent.run_turn(Scope(tenant, "t-read-on"), question)
    first, *pages = [m["content"] for m in world.model_requests()[-1]["messages"]
                     if m["role"] == "tool"]  # fmt: skip
    assert "[Truncated." in first and pages and len(read.steps) == 1 + len(pages)
    assert cited_whole(read, "\n\n".join([first, *pages]), paging) == list(range(6))
    assert read.citations_removed == 0


def test_sources_of_one_paper_alike_but_for_their_chunk_say_which_chunk():
    registry = SourceRegistry([paging_passage(7), paging_passage(3)])
    registry.number(Passage(PAGING, "Paging Memory", "2 Method", 4, "x", "", 2024, 0.5, page=2))
    registry.number(Passage(PAGING, "Paging Memory", "2 Method", 5, "y", "", 2024, 0.5, page=3))
    cited = cite("Paging [1]. Tiers [2]. Method [3]. More [4].", registry)
    link = f"https://arxiv.org/abs/{PAGING}"
    assert cited.text.split("\n\nSources:\n")[1].splitlines() == [
        f"- [1] [Paging Memory]({link}) — chunk 7",
        f"- [2] [Paging Memory]({link}) — chunk 3",
        f"- [3] [Paging Memory]({link}) — §2 Method — p. 2",  # told apart by their pages
        f"- [4] [Paging Memory]({link}) — §2 Method — p. 3",
    ]
    alone = cite("Paging [1].", registry)  # nothing to tell it from: as before
    assert alone.text.endswith(f"\n\nSources:\n- [1] [Paging Memory]({link})")


LOG_ID = "log_0123456789ab"
SEARCHED = {"query": "archival paging between a main context and a store " * 5}
CALLED = str(SEARCHED)[:LOG_INPUT_CHARS] + "…"  # as a page repeats it: a long one, cut
HEAD = f"Tool log {LOG_ID}: search_knowledge_base({CALLED}) -> success"
ROOM = TOOL_RESULT_CHARS - len(HEAD) - LOG_NOTE_CHARS  # of a page's text
# a passage's header, its number if it has one, and where its text ends
HEADER = re.compile(
    r"^(?:\[(?P<n>\d+)\] )?\[arXiv:[^\]\n]+\] [^\n]* — chunk (?P<chunk>\d+)\n", re.M
)
ANY_NUMBER = re.compile(r"^\[\d+\] (?=\[arXiv:)", re.M)
PAGE = re.compile(
    r"\ATool log (?P<log>log_\w+): [^\n]*\(characters (?P<start>[\d,]+) to (?P<end>[\d,]+) "
    r"of [\d,]+\)\n(?P<text>.*)\n\n\[(?:Read on with [^\n]*|End of the log)\]\Z",
    re.DOTALL,
)


def passage_of(chunk: int, length: int, arxiv_id: str = PAGING) -> Passage:
    """`length` characters of text, in lines of about a hundred."""
    line = "Archival paging moves memory between a main context and a store, a page at a time.\n"
    return Passage(arxiv_id, "Paging Memory", "", chunk, (line * 80)[:length], "", 2024, 0.5)


def context_sources(count: int) -> SourceRegistry:
    """A turn that has shown `count` passages already: the next one it numbers is count + 1."""
    return SourceRegistry([passage_of(i, 20, ZEBRA) for i in range(count)])


def passage_ends(output: str) -> list[tuple[int | None, int]]:
    """Each passage of `output`: its number (None if unnumbered) and where its text ends."""
    headers = list(HEADER.finditer(output))
    ends = [h.start() - 2 for h in headers[1:]] + [len(output)]
    return [(int(h["n"]) if h["n"] else None, end) for h, end in zip(headers, ends, strict=True)]


async def write_log(memory, scope: Scope, output: str) -> None:
    entry = ToolLogEntry(scope.thread, "search_knowledge_base", SEARCHED, output, "success",
                         id=LOG_ID)  # fmt: skip
    await memory.tool_logs.write(scope, entry)


async def read_pages(memory, scope: Scope, sources: SourceRegistry, offset: int, output: str):
    """The pages read on from `offset`, as the notes say, each (start, end, text); a page that
    does not get past where it was asked to read from fails, so this always ends."""
    ctx = ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None,  # type: ignore[arg-type]
                      sources=sources)  # fmt: skip
    pages = []
    while offset < len(output):
        page = await read_tool_log(ctx, LOG_ID, offset)
        assert len(page) <= TOOL_RESULT_CHARS
        found = PAGE.match(page)
        assert found is not None, page[-300:]
        start, end = int(found["start"].replace(",", "")), int(found["end"].replace(",", ""))
        assert start <= offset < end, (offset, start, end, [p[:2] for p in pages])
        pages.append((start, end, found["text"]))
        offset = end
    return pages


def assert_every_character_shown(output: str, offset: int, pages) -> None:
    """Pages from `offset` to the end, none skipping any text, each the log's own text (under
    the reading turn's numbers)."""
    shown_to = offset
    for start, end, page_text in pages:
        assert start <= shown_to  # no gap
        assert ANY_NUMBER.sub("", page_text) == ANY_NUMBER.sub("", output[start:end])
        shown_to = end
    assert shown_to == len(output)


async def test_paging_a_log_numbered_higher_than_the_reading_turn_ends(memory, tenant):
    """A log whose passages an earlier turn numbered from 12: the first fits a page under this
    turn's [6] but not under its [12]; the second is over two pages long. Read from its start
    and from the cut, by a turn whose numbers are shorter and by one whose numbers are longer,
    every page gets past where it was asked from (it used to go back to the first passage's
    header, end before the same place and name it again, forever) and all is shown."""
    # "\n\n[12] [arXiv:…] Paging Memory (2024) — chunk 0\nLink: \n": the first one's header
    head = 2 + len(KnowledgeBase.segment([passage_of(0, 0)], [12]).items[0])
    logged = [passage_of(0, ROOM + 1 - head), passage_of(1, ROOM * 5 // 2), passage_of(2, 500)]
    output = shown_passages(logged, context_sources(11))
    (first_number, first_end), *_ = passage_ends(output)
    first_start = output.index("\n\n[12] [arXiv:")
    assert first_number == 12 and first_end - first_start == ROOM + 1  # one over, raw
    assert len(output) > TOOL_RESULT_CHARS
    scope = Scope(tenant, "t-paging")
    await write_log(memory, scope, output)

    for shown_before in (5, 120):  # this turn numbers the first [6], or [121]
        for offset in (0, TOOL_RESULT_CHARS):
            sources = context_sources(shown_before)
            pages = await read_pages(memory, scope, sources, offset, output)
            assert len(pages) <= 2 + len(output) // (ROOM // 2), [p[:2] for p in pages]
            assert_every_character_shown(output, offset, pages)


async def test_a_passage_whole_only_unnumbered_is_numbered_and_read_on_whole(memory, tenant):
    """Two passages, then one whose end falls around the cut, then one more: whatever its
    length, every passage the model is shown whole is numbered and registered (one whose text
    ended within a number's width past the cut, numbered, used to go unnumbered: its number
    gone, it was whole, and reading on from the cut started after it). One numbered but cut
    loses no more than its number's width, and reading on shows it whole under that number."""
    boundary = None
    for length in range(600, 1400):
        logged = [passage_of(0, 900), passage_of(1, 900), passage_of(2, length), passage_of(3, 500)]
        sources = SourceRegistry()
        output = shown_passages(logged, sources)
        numbered = []
        for chunk, (number_, end) in enumerate(passage_ends(output)):
            if end <= TOOL_RESULT_CHARS:  # shown whole
                assert number_ is not None, (length, chunk)
            if number_ is not None:
                assert end <= TOOL_RESULT_CHARS + len(f"[{number_}] "), (length, chunk)
                assert sources.get(number_) == logged[chunk]
                numbered.append(number_)
                if end > TOOL_RESULT_CHARS:
                    boundary = boundary or (length, logged, output, sources, number_)
        assert numbered == list(range(1, len(numbered) + 1)) and len(sources) == len(numbered)
    assert boundary is not None  # some length put a passage's end within its number's width

    length, logged, output, sources, cut_number = boundary
    scope = Scope(tenant, "t-boundary")
    await write_log(memory, scope, output)
    pages = await read_pages(memory, scope, sources, TOOL_RESULT_CHARS, output)
    assert_every_character_shown(output, TOOL_RESULT_CHARS, pages)
    cut = logged[cut_number - 1]
    whole = f"[{cut_number}] [arXiv:{PAGING}] Paging Memory (2024) — chunk {cut.chunk_index}\n"
    assert pages[0][2].startswith(f"\n\n{whole}Link: \n{cut.content}\n\n")  # from its header
    assert len(sources) == len(logged) and sources.get(cut_number) == cut
