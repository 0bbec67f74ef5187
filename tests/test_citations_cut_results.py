"""A search result the harness cuts short numbers, and so lets the answer cite, only the passages
the model was shown whole: one cut at the limit, and those after it, are unnumbered and get
their numbers when `read_tool_log` shows them, the cut one whole from its header. And the
Sources list tells two chunks of one paper apart when their section and page do not."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bot.citations import SourceRegistry, cite
from bot.tools import TOOL_RESULT_CHARS, shown_passages
from memory.scope import Scope
from memory.stores.knowledge_base import Chunk, Paper, Passage
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
