"""Consolidation: summarize a thread into summary memory, expand it again, compact when full.

`summarize_and_store` asks the model for a durable note; `compact` is the harness's forced,
deterministic variant (no model call, so it cannot fail when the context is too full to send).
Both store a summary first and then mark exactly the messages they read: a message arriving
meanwhile stays unsummarized, and a failure never leaves messages marked with no summary.
"""

from __future__ import annotations

import time
import uuid

from bot.llm import LLMClient
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.conversation import Message
from memory.stores.summary import Summary

LOCK_SECONDS = 120
COMPACT_CHARS_PER_MESSAGE = 300

SUMMARY_INSTRUCTIONS = """\
You consolidate a research assistant's conversation into a durable memory note.
Write JSON with two keys:
- "description": 8 to 12 words saying what the conversation covered;
- "summary": a note that keeps the technical information, the entities and references
  (paper titles, arXiv ids, people, systems), the decisions and action items, and the user's
  tone and preferences. Keep every arXiv id and the user's own questions.
Answer with the JSON object only."""


class SummaryInProgress(RuntimeError):
    """Another summary of the same thread is being written."""


def transcript(messages: list[Message]) -> str:
    return "\n".join(f"[{m.role}] {m.content}" for m in messages)


class Consolidator:
    def __init__(self, memory: MemoryManager, llm: LLMClient | None) -> None:
        self.memory = memory
        self.llm = llm

    async def _store(self, scope: Scope, make_note) -> Summary | None:
        """Snapshot the unsummarized messages, store the note `make_note` writes, mark them."""
        conversation, token = self.memory.conversation, uuid.uuid4().hex
        if not await conversation.claim_summarizing(scope, token, LOCK_SECONDS):
            raise SummaryInProgress("A summary of this thread is already being written.")
        try:
            first, raw = await conversation.unsummarized_snapshot(scope)
            if not raw:
                return None
            messages = [Message.from_json(r) for r in raw]
            description, text = await make_note(messages)
            summary = Summary(scope.thread, description, text, [m.id for m in messages])
            await self.memory.summaries.save(scope, summary)
            try:
                await conversation.mark_summarized(scope, first, raw, summary.id)
            except Exception:
                await self.memory.summaries.delete(scope, summary)
                raise
            return summary
        finally:
            await conversation.release_summarizing(scope, token)

    async def summarize_and_store(self, scope: Scope) -> str:
        """The agent's tool: an LLM-written note for every unsummarized message of the thread."""
        if self.llm is None:
            raise RuntimeError("No model is configured to write summaries.")

        async def note(messages: list[Message]) -> tuple[str, str]:
            data = await self.llm.complete_json(
                [
                    {"role": "system", "content": SUMMARY_INSTRUCTIONS},
                    {"role": "user", "content": transcript(messages)},
                ]
            )
            if not isinstance(data, dict) or not str(data.get("summary", "")).strip():
                raise ValueError("the model's summary was not a JSON object with a 'summary'")
            summary = str(data["summary"]).strip()
            description = " ".join(str(data.get("description") or summary).split()[:12])
            return description, summary

        summary = await self._store(scope, note)
        if summary is None:
            return "Nothing to summarize: every message of this thread is already summarized."
        return (
            f"Stored as [Summary ID: {summary.id}] {summary.description} "
            f"({len(summary.message_ids)} messages)"
        )

    async def compact(self, scope: Scope) -> Summary | None:
        """Forced compaction: an extractive note, written without the model."""

        async def note(messages: list[Message]) -> tuple[str, str]:
            start = time.strftime("%Y-%m-%d %H:%M", time.localtime(messages[0].timestamp))
            first_question = next((m.content for m in messages if m.role == "user"), "")
            description = f"Compacted {len(messages)} messages from {start}: {first_question}"
            lines = [f"[{m.role}] {m.content[:COMPACT_CHARS_PER_MESSAGE]}" for m in messages]
            return " ".join(description.split()[:16]), "\n".join(lines)

        return await self._store(scope, note)

    async def expand_summary(self, scope: Scope, summary_id: str) -> str:
        """The summary and, in order, the original messages it covers, if `scope` may see it."""
        summary = await self.memory.summaries.get(scope, summary_id)
        covered = set(summary.message_ids)
        thread = scope.in_thread(summary.thread_id)
        messages = [m for m in await self.memory.conversation.all(thread) if m.id in covered]
        return (
            f"[Summary ID: {summary.id}] {summary.description}\n"
            f"Original messages ({len(messages)}), oldest first:\n{transcript(messages)}\n\n"
            f"Summary:\n{summary.text}"
        )
