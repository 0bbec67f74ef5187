"""Context assembly: one call turns (scope, question) into the memory segments.

The question is embedded once and that vector serves every vector read; the reads run
concurrently; each segment comes back with its token count in the model's encoding.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.base import Segment
from memory.stores.conversation import ConversationStore
from memory.stores.entity import EntityStore
from memory.stores.knowledge_base import KnowledgeBase, Passage
from memory.stores.summary import SummaryStore
from memory.stores.workflow import WorkflowStore
from memory.tokens import count_tokens_many


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


@dataclass
class ContextLimits:
    recent_messages: int = 20
    kb_passages: int = 5
    workflows: int = 3
    entities: int = 5


async def assemble_context(
    memory: MemoryManager,
    scope: Scope,
    question: str,
    limits: ContextLimits | None = None,
    vector: np.ndarray | None = None,
    **kb_filters: Any,
) -> AssembledContext:
    limits = limits or ContextLimits()
    if vector is None:
        vector = (await memory.embedder.embed([question]))[0]
    messages, passages, workflows, entities, summaries = await asyncio.gather(
        memory.conversation.recent_unsummarized(scope, limits.recent_messages),
        memory.knowledge_base.search(scope, question, vector, k=limits.kb_passages, **kb_filters),
        memory.workflows.similar(scope, vector, k=limits.workflows),
        memory.entities.similar(scope, vector, k=limits.entities),
        memory.summaries.descriptions(scope),
    )
    segments: list[Segment] = [
        ConversationStore.segment(messages),
        KnowledgeBase.segment(passages),
        WorkflowStore.segment(workflows),
        EntityStore.segment(entities),
        SummaryStore.segment(summaries),
    ]
    texts = [s.render() for s in segments]
    counts = count_tokens_many(texts, memory.model)
    rendered = [
        ContextSegment(s.name, t, n) for s, t, n in zip(segments, texts, counts, strict=True)
    ]
    return AssembledContext(question, rendered, vector, passages, summaries, len(messages))
