"""The agent's tools. Each is a decorated function: its signature and docstring are its schema.

Each takes a typed `ToolContext` that the harness fills from the turn (its `Scope` and the
services), never the model, so no tool call can reach another team's, place's or thread's memory.
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from bot.citations import SourceRegistry
from bot.consolidation import Consolidator
from bot.toolbox import Toolbox
from memory.embeddings import EmbeddingError
from memory.errors import in_passing, memory_unavailable
from memory.ingest.arxiv_source import ArxivSource
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import arxiv_id_of, fetch_and_save
from memory.manager import MemoryManager
from memory.scope import PUBLIC, Scope, legacy_audience
from memory.shorten import shortened
from memory.stores.base import Segment
from memory.stores.knowledge_base import KnowledgeBase, Passage, base_arxiv_id, is_from_arxiv
from memory.stores.tool_log import paper_shown

log = logging.getLogger(__name__)

PAPER_TOOLS = ("arxiv_search_candidates", "fetch_and_save_paper_to_kb")  # they show papers by id
_TOOL_SHOWN_ID = re.compile(r"arXiv:(\d{4}\.\d{4,5})")  # how those tools show a paper's id
# Where a passage (`KnowledgeBase.segment`'s, as citations.py `_PASSAGE` reads it) opens.
_PASSAGE_START = re.compile(r"\n\n(?=(?:\[\d+\] )?\[(?:arXiv|PDF):)")
_NUMBERED = re.compile(r"\A\[\d+\] ")  # a passage's number, before its header
MEMORY_TOOLS = ("summarize_and_store", "expand_summary", "read_tool_log", "search_conversations")
TOOL_RESULT_CHARS = 3000  # of a tool's output the model is handed; the rest, read from its log
LOG_INPUT_CHARS = 200  # of a logged call's input a page of its log repeats
LOG_NOTE_CHARS = 200  # room on a page for its header's range and its note

# What a chat shows while a tool runs (every adapter uses these words).
TOOL_ACTIVITY = {
    "arxiv_search_candidates": "searching arXiv",
    "fetch_and_save_paper_to_kb": "saving the paper to the knowledge base",
    "search_knowledge_base": "searching the knowledge base",
    "summarize_and_store": "summarizing the thread",
    "expand_summary": "expanding a summary",
    "read_tool_log": "reading a tool log",
    "search_conversations": "searching past conversations",
}


@dataclass(frozen=True)
class ToolContext:
    """What a tool call works with: the place it runs in, and the agent's services."""

    scope: Scope
    memory: MemoryManager
    arxiv: ArxivSource
    consolidator: Consolidator
    encoding: Any
    sources: SourceRegistry = field(default_factory=SourceRegistry)  # the turn's, numbered
    # the audiences of the memory the call showed: its tool log is stored for the narrowest
    # (memory/stores/tool_log.py `log_audience`)
    shown_audiences: set[str] = field(default_factory=set)
    # the ids of the stored messages, summaries and tool logs the call showed, and the papers
    # whose passages it showed (`paper_shown`): forgetting one deletes its tool log
    # (memory/stores/tool_log.py `forget_showing`)
    shown_messages: set[str] = field(default_factory=set)


toolbox: Toolbox[ToolContext] = Toolbox(ToolContext)


@toolbox.register_tool
async def arxiv_search_candidates(ctx: ToolContext, query: str, max_results: int = 5) -> str:
    """Search arXiv for papers matching a query (title words, topic, or author) and list
    candidates with arXiv id, title, authors, date, abstract, and whether the team's
    knowledge base already holds each one.

    Args:
        query: what to search for, e.g. "MemGPT" or "retrieval augmented generation".
        max_results: how many candidates to return (1 to 20).
    """
    max_results = max(1, min(int(max_results), 20))
    candidates = await ctx.arxiv.search_candidates(query, max_results)
    if not candidates:
        return f"No arXiv papers found for {query!r}."
    lines = []
    for i, c in enumerate(candidates, 1):
        saved = await ctx.memory.knowledge_base.has_paper(ctx.scope, c.arxiv_id)
        ctx.sources.show_paper(c.arxiv_id)  # the answer may cite it as [arXiv:id]
        authors = ", ".join(c.authors[:4]) + (" et al." if len(c.authors) > 4 else "")
        lines.append(
            f"{i}. arXiv:{c.arxiv_id} — {c.title} ({c.published[:10]}; {authors})\n"
            f"   Link: {c.url}{'  [already in the knowledge base]' if saved else ''}\n"
            f"   Abstract: {c.summary[:600]}"
        )
    return "\n".join(lines)


class SaveFailed(RuntimeError):
    """A paper could not be saved (a service failed, or a bug); the message names only which kind
    (the toolbox puts it in the tool's result, its log and so before the model, which may repeat
    it: a provider's text, a masked key or an internal address, must not be in it)."""


def save_failed(arxiv_id: str, exc: BaseException) -> str:
    """Why a paper could not be saved, in words fit for a channel: "try again in a minute" only
    for a failure that may pass (the memory away, the embedding service unreachable, throttled
    or erring itself, the PDF reader's process not started for want of resources); one that
    will not (a refused key, the wrong dimensions, a bug) says whose it is to fix."""
    if memory_unavailable(exc):
        service = "the memory store is unreachable"
    elif isinstance(exc, EmbeddingError):
        service = "the embedding service failed"
    else:
        service = "the PDF reader could not run"
    if may_pass(exc):
        return f"could not save arXiv:{arxiv_id} right now ({service}); try again in a minute"
    if isinstance(exc, EmbeddingError):
        return (
            f"could not save arXiv:{arxiv_id}: the embedding service refused it; the operator "
            "must fix its setup"
        )
    return f"could not save arXiv:{arxiv_id}: something went wrong on my side"


def may_pass(exc: BaseException) -> bool:
    """A save's failure that may pass by itself (`in_passing`), or the memory away."""
    return memory_unavailable(exc) or in_passing(exc)


@toolbox.register_tool
async def fetch_and_save_paper_to_kb(ctx: ToolContext, arxiv_id: str) -> str:
    """Download an arXiv paper's PDF and save its full text, chunked and embedded, to the
    team's knowledge base, so later questions are answered from it. The text itself is not
    returned; search the knowledge base for passages.

    Args:
        arxiv_id: the paper's arXiv id, e.g. "2310.08560" (or "arXiv:2310.08560", its link).
    """
    memory, arxiv_id = ctx.memory, written_paper_id(arxiv_id)
    try:
        paper, chunks, already = await fetch_and_save(
            arxiv_id, ctx.scope, memory.knowledge_base, memory.embedder, ctx.encoding, ctx.arxiv
        )
    except IngestError:
        raise  # the paper's own problem, in words for the person
    except Exception as exc:  # a service failed: its provider's text stays in the operator's log
        if may_pass(exc) or isinstance(exc, EmbeddingError):
            log.warning("the tool could not save %s: %r", arxiv_id, exc)
        else:  # not a service's: a bug, its traceback for the operator
            log.warning("the tool could not save %s: %r", arxiv_id, exc, exc_info=exc)
        raise SaveFailed(save_failed(arxiv_id, exc)) from None
    ctx.sources.show_paper(paper.arxiv_id)
    state = "was already in" if already else f"is now saved ({chunks} passages) to"
    return f"[arXiv:{paper.arxiv_id}] {paper.title} {state} the knowledge base. Link: {paper.link}"


@toolbox.register_tool
async def search_knowledge_base(
    ctx: ToolContext,
    query: str,
    k: int = 5,
    arxiv_id: str | None = None,
    author: str | None = None,
    year: int | None = None,
    category: str | None = None,
) -> str:
    """Search the team's knowledge base of saved papers (hybrid keyword and semantic search)
    for passages, optionally only in one paper, by one author, year or arXiv category.

    Args:
        query: what the passages should be about.
        k: how many passages to return (1 to 10).
        arxiv_id: only passages of this paper, e.g. "2310.08560".
        author: only papers with this exact author name.
        year: only papers published in this year.
        category: only papers in this arXiv category, e.g. "cs.CL".
    """
    memory = ctx.memory
    paper = stored_paper_id(arxiv_id) if arxiv_id else None
    vector = (await memory.embedder.embed([query]))[0]
    passages = await memory.knowledge_base.search(
        ctx.scope, query, vector, k=max(1, min(int(k), 10)),
        arxiv_id=paper, author=author, year=year, category=category,
    )  # fmt: skip
    if not passages and paper and not await memory.knowledge_base.has_paper(ctx.scope, paper):
        return (
            f"Paper {paper} is not in the knowledge base: save it with "
            "fetch_and_save_paper_to_kb first, or search without arxiv_id."
        )
    if not passages:
        return "No matching passages in the knowledge base."
    ctx.shown_audiences.update(  # a paper from arXiv is anyone's to read, walled or not
        p.audience for p in passages if p.audience != PUBLIC or not is_from_arxiv(p.arxiv_id)
    )
    # forgetting one of the papers takes this log too: its passages must leave with it
    ctx.shown_messages.update(paper_shown(p.arxiv_id) for p in passages)
    return shown_passages(passages, ctx.sources)


def shown_passages(passages: list[Passage], sources: SourceRegistry) -> str:
    """A search's passages as its result. The harness hands the model only its first
    `TOOL_RESULT_CHARS` (the whole goes to the tool log): the passages whole within them are
    numbered and registered for citing. The rest go unnumbered: a passage the model did not read
    must list no source, and a number it saw on a cut one could later mean another passage.
    `read_tool_log` numbers and registers them as its pages show them. Sized on a copy of
    `sources`, as `_page_end` is.

    Whole is judged on the result as it is handed over, its cut passages unnumbered, and so
    shorter: a passage cut with its number can be whole without it. That one is numbered all
    the same, its last characters (no more than its number's width) past the cut: unnumbered,
    it would be read whole and never be citable, as reading on starts after it. Reading on
    from the cut shows it whole from its header, under that number (or, one longer than a
    page, the rest of it)."""
    numbers = copy.deepcopy(sources).numbers(passages)
    items = KnowledgeBase.segment(passages, numbers).items

    def rendered(numbered: int) -> Segment:
        segment = KnowledgeBase.segment(passages[:numbered], numbers[:numbered])
        segment.items += [_NUMBERED.sub("", item, count=1) for item in items[numbered:]]
        return segment

    numbered = _whole_items(rendered(_whole_items(rendered(len(passages)))))
    sources.numbers(passages[:numbered])  # registered: under the numbers the copy gave them
    return rendered(numbered).render()


def _whole_items(segment: Segment) -> int:
    """How many of `segment`'s items, from the first, end within `TOOL_RESULT_CHARS` of it."""
    end = len(segment.render()) - len("\n\n".join(segment.items)) - 2  # before the first "\n\n"
    whole = 0
    for item in segment.items:
        end += 2 + len(item)
        if end > TOOL_RESULT_CHARS:
            break
        whole += 1
    return whole


@toolbox.register_tool
async def summarize_and_store(ctx: ToolContext, thread_id: str | None = None) -> str:
    """Summarize this thread's conversation so far into summary memory and take the
    summarized messages out of the conversation context (they stay expandable by id).

    Args:
        thread_id: not needed: the tool always summarizes the current thread.
    """
    return await ctx.consolidator.summarize_and_store(ctx.scope, ctx.shown_audiences)


@toolbox.register_tool
async def expand_summary(ctx: ToolContext, summary_id: str) -> str:
    """Bring back a summary and the original messages it covers, in order, when a detail
    is only in Summary Memory.

    Args:
        summary_id: the id shown as [Summary ID: ...] in Summary Memory.
    """
    summary = await ctx.memory.summaries.get(ctx.scope, summary_id)
    expanded = await ctx.consolidator.expand_summary(ctx.scope, summary_id, ctx.shown_audiences)
    ctx.shown_messages.update(summary.message_ids)  # what its text and detail were written from
    ctx.shown_messages.add(summary.id)  # its text: forgetting the summary takes this log too
    return expanded


@toolbox.register_tool
async def read_tool_log(ctx: ToolContext, log_id: str, offset: int = 0) -> str:
    """Read the full output of an earlier tool call whose result was truncated, a page at a
    time: each page ends naming the call that reads the next one.

    Args:
        log_id: the id named in "[Truncated. Full output saved in tool log as <log_id>. ...]".
        offset: character offset to start reading from, as the truncation note names it.
    """
    entry = await ctx.memory.tool_logs.get(ctx.scope, log_id)
    ctx.shown_audiences.add(entry.audience or legacy_audience(entry.thread_id))
    ctx.shown_messages.update(entry.message_ids)
    ctx.shown_messages.add(entry.id)  # its output: forgetting that log takes this one too
    output = entry.output
    called = str(entry.tool_input)
    called = shortened(called, LOG_INPUT_CHARS + 1)  # its first LOG_INPUT_CHARS, then "…"
    head = f"Tool log {entry.id}: {entry.tool_name}({called}) -> {entry.status}"
    room = TOOL_RESULT_CHARS - len(head) - LOG_NOTE_CHARS
    start = _page_start(output, min(max(0, int(offset)), len(output)), room, ctx.sources)
    end = _page_end(output, start, room, ctx.sources)
    text = ctx.sources.renumber(output[start:end])  # this turn's numbers, whole passages
    if entry.tool_name in PAPER_TOOLS and entry.status == "success":
        for shown_id in _TOOL_SHOWN_ID.findall(text):
            ctx.sources.show_paper(shown_id)
    if start == 0 and end == len(output):
        return f"{head}\n{text}"
    more = f"\n\n[{read_on(entry.id, end)}]" if end < len(output) else "\n\n[End of the log]"
    return f"{head} (characters {start:,} to {end:,} of {len(output):,})\n{text}{more}"


def _page_start(output: str, asked: int, room: int, sources: SourceRegistry) -> int:
    """Where the page asked from `asked` starts: inside a passage (the harness cuts a result at
    `TOOL_RESULT_CHARS`, wherever that falls), at the passage's header, so it is shown,
    renumbered and registered whole; a passage longer than a page is read on where asked."""
    opening = max((m.start() for m in _PASSAGE_START.finditer(output) if m.start() < asked),
                  default=None)  # fmt: skip
    if opening is None or asked >= len(output) or _PASSAGE_START.match(output, asked):
        return asked
    following = _PASSAGE_START.search(output, asked)
    end = following.start() if following else len(output)
    # Only when the page from the header shows the passage whole: one that fits a page under
    # this turn's numbers but not under the log's would else end it before `asked`, each
    # "read on" pointing back inside it, the same page forever. So each page gets past `asked`.
    return opening if _page_end(output, opening, room, sources) >= end else asked


def _page_end(output: str, start: int, room: int, sources: SourceRegistry) -> int:
    """Where the page of `output` from `start` ends: it fits one tool result (the harness would
    cut a longer one) under this turn's passage numbers, which may lengthen it. It ends before
    a passage's header, so each passage it shows is renumbered and registered whole (but one
    longer than a page); else at a line's end in the page's second half, else anywhere.
    Sized on a copy of `sources`: nothing is registered here."""
    limit = start + room
    while True:
        if limit >= len(output):
            end = len(output)
        else:
            end = _last_break(output, start, max(limit, start + 1))
        if len(copy.deepcopy(sources).renumber(output[start:end])) <= room or end == start + 1:
            return end
        limit = end - 1  # renumbering lengthened it: end at an earlier break


def _last_break(output: str, start: int, limit: int) -> int:
    """The last place in output[start + 1 : limit + 1] a page may end: before the "\n\n" that
    opens a passage (any after the page's start), else after a newline in the page's second
    half, else `limit`. Only a passage longer than the page has no header in reach: ending at
    a newline in its header would leave its text headless to the next page; it is cut inside
    its text instead."""
    passages = [
        m.start() for m in _PASSAGE_START.finditer(output, start + 1, limit + 32)
        if m.start() <= limit
    ]  # fmt: skip
    if passages:
        return passages[-1]
    floor = start + max(1, (limit - start) // 2)
    line = output.rfind("\n", floor, limit)
    return line + 1 if line != -1 else limit


def read_on(log_id: str, offset: int) -> str:
    """The note naming the call that reads a tool log on from `offset`."""
    return f'Read on with read_tool_log("{log_id}", offset={offset})'


@toolbox.register_tool
async def search_conversations(
    ctx: ToolContext,
    query: str = "",
    where: Literal["thread", "team"] = "team",
    author: str | None = None,
    since: str | None = None,
    until: str | None = None,
    k: int = 10,
) -> str:
    """Search what was said before, in this thread or in every conversation of the team you
    may see, when Episodic Memory does not show enough: decisions, who said what, when.

    Args:
        query: what the messages should be about; "" for the latest messages that match the
            other filters (e.g. everything a person said in a week).
        where: "thread" for this thread only, "team" for every conversation visible here.
        author: only messages by this person (their name or user id; "assistant" for yours).
        since: only messages on or after this day, YYYY-MM-DD (a UTC day).
        until: only messages on or before this day, YYYY-MM-DD (a UTC day).
        k: how many messages to return (1 to 30).
    """
    memory = ctx.memory
    start, end = _day(since), _day(until, end=True)
    if start is not None and end is not None and start > end:
        raise ValueError(f"since ({since}) is after until ({until}): no day is in between")
    found = {
        "k": max(1, min(int(k), 30)), "author": author, "since": start, "until": end,
        "thread": ctx.scope.thread if where == "thread" else None,
    }  # fmt: skip
    if query.strip():
        vector = (await memory.embedder.embed([query]))[0]
        episodes = await memory.episodes.search(ctx.scope, query, vector, **found)
    else:  # nothing to embed (an embedder refuses ""): the latest that match
        episodes = await memory.episodes.latest(ctx.scope, **found)
    if not episodes:
        return "No matching messages."
    ctx.shown_audiences.update(e.audience for e in episodes)
    ctx.shown_messages.update(e.id for e in episodes)
    return memory.episodes.render(episodes)


_SHOWN_LABEL = re.compile(r"^\[\s*(.*?)\s*\]$|^(?:arxiv|pdf)\s*:\s*(.*)$", re.IGNORECASE)


def written_paper_id(written: str) -> str:
    """The paper id the model means, however it writes it: as the tools show it
    ("arXiv:2310.08560", a shared PDF's "[PDF:pdf-0123…]", brackets or not), or as its abs or
    pdf link; a version kept ("2310.08560v2")."""
    bare = written.strip()
    while shown := _SHOWN_LABEL.match(bare):  # "[…]", then "arXiv:…" or "PDF:…"
        bare = (shown.group(1) if shown.group(1) is not None else shown.group(2)).strip()
    return arxiv_id_of(bare) or bare


def stored_paper_id(written: str) -> str:
    """The id a paper is stored under, however the model writes it (`written_paper_id`),
    without its version."""
    return base_arxiv_id(written_paper_id(written)) or written  # "v2": no id, the filter says


def _day(value: str | None, end: bool = False) -> float | None:
    """A YYYY-MM-DD date as a timestamp (its start, or its end), UTC."""
    if not value:
        return None
    try:
        start = datetime.strptime(value.strip()[:10], "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"dates are YYYY-MM-DD, got {value!r}") from None
    return start.timestamp() + (86_399.999 if end else 0.0)
