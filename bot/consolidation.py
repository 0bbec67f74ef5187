"""Consolidation: summarize a thread into summary memory, expand it again, compact when full.

`summarize_and_store` asks the model for a durable note; `compact` is the harness's forced,
deterministic variant (no model call, so it cannot fail when the context is too full to send).

Rolling summaries keep a thread's recent window (its unsummarized messages) short: `roll`, run
in the background after turns, summarizes the oldest unsummarized messages once they render past
a target, leaving the newest that fit half of it, and merges the oldest summaries into one
higher-level summary when they pile up. `ensure_window` is the foreground guard for when the
background falls behind: a deterministic compaction, no model call.

A model-written note is requested in pieces that fit the model's window (`request_tokens`): a
longer span is written as notes on consecutive chunks (a message longer than a chunk is split
across several), and those notes are combined, level by level, by requests that fit too.

Every writer holds the thread's summary lock and, in one script, marks exactly the messages it
read (the first n unsummarized ones: a compare-and-set that keeps the summarized messages a
prefix) and stores their summary. A message arriving meanwhile stays unsummarized, and a failure
never leaves messages marked with no summary nor a summary listed over unmarked messages, so
every message is always either unsummarized or covered by exactly one top-level summary.
Forgotten messages (tombstones) are marked like the others, by position, but no note says
anything of them; the deterministic notes live in memory/stores/summary.py, where forgetting
(memory/governance.py) writes them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bot.llm import LLMClient, LLMError
from memory.manager import MemoryManager
from memory.scope import NOWHERE, Scope, legacy_audience, narrowest
from memory.stores.conversation import MarkConflict, Message, message_tokens
from memory.stores.summary import Note, Summary, compact_note, merged_note, utc_minute
from memory.tokens import context_window, count_tokens, encoding_for

log = logging.getLogger(__name__)

LOCK_SECONDS = 120
LOCK_POLL_SECONDS = 0.05
ENSURE_WAIT_SECONDS = 1.0  # how long ensure_window waits for a background summary
MAX_TOP_SUMMARIES = 8  # beyond this many top-level summaries, roll merges the oldest
MODEL_TOKENS_PER_REQUEST = 24_000  # the most one summary request sends, in a large window
REQUEST_WINDOW_SHARE = 0.5  # of a small window: the rest is left for the note written back
REQUEST_OVERHEAD_TOKENS = 16  # chat framing of the two messages of a summary request
MIN_CHUNK_TOKENS = 64
PIECE_MARGIN_TOKENS = 16  # a piece of a split message: room for its marker and re-tokenizing
COMBINE_FANIN = 8  # notes a combining request takes at least (each cut to fit its share)
CONTINUED = "[...] "  # starts each piece of a split message after its first

SUMMARY_INSTRUCTIONS = """\
You consolidate a research assistant's conversation into a durable memory note.
Write JSON with two keys:
- "description": 8 to 12 words saying what the conversation covered;
- "summary": a note that keeps the technical information, the entities and references
  (paper titles, arXiv ids, people, systems), the decisions and action items, and the user's
  tone and preferences. Keep every arXiv id and the user's own questions.
Answer with the JSON object only."""

# A request over notes instead of messages (chunks of a long batch, or summaries to merge) is
# sent with the same instructions, the notes introduced by this line.
PARTS_HEADER = (
    "The conversation is given as notes on its consecutive parts, oldest first. "
    "Combine them into one note.\n\n"
)


NO_THREAD = (
    "I have no stored messages of this thread: I keep only the threads I took part in, and "
    "nothing erased."
)
ALREADY_SUMMARIZED = "Nothing to summarize: every message of this thread is already summarized."

Renew = Callable[[], Awaitable[None]]
NoteWriter = Callable[[list[Message], Renew], Awaitable[Note]]


class SummaryInProgress(RuntimeError):
    """Another summary of the same thread is being written."""


def lines_of(messages: list[Message]) -> list[str]:
    """The transcript lines a model-written note is asked over, each naming its speaker (as the
    Conversation segment does: in a thread of several people, who said what is the point);
    forgotten messages left out."""
    return [m.line for m in messages if not m.forgotten]


def transcript(messages: list[Message]) -> str:
    """The original messages as an expanded summary shows them: when (UTC) and who said each."""
    return "\n".join(f"[{utc_minute(m.timestamp)}] {m.line}" for m in messages if not m.forgotten)


def parse_note(data: Any) -> Note:
    """The model's JSON answer as a note; ValueError when it is not one."""
    if not isinstance(data, dict) or not str(data.get("summary", "")).strip():
        raise ValueError("the model's summary was not a JSON object with a 'summary'")
    summary = str(data["summary"]).strip()
    description = " ".join(str(data.get("description") or summary).split()[:12])
    return description, summary


def covered_audience(scope: Scope, messages: list[Message]) -> str:
    """Who may see a summary of `messages` written in `scope`: the narrowest of their audiences
    (`narrowest`), so a summary of a walled person's words in a public channel is that
    channel's private memory, as the words are. Forgotten messages say nothing in a note."""
    said = [m.audience or legacy_audience(scope.thread) for m in messages if not m.forgotten]
    return narrowest([scope.audience, *said])


def newest_within(costs: list[int], budget: int) -> int:
    """How many of the newest items (by their token `costs`) fit in `budget` together."""
    kept, total = 0, 0
    for cost in reversed(costs):
        if total + cost > budget:
            break
        total, kept = total + cost, kept + 1
    return kept


class Consolidator:
    def __init__(
        self, memory: MemoryManager, llm: LLMClient | None, window: int | None = None
    ) -> None:
        """`window`: the model's context window in tokens, when configured (otherwise the
        known window of `memory.model`); no summary request is larger than its share."""
        self.memory = memory
        self.llm = llm
        share = int(context_window(memory.model, window) * REQUEST_WINDOW_SHARE)
        self.request_tokens = min(MODEL_TOKENS_PER_REQUEST, share)

    # -- the lock and the commit -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lock(self, scope: Scope, wait: float = 0.0) -> AsyncIterator[Callable]:
        """Hold the thread's summary lock (waiting up to `wait` seconds for it, else
        `SummaryInProgress`); yields a coroutine function that renews it."""
        conversation, token = self.memory.conversation, uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not await conversation.claim_summarizing(scope, token, LOCK_SECONDS):
            if loop.time() >= deadline:
                raise SummaryInProgress("A summary of this thread is already being written.")
            await asyncio.sleep(LOCK_POLL_SECONDS)

        async def renew() -> None:
            if not await conversation.renew_summarizing(scope, token, LOCK_SECONDS):
                log.warning("summary lock of %s lost; the marking still checks", scope.thread)

        try:
            yield renew
        finally:
            await conversation.release_summarizing(scope, token)

    async def _commit(
        self, scope: Scope, first: int, raw: list[str], messages: list[Message], note: Note
    ) -> Summary:
        """Mark `messages` (read as `raw` from index `first`) with a new summary of them, stored
        and indexed by the same script: a conflict, a failure or a crash leaves neither, and a
        resend of it succeeds. It is stored for the narrowest audience of the messages
        (`covered_audience`)."""
        description, text = note
        audience = covered_audience(scope, messages)
        if audience == NOWHERE:  # two places' messages in one thread: shown there only
            log.warning("summary of %s covers messages of several places", scope.thread)
        summary = Summary(
            scope.thread, description, text, [m.id for m in messages], audience=audience
        )
        record = self.memory.summaries.indexed(scope, summary)
        await self.memory.conversation.mark_summarized(scope, first, raw, summary.id, record)
        return summary

    async def _store(self, scope: Scope, make_note: NoteWriter) -> tuple[int, Summary | None]:
        """Snapshot the unsummarized messages, store the note `make_note` writes (given the
        lock's renewal: a long model call keeps the thread's lock), mark them. Returns the
        number of messages summarized before, and the summary (None: nothing to summarize; with
        0 before, the thread has no stored message at all)."""
        async with self._lock(scope) as renew:
            first, raw = await self.memory.conversation.unsummarized_snapshot(scope)
            if not raw:
                return first, None
            messages = [Message.from_json(r) for r in raw]
            note = await make_note(messages, renew)
            return first, await self._commit(scope, first, raw, messages, note)

    # -- the model's notes -------------------------------------------------------------------------

    async def _ask(self, content: str, renew: Callable[[], Awaitable[None]] | None) -> Note:
        if renew is not None:
            await renew()
        data = await self.llm.complete_json(
            [
                {"role": "system", "content": SUMMARY_INSTRUCTIONS},
                {"role": "user", "content": content},
            ]
        )
        return parse_note(data)

    def _budget(self, limit: int) -> int:
        """Tokens of the transcript in a request of at most `limit` tokens."""
        fixed = count_tokens(SUMMARY_INSTRUCTIONS, self.memory.model) + REQUEST_OVERHEAD_TOKENS
        return max(limit - fixed, MIN_CHUNK_TOKENS)

    def _cut(self, item: str, tokens: int) -> str:
        """`item` shortened to about `tokens` tokens (no cut when it fits)."""
        model = self.memory.model
        if count_tokens(item, model) <= tokens:
            return item
        encoding = encoding_for(model)
        ids = encoding.encode(item, disallowed_special=())
        return encoding.decode(ids[: max(tokens - 8, 1)]) + " [...]"

    def _pieces(self, item: str, tokens: int) -> list[str]:
        """`item` as consecutive pieces whose lines (with their newline) fit `tokens` tokens:
        itself when it fits; otherwise split, every piece after the first marked `CONTINUED`,
        so a message longer than a request is summarized whole, over several."""
        model = self.memory.model
        if count_tokens(item + "\n", model) <= tokens:
            return [item]
        encoding = encoding_for(model)
        ids = encoding.encode(item, disallowed_special=())
        step = max(tokens - PIECE_MARGIN_TOKENS, 1)
        while True:
            pieces = [
                (CONTINUED if start else "") + encoding.decode(ids[start : start + step])
                for start in range(0, len(ids), step)
            ]
            over = max(count_tokens(piece + "\n", model) for piece in pieces) - tokens
            if over <= 0 or step == 1:
                return pieces
            step = max(step - over, 1)  # re-tokenized at its edges, a piece came out longer

    def _chunks(self, items: list[str], budget: int) -> list[list[str]]:
        """Consecutive items in groups whose lines (joined by newlines) fit `budget` tokens; an
        item longer than that is split (`_pieces`). Each item starts with '[', so its tokens
        with its newline add up exactly."""
        model = self.memory.model
        chunks: list[list[str]] = [[]]
        used = 0
        for item in items:
            for piece in self._pieces(item, budget):
                cost = count_tokens(piece + "\n", model)
                if chunks[-1] and used + cost > budget:
                    chunks.append([])
                    used = 0
                chunks[-1].append(piece)
                used += cost
        return chunks

    def _parts_budget(self, limit: int) -> int:
        """Tokens of the notes in a combining request of at most `limit` tokens."""
        header = count_tokens(PARTS_HEADER, self.memory.model)
        return max(self._budget(limit) - header, MIN_CHUNK_TOKENS)

    async def _model_note(
        self,
        items: list[str],
        limit: int,
        renew: Callable[[], Awaitable[None]] | None = None,
        parts: bool = False,
    ) -> Note:
        """A model-written note over transcript lines (`parts`: over notes), in requests of at
        most `limit` tokens: a longer input is written in chunks that fit, whose notes are
        then combined (`_combine`)."""
        header = PARTS_HEADER if parts else ""
        chunks = self._chunks(items, self._parts_budget(limit) if parts else self._budget(limit))
        notes = [await self._ask(header + "\n".join(chunk), renew) for chunk in chunks]
        return await self._combine(notes, limit, renew)

    async def _combine(
        self, notes: list[Note], limit: int, renew: Callable[[], Awaitable[None]] | None
    ) -> Note:
        """One note from the notes of consecutive parts, oldest first: each cut to its share
        of a request (at least 1/COMBINE_FANIN), grouped into requests that fit `limit`, and
        again with the notes those write, until one is left. However many chunks a long span
        took, no request is larger than `limit`."""
        budget = self._parts_budget(limit)
        while len(notes) > 1:
            share = max(budget // min(len(notes), COMBINE_FANIN) - 1, 1)
            lines = [
                self._cut(f"[Part {i}] {description}\n{text}", share)
                for i, (description, text) in enumerate(notes, 1)
            ]
            notes = [
                await self._ask(PARTS_HEADER + "\n".join(group), renew)
                for group in self._chunks(lines, budget)
            ]
        return notes[0]

    # -- the agent's tool, forced compaction, expansion ---------------------------------------------

    async def summarize_and_store(
        self, scope: Scope, shown_audiences: set[str] | None = None
    ) -> str:
        """The agent's tool: an LLM-written note for every unsummarized message of the thread.
        `shown_audiences` collects the audience of the note its answer describes (its tool
        log is stored for it: bot/harness.py)."""
        if self.llm is None:
            raise RuntimeError("No model is configured to write summaries.")

        async def note(messages: list[Message], renew: Renew) -> Note:
            lines = lines_of(messages)
            if not lines:  # only forgotten messages: nothing to ask about
                return compact_note(messages)
            return await self._model_note(lines, self.request_tokens, renew)

        summarized, summary = await self._store(scope, note)
        if summary is None:  # a thread the bot never took part in has no stored message
            return ALREADY_SUMMARIZED if summarized else NO_THREAD
        if shown_audiences is not None:
            shown_audiences.add(summary.audience)
        return (
            f"Stored as [Summary ID: {summary.id}] {summary.description} "
            f"({len(summary.message_ids)} messages)"
        )

    async def compact(self, scope: Scope) -> Summary | None:
        """Forced compaction: an extractive note, written without the model."""

        async def note(messages: list[Message], renew: Renew) -> Note:
            return compact_note(messages)

        return (await self._store(scope, note))[1]

    async def expand_summary(
        self, scope: Scope, summary_id: str, shown_audiences: set[str] | None = None
    ) -> str:
        """The summary and, in order, the original messages it covers, if `scope` may see it:
        of those, asked from another thread, only the ones `scope` may see too (a place turned
        private keeps its later messages from where it was public), the others counted as
        withheld. In its own thread every message is shown: whoever asks there can read it.
        `shown_audiences` collects the audiences of what is shown (for the tool's log)."""
        summary = await self.memory.summaries.get(scope, summary_id)
        covered = set(summary.message_ids)
        thread = scope.in_thread(summary.thread_id)
        messages = [m for m in await self.memory.conversation.all(thread) if m.id in covered]
        here = bool(scope.thread) and scope.thread == summary.thread_id
        shown = [
            m
            for m in messages
            if here or scope.can_see(m.audience or legacy_audience(summary.thread_id))
        ]
        if shown_audiences is not None:
            shown_audiences.add(summary.audience or legacy_audience(summary.thread_id))
            shown_audiences.update(m.audience or legacy_audience(summary.thread_id) for m in shown)
        withheld = len(messages) - len(shown)
        note = f" ({withheld} more not shown here: they are private to another place)"
        return (
            f"[Summary ID: {summary.id}] {summary.description}\n"
            f"Original messages ({len(shown)}){note if withheld else ''}, oldest first:\n"
            f"{transcript(shown)}\n\nSummary:\n{summary.text}"
        )

    # -- rolling summaries ----------------------------------------------------------------------

    async def roll(
        self,
        scope: Scope,
        target_tokens: int,
        model_tokens_per_request: int | None = None,
    ) -> list[Summary]:
        """Keep the thread's recent window short; returns the summaries it wrote.

        When the unsummarized messages render past `target_tokens`, the oldest are summarized
        (by the model when there is one), leaving the newest that fit `target_tokens // 2`.
        Then, when the thread has more than MAX_TOP_SUMMARIES top-level summaries, the oldest
        are merged into one higher-level summary. A failed model call (LLMError, or an answer
        that is no note) raises, nothing marked, so the background task is retried, unless the
        backlog is past twice the target: then the note is the deterministic one.
        `SummaryInProgress` when another summary of the thread is being written. Idempotent.
        No model request is larger than `model_tokens_per_request` (`request_tokens`)."""
        if target_tokens <= 0:
            raise ValueError("target_tokens must be positive")
        model_tokens_per_request = model_tokens_per_request or self.request_tokens
        written: list[Summary] = []
        async with self._lock(scope) as renew:
            summary = await self._roll_window(scope, target_tokens, model_tokens_per_request, renew)
            if summary is not None:
                written.append(summary)
            merged = await self._merge_summaries(scope, model_tokens_per_request, renew)
            if merged is not None:
                written.append(merged)
        return written

    async def _roll_window(
        self, scope: Scope, target: int, limit: int, renew: Callable[[], Awaitable[None]]
    ) -> Summary | None:
        first, raw = await self.memory.conversation.unsummarized_snapshot(scope)
        messages = [Message.from_json(r) for r in raw]
        costs = message_tokens(messages, self.memory.model)
        backlog = sum(costs)
        if backlog <= target:
            return None
        n = len(messages) - newest_within(costs, target // 2)
        batch = messages[:n]
        lines = lines_of(batch)
        if self.llm is None or not lines:
            note = compact_note(batch)
        else:
            try:
                note = await self._model_note(lines, limit, renew)
            except (LLMError, ValueError) as exc:
                if backlog <= 2 * target:
                    raise
                log.warning("rolling summary of %s: the model failed (%s); compacting instead",
                            scope.thread, exc)  # fmt: skip
                note = compact_note(batch)
        return await self._commit(scope, first, raw[:n], batch, note)

    async def _merge_summaries(
        self, scope: Scope, limit: int, renew: Callable[[], Awaitable[None]]
    ) -> Summary | None:
        """Merge the oldest top-level summaries into one when there are too many, so that
        MAX_TOP_SUMMARIES // 2 remain."""
        summaries = await self.memory.summaries.for_thread(scope)
        if len(summaries) <= MAX_TOP_SUMMARIES:
            return None
        children = summaries[: len(summaries) - MAX_TOP_SUMMARIES // 2 + 1]
        if self.llm is None:
            note = merged_note(children)
        else:
            items = [f"[Summary ID: {c.id}] {c.description}\n{c.text}" for c in children]
            try:
                note = await self._model_note(items, limit, renew, parts=True)
            except (LLMError, ValueError) as exc:
                if len(summaries) <= 2 * MAX_TOP_SUMMARIES:
                    raise
                log.warning("merging summaries of %s: the model failed (%s); listing instead",
                            scope.thread, exc)  # fmt: skip
                note = merged_note(children)
        description, text = note
        merged = Summary(
            scope.thread, description, text,
            [message_id for child in children for message_id in child.message_ids],
            level=max(child.level for child in children) + 1,
        )  # fmt: skip
        return await self.memory.summaries.merge(scope, merged, children)

    async def ensure_window(self, scope: Scope, hard_cap_tokens: int) -> Summary | None:
        """The foreground guard before a turn's context is assembled: when the unsummarized
        messages render past `hard_cap_tokens`, compact the oldest deterministically (no model
        call) so the rest fit `hard_cap_tokens // 2`. If a background summary holds the thread
        (more than ENSURE_WAIT_SECONDS), or a concurrent writer got there first, it leaves the
        window as it is (None) rather than fail the turn."""
        model = self.memory.model
        messages = await self.memory.conversation.unsummarized(scope)
        if sum(message_tokens(messages, model)) <= hard_cap_tokens:
            return None
        try:
            async with self._lock(scope, wait=ENSURE_WAIT_SECONDS):
                first, raw = await self.memory.conversation.unsummarized_snapshot(scope)
                messages = [Message.from_json(r) for r in raw]
                costs = message_tokens(messages, model)
                if sum(costs) <= hard_cap_tokens:  # the background caught up meanwhile
                    return None
                n = len(messages) - newest_within(costs, hard_cap_tokens // 2)
                return await self._commit(
                    scope, first, raw[:n], messages[:n], compact_note(messages[:n])
                )
        except SummaryInProgress:
            log.info("window of %s not compacted: a summary is being written", scope.thread)
        except MarkConflict as exc:
            log.warning("window of %s not compacted: %s", scope.thread, exc)
        return None
