"""A tool result cut short is read back whole: the note names the exact `read_tool_log` call
that reads on, each page of the log names the next (in the original log, never a new one),
and `read_tool_log` is offered in a thread's first turn, before any log exists. A page of a
knowledge-base search ends between passages, so each one it shows is under this turn's number
and registered whole (for citing), however its naive end falls; a passage longer than a page,
with no line break in its text, is cut inside its text (not after its header, which left a
page of a header alone and the text headless on the next)."""

from __future__ import annotations

import re

import pytest

from bot.citations import SourceRegistry
from bot.tools import LOG_NOTE_CHARS, TOOL_RESULT_CHARS, ToolContext, read_tool_log
from memory.scope import Scope
from memory.stores.knowledge_base import KnowledgeBase, Passage
from memory.stores.tool_log import ToolLogEntry
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, text, tool_calls

READ_ON = re.compile(r'read_tool_log\("(?P<log>log_\w+)", offset=(?P<offset>\d+)\)\]\Z')
PAGE = re.compile(
    r"\ATool log (?P<log>log_\w+): [^\n]*\(characters (?P<start>[\d,]+) to (?P<end>[\d,]+) "
    r"of (?P<total>[\d,]+)\)\n(?P<text>.*)\n\n\[(?:Read on with [^\n]*|End of the log)\]\Z",
    re.DOTALL,
)


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def tool_results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def number(written: str) -> int:
    return int(written.replace(",", ""))


async def test_a_long_tool_output_is_read_back_whole_page_by_page(world, tenant):
    """The model does what each note says, and nothing else, until no note is left."""

    def model(body: dict):
        routed = world.route(body)  # the harness's own calls (entities, summaries)
        if routed is not None:
            return routed
        results = tool_results(body)
        if not results:  # the recorded "testing" search: 20 candidates, far over the limit
            return tool_calls(
                call("arxiv_search_candidates", {"query": "testing", "max_results": 20})
            )
        note = READ_ON.search(results[-1])
        if note is None:
            return text("That is all of it.")
        read = {"log_id": note["log"], "offset": int(note["offset"])}
        return tool_calls(call("read_tool_log", read))

    world.model.router = model
    scope = Scope(tenant, "t-first")
    # a question whose most similar tools leave read_tool_log out
    result = await world.agent.run_turn(scope, "Remind me of the testing papers we discussed")

    assert "read_tool_log" in result.tools_offered  # the thread's first turn: no log yet
    assert result.stop_reason == "final" and result.answer == "That is all of it."
    search, *reads = result.steps
    assert search.name == "arxiv_search_candidates" and len(reads) >= 3
    assert all(s.name == "read_tool_log" and s.status == "success" for s in reads)
    full = (await world.runtime.memory.tool_logs.get(scope, search.log_id)).output

    first, *pages = tool_results(world.model_requests()[-1])
    assert first.startswith(full[:TOOL_RESULT_CHARS])
    assert first.endswith(
        f"[Truncated. Full output saved in tool log as {search.log_id}. "
        f'Read on with read_tool_log("{search.log_id}", offset={TOOL_RESULT_CHARS})]'
    )
    read_back, offset = full[:TOOL_RESULT_CHARS], TOOL_RESULT_CHARS
    for page in pages:
        assert len(page) <= TOOL_RESULT_CHARS and "[Truncated." not in page  # never cut again
        shown = PAGE.match(page)
        assert shown is not None, page[-300:]
        assert shown["log"] == search.log_id  # the original log, never a copy
        assert number(shown["start"]) == offset and number(shown["total"]) == len(full)
        read_back += shown["text"]
        offset = number(shown["end"])
        assert offset == len(read_back)
    assert read_back == full  # every character, once, in order
    assert pages[-1].endswith("[End of the log]")


async def test_a_short_log_is_read_whole_as_before(world, tenant):
    """A log that fits one result is shown as it was: whole, with no range and no note."""
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT", "max_results": 1})),
        text("Found it."),
    )
    scope = Scope(tenant, "t-short")
    first = await world.agent.run_turn(scope, "Find MemGPT")
    (search,) = first.steps
    full = (await world.runtime.memory.tool_logs.get(scope, search.log_id)).output
    assert len(full) < TOOL_RESULT_CHARS
    world.model.script(tool_calls(call("read_tool_log", {"log_id": search.log_id})), text("ok"))
    await world.agent.run_turn(scope, "Show me that search again")
    (read,) = tool_results(world.model_requests()[-1])
    assert read.startswith(f"Tool log {search.log_id}: arxiv_search_candidates(")
    assert read.endswith(f") -> success\n{full}")


LOG_ID = "log_0123456789ab"
HEAD = f"Tool log {LOG_ID}: search_knowledge_base({{'query': 'paging'}}) -> success"
HEADER = re.compile(
    r"^\[(?P<n>\d+)\] \[arXiv:(?P<id>[^\]]+)\] [^\n]* — chunk (?P<chunk>\d+)$", re.M
)


def passage(i: int, content: str) -> Passage:
    return Passage(f"2401.{i:05d}", f"Paper {i}", "3 Method", 2, content, "", 2024, 0.5)


def kb_log(room: int) -> tuple[list[Passage], str]:
    """Eight passages as an earlier turn's search showed them (numbered 1 to 8), the third's
    header straddling `room`, where a page cut at any character would end."""
    words = "Paging moves memory between a main context and an archival store. "

    def rendered(pad: int) -> tuple[list[Passage], str]:
        shown = [passage(i, (words * 60)[: 500 + pad * (i == 0) + 37 * i]) for i in range(8)]
        return shown, KnowledgeBase.segment(shown).render()

    shown, output = rendered(0)
    third = output.index("[3] [arXiv:")
    shown, output = rendered(room - 15 - third)
    assert output.index("[3] [arXiv:") == room - 15  # the naive end: "[3] [arXiv:2401|.00002]"
    return shown, output


async def test_a_knowledge_base_log_is_paged_between_passages(memory, tenant):
    room = TOOL_RESULT_CHARS - len(HEAD) - LOG_NOTE_CHARS
    logged, output = kb_log(room)
    scope = Scope(tenant, "t-kb")
    entry = ToolLogEntry(scope.thread, "search_knowledge_base", {"query": "paging"}, output,
                         "success", id=LOG_ID)  # fmt: skip
    await memory.tool_logs.write(scope, entry)
    # this turn showed nine passages already: the log's become 10 to 17, a digit longer each
    sources = SourceRegistry([passage(100 + i, f"other {i}") for i in range(9)])
    ctx = ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None,  # type: ignore[arg-type]
                      sources=sources)  # fmt: skip

    offset, shown_ids, pages = 0, [], 0
    while True:
        page = await read_tool_log(ctx, LOG_ID, offset)
        pages += 1
        assert page.startswith(HEAD) and len(page) <= TOOL_RESULT_CHARS
        found = PAGE.match(page)
        assert found is not None, page[-300:]
        headers = list(HEADER.finditer(found["text"]))
        assert found["text"].count("[arXiv:") == len(headers)  # no header cut short
        for header in headers:  # each under the number this turn registered it by
            registered = sources.get(int(header["n"]))
            assert registered is not None and registered.arxiv_id == header["id"], header[0]
            shown_ids.append(header["id"])
        offset = number(found["end"])
        assert offset == len(output) or output[offset:].startswith("\n\n[")  # between passages
        note = READ_ON.search(page)
        if note is None:
            break
        assert note["log"] == LOG_ID and number(note["offset"]) == offset
    assert pages >= 2 and offset == len(output)
    assert shown_ids == [p.arxiv_id for p in logged]  # each once, in order
    assert len(sources) == 9 + len(logged)  # none registered that no page showed
    for number_, original in enumerate(logged, start=10):
        assert sources.get(number_).content == original.content  # whole, for citing


async def test_a_passage_longer_than_a_page_is_cut_inside_its_text(memory, tenant):
    room = TOOL_RESULT_CHARS - len(HEAD) - LOG_NOTE_CHARS
    words = "Paging moves memory between a main context and an archival store. "
    logged = [passage(0, words * 3), passage(1, (words * 80)[: room * 3 // 2]), passage(2, words)]
    output = KnowledgeBase.segment(logged).render()
    assert "\n" not in logged[1].content and len(logged[1].content) > room
    scope = Scope(tenant, "t-long")
    entry = ToolLogEntry(scope.thread, "search_knowledge_base", {"query": "paging"}, output,
                         "success", id=LOG_ID)  # fmt: skip
    await memory.tool_logs.write(scope, entry)
    sources = SourceRegistry()
    ctx = ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None,  # type: ignore[arg-type]
                      sources=sources)  # fmt: skip

    offset, read_back, texts = 0, "", []
    while True:
        page = await read_tool_log(ctx, LOG_ID, offset)
        assert len(page) <= TOOL_RESULT_CHARS
        found = PAGE.match(page)
        assert found is not None, page[-300:]
        texts.append(found["text"])
        read_back += found["text"]
        offset = number(found["end"])
        if READ_ON.search(page) is None:
            break
    assert read_back == output  # every character, once, in order
    assert texts[0] == output[: output.index("\n\n[2] [arXiv:")]  # before the long one's header
    sizes = [len(t) for t in texts]
    assert all(size >= room // 2 for size in sizes[1:-1]), sizes  # not cut after its header
    long_one = sources.get(2)  # its header and the start of its text, on one page
    assert long_one is not None and long_one.arxiv_id == logged[1].arxiv_id
    assert long_one.content and logged[1].content.startswith(long_one.content.strip())


async def test_a_passage_running_past_the_page_starts_the_next_page(memory, tenant):
    """A passage whose header is in the page's first half and whose text runs past its room
    (a 900-character passage, then a 2,200-character one): the page ends before that header,
    not inside its text, so the next page shows it whole, renumbered and registered."""
    room = TOOL_RESULT_CHARS - len(HEAD) - LOG_NOTE_CHARS
    words = "Paging moves memory between a main context and an archival store. "
    logged = [passage(0, (words * 20)[:900]), passage(1, (words * 40)[:2200]), passage(2, words)]
    output = KnowledgeBase.segment(logged).render()
    second = output.index("\n\n[2] [arXiv:")
    assert second < room // 2 and second + len(logged[1].content) > room  # runs past the page
    scope = Scope(tenant, "t-past")
    entry = ToolLogEntry(scope.thread, "search_knowledge_base", {"query": "paging"}, output,
                         "success", id=LOG_ID)  # fmt: skip
    await memory.tool_logs.write(scope, entry)
    sources = SourceRegistry()
    ctx = ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None,  # type: ignore[arg-type]
                      sources=sources)  # fmt: skip

    offset, ends, texts = 0, [], []
    while True:
        page = await read_tool_log(ctx, LOG_ID, offset)
        assert len(page) <= TOOL_RESULT_CHARS
        found = PAGE.match(page)
        assert found is not None, page[-300:]
        texts.append(found["text"])
        offset = number(found["end"])
        ends.append(offset)
        if READ_ON.search(page) is None:
            break
    assert ends[0] == second  # before the long passage's header, not at the room's end
    assert texts[1].startswith("\n\n[2] [arXiv:")  # the next page opens with its header
    assert "".join(texts) == output
    assert len(sources) == len(logged)
    for number_, original in enumerate(logged, start=1):
        assert sources.get(number_).arxiv_id == original.arxiv_id
        assert sources.get(number_).content == original.content  # whole, for citing
