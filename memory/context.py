"""Context assembly: one call turns (scope, question) into the memory segments.

The question is embedded once and that vector serves every vector read; the reads run
concurrently (episodic recall's searches too; only its pick waits for the budget the others
leave); each segment comes back with its exact token count in the model's encoding. The
conversation-derived segments share one budget (`ContextLimits.memory_tokens`): the summaries
and the recent window first, then Episodic Memory, the past messages most relevant to the
question that the window does not show, fills what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.base import Segment
from memory.stores.conversation import ConversationStore, message_tokens
from memory.stores.entity import EntityStore
from memory.stores.episodic import Episode, EpisodicStore
from memory.stores.knowledge_base import KnowledgeBase, Passage
from memory.stores.summary import SummaryStore
from memory.stores.workflow import WorkflowStore
from memory.tokens import count_tokens, count_tokens_many, encoding_for

CONVERSATION_DERIVED = ("Conversation", "Episodic", "Summary")
# A summary's description in the Summary segment at most (a model's run to 12 words, the
# deterministic notes' to 24): a runaway one is cut rather than hide every summary.
SUMMARY_DESCRIPTION_TOKENS = 40


@dataclass
class ContextSegment:
    name: str
    text: str
    tokens: int


@dataclass
class AssembledContext:
    question: str
    segments: list[ContextSegment]
    vector: np.ndarray
    passages: list[Passage] = field(default_factory=list)
    summaries: list[tuple[str, str]] = field(default_factory=list)
    recent_messages: int = 0
    episodes: list[Episode] = field(default_factory=list)

    window_messages: int = 0  # unsummarized messages of the thread, shown or not
    window_tokens: int = 0  # the shown messages' tokens (no heading, no note), as ensure_window's
    workflow_ids: list[str] = field(default_factory=list)
    entity_names: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)  # the recent window's, as shown

    def memory_ids(self) -> dict[str, list[str]]:
        """What the context used, by memory: passages (`<arxiv id>#<chunk>`), episodic and
        recent messages, summaries, workflows, entities (a turn's record keeps them)."""
        return {
            "passages": [f"{p.arxiv_id}#{p.chunk_index}" for p in self.passages],
            "episodes": [e.id for e in self.episodes],
            "messages": list(self.message_ids),
            "summaries": [summary_id for summary_id, _ in self.summaries],
            "workflows": list(self.workflow_ids),
            "entities": list(self.entity_names),
        }

    def segment(self, name: str) -> ContextSegment:
        return next(s for s in self.segments if s.name == name)

    def window_overflows(self, cap: int) -> bool:
        """True when the recent window is larger than `cap` tokens or could not all be shown."""
        return self.recent_messages < self.window_messages or self.window_tokens > cap

    @property
    def memory_tokens(self) -> int:
        """Tokens of the conversation-derived segments (what ARXIVSCOUT_MEMORY_TOKENS caps)."""
        return sum(s.tokens for s in self.segments if s.name in CONVERSATION_DERIVED)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    def memory_text(self) -> str:
        return "\n\n".join(s.text for s in self.segments)

    def render(self) -> str:
        """The user message the model sees: the question first, never summarized, then memory."""
        return f"# Question\n{self.question}\n\n{self.memory_text()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "total_tokens": self.total_tokens,
            "segments": [
                {"name": s.name, "tokens": s.tokens, "text": s.text} for s in self.segments
            ],
        }


DEFAULT_MEMORY_TOKENS = 6000
# The least `memory_tokens` may be: fewer leave the rolling summaries no window, and the context
# outgrows its budget (ARXIVSCOUT_MEMORY_TOKENS, `eval locomo --budget`).
MIN_MEMORY_TOKENS = 200


@dataclass
class ContextLimits:
    """How much of each memory a turn's context may hold.

    `memory_tokens` caps the conversation-derived segments together (Conversation, Episodic,
    Summary): the Summary segment gets at most `summary_share` of it, the recent window (every
    unsummarized message: rolling summaries keep it near `window_share`, and the harness compacts
    beyond twice that) what it needs, and Episodic Memory the rest.

    The Summary segment is an index of what can be expanded (a line per top-level summary, at
    most 8; a model's descriptions run to 12 words, the deterministic notes to 16 or 24): 5 %
    of the default budget shows the newest 6 to 8, and at a tight budget fewer (or a note that
    they exist: `summary_index`), leaving the tokens to the recalled messages themselves, which on
    LoCoMo answer more per token (0.885 -> 0.896 recall at 2,000 tokens, from 15 % to 5 %).
    """

    memory_tokens: int = DEFAULT_MEMORY_TOKENS
    kb_passages: int = 5
    workflows: int = 3
    entities: int = 5
    summary_share: float = 0.05
    window_share: float = 0.25

    @property
    def window_target(self) -> int:
        """Unsummarized tokens beyond which the background rolls a summary."""
        return int(self.memory_tokens * self.window_share)

    @property
    def window_cap(self) -> int:
        """Unsummarized tokens beyond which the turn compacts before it is answered."""
        return 2 * self.window_target


def newest_that_fit(
    segment: Segment, budget: int, model: str, cut_note: Callable[[int], str] | None = None,
    cut_budget: int | None = None,
) -> tuple[str, int, int]:  # fmt: skip
    """The segment rendered with as many of its newest items as fit `budget` tokens: (text,
    its exact tokens, how many items it shows). With `cut_note`, a rendering that leaves items
    out starts with `cut_note(how many)`, so the model knows there were more (and the note's
    tokens are counted in the fit). A rendering that must leave items out fits `cut_budget`
    instead, when smaller (what it leaves goes to other segments), yet shows the newest item
    whenever `budget` allows it."""
    items = segment.items

    def rendered(kept: int) -> str:
        shown = items[len(items) - kept :]
        if cut_note is not None and kept < len(items):
            shown = [cut_note(len(items) - kept), *shown]
        return replace(segment, items=shown).render()

    whole = rendered(len(items))
    whole_tokens = count_tokens(whole, model)
    if whole_tokens <= budget:  # checked first: with the note, one item fewer may not fit
        return whole, whole_tokens, len(items)
    if cut_budget is not None and cut_budget < budget and items:
        budget = min(budget, max(cut_budget, count_tokens(rendered(1), model)))
    low, high = 0, len(items) - 1
    while low < high:  # the most items (newest first) whose rendering fits
        mid = (low + high + 1) // 2
        if count_tokens(rendered(mid), model) <= budget:
            low = mid
        else:
            high = mid - 1
    text = rendered(low)
    return text, count_tokens(text, model), low


def window_cut_note(left_out: int) -> str:
    """What the Conversation segment says in place of the oldest messages it cannot show (a
    summary of them is being written, e.g. by a background roll holding the thread): they are
    not lost, and recall may show the relevant ones. Not stored: it is no message."""
    earlier = f"{left_out} earlier {'message' if left_out == 1 else 'messages'}"
    return (
        f"({earlier} of this thread are not shown here: they are being summarized; "
        "the most relevant may appear under Episodic Memory)"
    )


def cut_to_tokens(text: str, tokens: int, model: str) -> str:
    """`text` shortened to at most `tokens` tokens, marked cut (unchanged when it fits)."""
    if count_tokens(text, model) <= tokens:
        return text
    encoding = encoding_for(model)
    return encoding.decode(encoding.encode(text, disallowed_special=())[: tokens - 2]) + " …"


def summary_index(
    entries: list[tuple[str, str]], limits: ContextLimits, model: str
) -> tuple[str, int]:
    """The Summary segment: the newest lines (each cut to SUMMARY_DESCRIPTION_TOKENS) that fit
    its share of the budget. Summaries that exist but none of which fit are said to exist, in a
    note as short as the empty one: at a small budget the recalled messages answer more per
    token than a summary's line (LoCoMo recall at 1,000 tokens: 0.820 with the newest line
    always shown, 0.835 without)."""
    segment = SummaryStore.segment(
        [(sid, cut_to_tokens(d, SUMMARY_DESCRIPTION_TOKENS, model)) for sid, d in entries]
    )
    if entries:
        count = f"{len(entries)} {'summary' if len(entries) == 1 else 'summaries'}"
        segment.empty_note = f"({count}, too long to list)"
    text, tokens, _ = newest_that_fit(
        segment, int(limits.memory_tokens * limits.summary_share), model
    )
    return text, tokens


def shown_ids(window: list, shown: int) -> list[str]:
    """The ids of the newest `shown` messages of the window that the segment lists."""
    listed = [m.id for m in window if not m.forgotten]
    return listed[len(listed) - shown :]


async def assemble_context(
    memory: MemoryManager,
    scope: Scope,
    question: str,
    limits: ContextLimits | None = None,
    vector: np.ndarray | None = None,
    **kb_filters: Any,
) -> AssembledContext:
    limits = limits or ContextLimits()
    model = memory.model
    if vector is None:
        vector = (await memory.embedder.embed([question]))[0]
    found, window, passages, workflows, entities, summaries = await asyncio.gather(
        memory.episodes.find(scope, question, vector),  # recall's searches need no budget
        memory.conversation.unsummarized(scope),
        memory.knowledge_base.search_naming(
            scope, question, vector, k=limits.kb_passages, **kb_filters
        ),
        memory.workflows.nearest(scope, vector, k=limits.workflows),
        memory.entities.similar(scope, vector, k=limits.entities),
        memory.summaries.descriptions(scope),
    )
    budget = limits.memory_tokens
    conversation = ConversationStore.segment(window)
    heading = count_tokens(replace(conversation, items=[], empty_note="").render(), model)
    window_room = limits.window_cap + heading  # a window up to the cap is shown whole
    episodic_empty = count_tokens(EpisodicStore.render([]), model)
    summary_text, summary_tokens = summary_index(summaries, limits, model)
    # Every unsummarized message is in the window or a summary: ensure_window compacts only
    # past the cap, so the window gets at least the cap whatever the rest leaves. Below about
    # 400 tokens the smallest Summary segment, the window at its cap and the empty Episodic
    # heading may together pass the budget (by < 100 tokens): the invariant wins over it.
    room = max(window_room, budget - summary_tokens - episodic_empty)
    # A window that must be cut (ensure_window could not compact: a summary of the oldest is
    # being written) keeps its cap, and recall the rest, where the messages left out can be found.
    conversation_text, conversation_tokens, shown = newest_that_fit(
        conversation, room, model, cut_note=window_cut_note, cut_budget=window_room
    )
    message_ids = shown_ids(window, shown)
    # Only the messages shown are left out of recall: those the window cannot show (while a
    # summary of them is written) may be recalled, as the note in their place says.
    episodes, episodic_text, episodic_tokens = await memory.episodes.pick_rendered(
        found, budget - summary_tokens - conversation_tokens, model,
        exclude_ids=frozenset(message_ids), empty_tokens=episodic_empty,
    )  # fmt: skip
    others: list[Segment] = [
        KnowledgeBase.segment(passages),
        WorkflowStore.segment([text for _, text in workflows]),
        EntityStore.segment(entities),
    ]
    texts = [s.render() for s in others]
    counts = count_tokens_many(texts, model)
    rendered = [
        ContextSegment("Conversation", conversation_text, conversation_tokens),
        ContextSegment("Episodic", episodic_text, episodic_tokens),
        *(ContextSegment(s.name, t, n) for s, t, n in zip(others, texts, counts, strict=True)),
        ContextSegment("Summary", summary_text, summary_tokens),
    ]
    return AssembledContext(
        question, rendered, vector, passages, summaries, shown, episodes,
        window_messages=len(window),
        window_tokens=sum(message_tokens(window[len(window) - shown :], model)) if shown else 0,
        workflow_ids=[i for i, _ in workflows],
        entity_names=[e.name for e in entities],
        message_ids=message_ids,
    )  # fmt: skip
