"""The agent harness: the deterministic memory work before, inside and after the loop.

Before: assemble the context, check its size against the model's window (compact above 80 %),
pick the tools for this question, persist the user message. Inside: run a tool call, log it in
full, hand the model a truncated result. After: persist the answer, then queue the workflow and
entity writes as durable background work (`bot.background`) so the reply is not delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from bot.background import BackgroundWork
from bot.citations import Source, SourceRegistry
from bot.consolidation import Consolidator, SummaryInProgress
from bot.llm import LLMClient, LLMResponseError, ToolCall, extract_json
from bot.metering import Meter, metered
from bot.prompt import agent_system_prompt
from bot.spent_tasks import last_delivery
from bot.toolbox import Toolbox, ToolResult
from bot.tools import MEMORY_TOOLS, TOOL_RESULT_CHARS, ToolContext, read_on
from bot.upkeep import ARTIFACTS, Upkeep  # ARTIFACTS: the task writing what a turn taught
from memory.context import AssembledContext, ContextLimits, assemble_context
from memory.governance_erasure import Busy, NotFound
from memory.governance_learned import TOLD
from memory.ingest.arxiv_source import ArxivSource
from memory.manager import MemoryManager
from memory.scope import NOWHERE, Scope
from memory.stores.conversation import MarkConflict, MemoryRestoring, Message
from memory.stores.entity import Entity
from memory.stores.entity_pieces import version_of
from memory.stores.tool_log import ToolLogEntry, log_audience
from memory.stores.turn_records import TurnRecord, TurnUsage, UnknownTurn, new_turn_id
from memory.tokens import context_window, count_tokens

log = logging.getLogger(__name__)

COMPACT_THRESHOLD = 0.80
FORGOTTEN_QUESTION = "This message was forgotten before I could answer it."
TOP_K_TOOLS = 4
EXTRACT_CHARS = 12_000  # of a question and of an answer, read for entities (a few k tokens)
RESTORE_WAIT_SECONDS = 10.0  # an answer refused by a restore (an import) is tried again this long
RESTORE_RETRY_SECONDS = 0.5
ANSWER_NOT_SAVED = (
    "(My memory is being restored from an export right now, so this answer could not be saved "
    "to it; your question was.)"
)

ENTITY_INSTRUCTIONS = """\
Extract the named entities (people, organisations, systems, models, datasets, papers) from this
exchange between a user and a research assistant. Answer with a JSON list of objects with keys
"name", "type" (person, organisation, system, model, dataset, paper or other) and "description"
(one sentence of what the exchange says about it). Answer [] if there are none."""


# A name: a capitalised word not at the start of a sentence, an acronym, or an arXiv id.
_NAME = re.compile(
    r"(?<![.!?\n]\s)(?<!^)(?<!\n)\b[A-Z][\w\-]*[A-Za-z]|\b[A-Z]{2,}\b|\b\d{4}\.\d{4,5}\b"
)


def mentions_names(text: str) -> bool:
    """Cheap filter before the entity-extraction model call."""
    return bool(_NAME.search(text))


@lru_cache(maxsize=8)
def prompt_tokens(model: str) -> int:
    return count_tokens(agent_system_prompt(), model)  # its date is as long every day


def question_once(turn_id: str) -> str:
    """The idempotency key of a turn's question (stored once however often the turn runs)."""
    return f"{turn_id}:question" if turn_id else ""


class QuestionForgotten(RuntimeError):
    """A turn run again (taken over after a crash) whose question, stored by the first run,
    was forgotten since (the memory page, a person's erasure, retention, a deletion on the
    platform): it is not answered, recorded or indexed; the person is told (bot/turns.py)."""


class AnswerNotSaved(RuntimeError):
    """The turn's answer was refused by an import of the tenant running (`MemoryRestoring`)
    for longer than the harness waits: it is given all the same, with a note that memory does
    not hold it (bot/turns.py), and leaves no record. Not an `InvalidMessage`: the question was
    stored, and the person is not asked to send it again."""

    def __init__(self, answer: str) -> None:
        super().__init__(ANSWER_NOT_SAVED)
        self.answer = answer


@dataclass
class Prepared:
    """What the harness hands the loop for one turn."""

    context: AssembledContext
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_names: list[str]
    usage_percent: float
    compacted: bool = False
    question: Message | None = None  # the user's message, as stored
    turn_id: str = ""  # the job's id: its messages are stored once however often it runs
    record_id: str = ""  # the turn record's id: the job's, or a fresh one (terminal turns)
    sources: SourceRegistry = field(default_factory=SourceRegistry)  # the passages shown, numbered

    @property
    def asked_id(self) -> str:
        """The stored question's id, which the turn's tool logs list (`Harness.run_tool`)."""
        return self.question.id if self.question is not None else ""


@dataclass
class Step:
    name: str
    arguments: str
    status: str
    log_id: str

    def describe(self) -> str:
        return f"{self.name}({self.arguments}) -> {self.status}"


def _asked(task: dict[str, Any]) -> str:
    """The stored id of the question an artifacts task learns from ("" in older tasks)."""
    return str((task.get("asked") or {}).get("id") or "")


def _version(task: dict[str, Any]) -> str:
    """The owner of the entity pieces a task learns: its question's id and text's hash (the
    bare id for a task queued before it named the text)."""
    return version_of(_asked(task), (task.get("asked") or {}).get("text"))


ASKED, EDITED, FORGOTTEN = "asked", "edited", "forgotten"  # a task's question, as stored now
ERASED = "erased"  # a turn's question gone with its whole thread (`Harness._kept`)


@dataclass
class Harness:
    memory: MemoryManager
    llm: LLMClient
    toolbox: Toolbox[ToolContext]
    consolidator: Consolidator
    arxiv: ArxivSource
    encoding: Any
    background: BackgroundWork
    upkeep: Upkeep
    window: int | None = None
    restore_wait: float = RESTORE_WAIT_SECONDS  # how long an answer a restore refused is retried

    @property
    def limits(self) -> ContextLimits:
        return self.upkeep.limits

    def tool_context(self, scope: Scope, sources: SourceRegistry | None = None) -> ToolContext:
        return ToolContext(
            scope, self.memory, self.arxiv, self.consolidator, self.encoding,
            sources if sources is not None else SourceRegistry(),
        )  # fmt: skip

    # -- before the loop -----------------------------------------------------------------------

    async def before(
        self, scope: Scope, question: str, turn_id: str = "", source: str = ""
    ) -> Prepared:
        """`source`: the platform's id of the question's message, kept with it (a deletion
        there finds it: memory/governance.py `forget_deleted`)."""
        with self.background.foreground():
            return await self._prepare(scope, question, turn_id, source)

    async def forgotten_question(self, scope: Scope, turn_id: str) -> bool:
        """Whether a re-run's question, stored by a run before it, was forgotten since: then the
        re-run embeds, searches and answers nothing (bot/turns.py)."""
        stored = await self.memory.conversation.appended(scope, question_once(turn_id))
        return stored is not None and stored.forgotten

    async def _prepare(self, scope: Scope, question: str, turn_id: str, source: str) -> Prepared:
        context = await assemble_context(self.memory, scope, question, self.limits)
        if context.window_overflows(self.limits.window_cap):  # the background roll fell behind
            await self.consolidator.ensure_window(scope, self.limits.window_cap)
            context = await assemble_context(
                self.memory, scope, question, self.limits, vector=context.vector
            )
        usage = self.usage_percent(context)
        compacted = False
        if usage > COMPACT_THRESHOLD * 100:
            # a background roll is at it, or an edit landed meanwhile: answer uncompacted
            with contextlib.suppress(SummaryInProgress, MarkConflict):
                compacted = await self.consolidator.compact(scope) is not None
            context = await assemble_context(
                self.memory, scope, question, self.limits, vector=context.vector
            )
            context = self._trim(context)
            usage = self.usage_percent(context)
        tool_names = await self.select_tools(scope, context)
        stored = await self.memory.conversation.append(
            scope, "user", question, once=question_once(turn_id),
            **({"source": source} if source else {}),
        )  # fmt: skip
        if stored.forgotten:  # a run taken over after a crash: the first run stored it, since
            await self.memory.governance.edits.uncache([question])  # embedded again just now
            raise QuestionForgotten(FORGOTTEN_QUESTION)
        messages = [
            {"role": "system", "content": agent_system_prompt()},
            {"role": "user", "content": context.render()},
        ]
        schemas = self.toolbox.schemas(tool_names)
        sources = SourceRegistry(context.passages)  # numbered as the segment shows them
        sources.show_papers_in(context.question, bare=True)  # ids it was shown may be linked
        sources.show_papers_in(context.memory_text())
        return Prepared(
            context, messages, schemas, tool_names, usage, compacted, stored, turn_id,
            record_id=turn_id or new_turn_id(), sources=sources,
        )  # fmt: skip

    def usage_percent(self, context: AssembledContext) -> float:
        """Tokens the model will be sent (system prompt, question, segments) over its window."""
        model = self.memory.model
        window = context_window(model, self.window)
        question = count_tokens(f"# Question\n{context.question}\n\n", model)
        return 100.0 * (prompt_tokens(model) + question + context.total_tokens) / window

    def _trim(self, context: AssembledContext) -> AssembledContext:
        """Still too full after compaction: drop the largest segments' text to fit."""
        while self.usage_percent(context) > COMPACT_THRESHOLD * 100:
            biggest = max(context.segments, key=lambda s: s.tokens)
            if biggest.tokens < 50:
                break
            keep = biggest.text[: len(biggest.text) // 2]
            biggest.text = keep + "\n[... trimmed to fit the context window]"
            biggest.tokens = count_tokens(biggest.text, self.memory.model)
        return context

    async def select_tools(self, scope: Scope, context: AssembledContext) -> list[str]:
        """Top-k tools by similarity, plus the memory tools whenever the thread needs them."""
        similar = await self.memory.toolbox.similar(context.vector, k=TOP_K_TOOLS)
        names = [n for n in similar if n in self.toolbox]
        needed = {
            "expand_summary": bool(context.summaries),
            "summarize_and_store": context.recent_messages >= 2,
            # any tool's result may be cut: its rest is read in the same turn
            "read_tool_log": bool(names) or await self.memory.tool_logs.exists_in(scope),
            # there is more said before than the context shows
            "search_conversations": bool(context.episodes or context.summaries),
        }
        names += [n for n in MEMORY_TOOLS if needed[n] and n not in names and n in self.toolbox]
        return names

    # -- inside the loop -----------------------------------------------------------------------

    async def run_tool(
        self, scope: Scope, call: ToolCall, iteration: int, sources: SourceRegistry | None = None,
        asked: str = "",
    ) -> tuple[str, Step]:  # fmt: skip
        """Run one tool call; the passages it shows are numbered in the turn's `sources`. Its
        log lists the turn's question (`asked`, its stored id) with what it showed: its input
        quotes the question, so forgetting or editing that takes the log too, whatever became
        of the turn's record (`_kept`)."""
        context = self.tool_context(scope, sources)
        result: ToolResult = await self.toolbox.execute(call.name, call.arguments, context)
        try:
            tool_input: Any = json.loads(call.arguments or "{}")
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse: as sent
            tool_input = call.arguments
        audience = log_audience(scope, context.shown_audiences)  # of what the call showed
        log_id = await self.memory.tool_logs.write(
            scope,
            ToolLogEntry(
                thread_id=scope.thread, tool_name=call.name, tool_input=tool_input,
                output=result.output, status=result.status, error=result.error or "",
                duration_ms=result.duration_ms, iteration=iteration, author=scope.user,
                audience=audience, message_ids=sorted(context.shown_messages | ({asked} - {""})),
            ),
        )  # fmt: skip
        output = result.output
        if sources is not None and result.status == "success":
            sources.show_papers_in(output[:TOOL_RESULT_CHARS])  # earlier answers' papers
        if len(output) > TOOL_RESULT_CHARS:
            rest = (
                f"Full output saved in tool log as {log_id}. {read_on(log_id, TOOL_RESULT_CHARS)}"
                if audience != NOWHERE  # else nobody may read the log: say so, not its id
                else "The rest cannot be read back: it mixes the team's memory with a "
                "channel's private memory. Ask for fewer results instead"
            )
            output = output[:TOOL_RESULT_CHARS] + f"\n\n[Truncated. {rest}]"
        return output, Step(call.name, call.arguments, result.status, log_id)

    # -- after the loop ------------------------------------------------------------------------

    async def after(
        self, scope: Scope, prepared: Prepared, steps: list[Step], answer: str,
        usage: Meter | None = None, citations_removed: int = 0, cited: Sequence[Source] = (),
        **meta: Any,
    ) -> None:  # fmt: skip
        """Store the answer and the turn's record (with its `usage` and the sources it `cited`);
        queue what the turn taught: its messages for episodic recall, a rolling summary if the
        recent window grew past its share, the workflow and entities. A question forgotten while
        the turn ran teaches nothing, and leaves no record (`_kept`); a failed turn (the model's
        error, a timeout, the iteration cap, a cut or filtered answer) no workflow or entity."""
        try:
            answered = await self._store_answer(scope, prepared, answer, meta)
        except AnswerNotSaved:  # the question, stored, is still found by recall and rolled
            asked = prepared.question
            if asked is not None and not asked.forgotten:
                window = prepared.context.segment("Conversation").tokens + count_tokens(
                    asked.content, self.memory.model
                )
                await self.upkeep.after_messages(scope, [asked], window)
            raise
        await self.record_turn(
            scope, prepared, steps, answer, answered, usage or Meter(), citations_removed,
            str(meta.get("stop_reason", "final")), cited,
        )  # fmt: skip
        state = await self._kept(scope, prepared, answered)
        if state == ERASED:
            return
        context, question = prepared.context, prepared.context.question
        asked = prepared.question if state == ASKED else None  # a tombstone is not indexed
        said = [m for m in (asked, answered) if m is not None]
        window = context.segment("Conversation").tokens + count_tokens(
            f"{question}\n{answer}", self.memory.model
        )
        await self.upkeep.after_messages(scope, said, window)
        if state != ASKED:
            return  # nothing is learned from a forgotten question
        if meta.get("stop_reason", "final") != "final":
            return  # nor from a failed turn: its steps are no procedure, its error no fact
        if steps or mentions_names(f"{question}\n{answer}"):  # else nothing to learn: "thanks"
            await self.background.submit(
                ARTIFACTS,
                {"scope": scope.to_dict(), "question": question, "answer": answer,
                 "steps": [s.describe() for s in steps], "turn": prepared.record_id,
                 "asked": {"id": asked.id, "seq": asked.seq, "text": asked.content}
                 if asked else None},
            )  # fmt: skip

    async def _store_answer(
        self, scope: Scope, prepared: Prepared, answer: str, meta: dict[str, Any]
    ) -> Message:
        """Append the answer. An import of the tenant refuses it (`MemoryRestoring`) while it
        runs, mostly one that will itself be refused soon (the question, stored, makes the
        tenant not empty): tried again for `restore_wait`, then `AnswerNotSaved`, so the answer
        is still given, not thrown away as a message refused."""
        once = f"{prepared.turn_id}:answer" if prepared.turn_id else ""
        deadline = time.monotonic() + self.restore_wait
        while True:
            try:
                return await self.memory.conversation.append(
                    scope, "assistant", answer, once=once, **meta
                )
            except MemoryRestoring:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("thread %s: a restore refused the answer; given unsaved",
                                scope.thread)  # fmt: skip
                    raise AnswerNotSaved(answer) from None
                await asyncio.sleep(min(RESTORE_RETRY_SECONDS, left))

    async def _kept(self, scope: Scope, prepared: Prepared, answered: Message) -> str:
        """Whether the turn's question is still stored, read once its record is saved: an
        erasure that ran before the record (the memory page, a person's erasure, a deletion
        on the platform) did not find it. ASKED; FORGOTTEN, a tombstone: its record goes, and
        the tool logs listing the question (`run_tool`) that the erasure, run before them, missed
        (the answer stays, as others' answers to a forgotten message do); ERASED, its thread gone
        whole: the answer stored since brought the thread back, and it goes whole again
        (its record with it), now, or by a queued task when another erasure holds the lock
        (a person's, a long one). An erasure after this read finds the record itself."""
        asked = prepared.question
        if asked is None or asked.seq < 0:
            return ASKED
        now = (await self.memory.conversation.at(scope, [asked.seq])).get(asked.seq)
        if now is not None and now.id == asked.id and not now.forgotten:
            return ASKED
        if now is not None and now.id == asked.id:
            await self.memory.tool_logs.forget_showing(scope.tenant, [asked.id])
            await self.memory.turn_records.forget(scope.tenant, [prepared.record_id])
            return FORGOTTEN
        await self.memory.turn_records.forget(scope.tenant, [prepared.record_id])
        try:
            await self.memory.governance.forget_thread(scope.tenant, scope.thread)
        except NotFound:  # an erasure took it again meanwhile
            pass
        except Busy:  # the answer is given: failing the turn would not take it out either
            log.warning("thread %s, erased while its turn ran: its answer's erasure is queued",
                        scope.thread)  # fmt: skip
            await self.upkeep.answer_erased(scope, answered.id)
        return ERASED

    async def record_turn(
        self, scope: Scope, prepared: Prepared, steps: list[Step], answer: str,
        answered: Message | None, usage: Meter, citations_removed: int, stop_reason: str,
        cited: Sequence[Source] = (),
    ) -> None:  # fmt: skip
        """The turn's record (once per turn id): who asked what, the answer, the memory ids,
        every passage shown (numbered) and those cited, the tools it used, what it cost."""
        asked = prepared.question
        shown = [
            {"number": n, "id": f"{p.arxiv_id}#{p.chunk_index}"}
            for n, p in enumerate(prepared.sources.passages, 1)
        ]
        cites = [
            {"number": s.number,
             "id": s.arxiv_id if s.chunk_index is None else f"{s.arxiv_id}#{s.chunk_index}"}
            for s in cited
        ]  # fmt: skip
        await self.memory.turn_records.save(
            TurnRecord(
                prepared.record_id, scope.tenant, scope.thread, prepared.context.question,
                answer, audience=scope.audience, channel=scope.channel, asker=scope.user,
                asker_name=scope.user_name, walled=scope.walled, stop_reason=stop_reason,
                question_id=asked.id if asked else "", answer_id=answered.id if answered else "",
                memory=prepared.context.memory_ids(), shown=shown, cited=cites,
                tools=[{"name": s.name, "status": s.status, "log_id": s.log_id} for s in steps],
                usage=TurnUsage(usage.tokens_in, usage.tokens_out, usage.calls, len(steps)),
                citations_removed=citations_removed,
            )
        )  # fmt: skip

    async def drain(self) -> None:
        """Wait for background writes (before shutdown, and in tests)."""
        await self.background.drain()

    def track_own(self) -> None:
        """From now on, remember the background writes this process submits, so that a
        command can wait for its own before it exits (bot/background.py `track_own`)."""
        self.background.track_own()

    async def own_left(self) -> bool:
        """Whether a write tracked since `track_own` is still queued or running."""
        return await self.background.own_left()

    async def finish_own(self) -> bool:
        """Wait for the background writes this process submitted since `track_own` only
        (bot/background.py `finish_own`): True when they are done."""
        return await self.background.finish_own()

    async def cut_short(self, *, spend: bool = False) -> None:
        """Close at once, what runs cut short (bot/background.py `cut_short`)."""
        await self.background.cut_short(spend=spend)

    async def stop_reading(self) -> None:
        """Close's first half (bot/background.py `stop_reading`)."""
        await self.background.stop_reading()

    async def close(self) -> None:
        await self.background.close()

    async def write_artifacts(self, tasks: list[dict[str, Any]]) -> None:
        """The background task: the workflow of a turn that used tools, and its entities, each
        with its provenance (the thread, and the turn's asker as its author). A question edited
        before its turn's workflow was written (while its turn ran, followed before this task,
        or after a run of it that failed half-way) is learned from the text it says now, with
        the turn's steps (`_retold`), once the old text's pieces a failed run wrote are taken
        out (its edit may have found none noted yet): no edit's relearn brings the workflow (it
        has no steps), and an edit followed before the turn saved its record queues none. Each
        version's entities are learned once, and the turn's workflow once (`_teaching`): the
        edit's relearn, or this task delivered again, finds them done."""
        for task in tasks:
            scope = Scope.from_dict(task["scope"])
            authors = [scope.user] if scope.user else []
            state, now = await self._asking(scope, task)
            learned, asked = self.memory.governance.learned, _asked(task)
            if state == EDITED and await self._retelling(scope.tenant, asked, now):
                await self._unlearn(scope, task, EDITED, now)  # what a failed run of it wrote
                task, state = _retold(task, now), ASKED  # edited before it was all written
            if state != ASKED:  # forgotten or edited meanwhile: nothing is learned from it, and
                await self._unlearn(scope, task, state, now)  # a run that failed is undone
                continue
            workflow, entities = await self._teaching(scope.tenant, task)
            if not (workflow or entities):
                continue  # delivered again after it was written: once is enough
            with metered() as meter:  # entity extraction's model call, counted to the thread
                try:
                    written = await self._learn(
                        scope, task, authors, learn_workflow=workflow, learn_entities=entities
                    )
                except Exception:  # the failed extraction's call was made: counted too
                    await self._count(scope, meter)
                    raise
            marked = bool(asked) and bool(written or meter.calls)  # run once: a batch-mate's
            if marked:  # failure redelivers it too
                await learned.written(scope.tenant, asked, _version(task), told=workflow)
            state, now = await self._asking(scope, task)
            if state != ASKED:  # forgotten (or edited) while written: a forget expires the
                await self._unlearn(scope, task, state, now, written)  # record, an edit its mark
                continue  # and its usage is not counted to a thread that may be gone
            await self._count(scope, meter)

    async def _retelling(self, tenant: str, asked: str, now: str) -> bool:
        """Whether a task whose question was edited learns the text it says now itself: while
        its turn's workflow is not written (no edit's relearn brings it: it has no steps), or
        that text's entities are not (a run of it wrote the workflow, marked told at once,
        then failed; `_teaching` then skips the workflow)."""
        learned = self.memory.governance.learned
        untold, done = await asyncio.gather(  # one round trip (autopipelined)
            learned.untold(tenant, asked), learned.learned(tenant, asked, version_of(asked, now))
        )
        return untold or not done

    async def _teaching(self, tenant: str, task: dict[str, Any]) -> tuple[bool, bool]:
        """Whether a task is still to write its turn's workflow, and its version's entities:
        each once (written again, it would undo a person's edit on the memory page). The
        workflow when the turn's steps succeeded and no run of its task wrote it; the entities
        when no task for this version (its own, or an edit's relearn) wrote them."""
        learned, asked, steps = self.memory.governance.learned, _asked(task), task["steps"]
        if not asked:  # a task from before questions were named
            return _succeeded(steps), True
        untold, done = await asyncio.gather(  # one round trip (autopipelined)
            learned.untold(tenant, asked), learned.learned(tenant, asked, _version(task))
        )
        return _succeeded(steps) and untold, not done

    async def _count(self, scope: Scope, meter: Meter) -> None:
        """Count a task's background model calls to its thread."""
        usage = TurnUsage(meter.tokens_in, meter.tokens_out, meter.calls)
        await self.memory.turn_records.add_usage(scope, usage)

    async def _unlearn(
        self, scope: Scope, task: dict[str, Any], state: str, now: str,
        written: list[str] | None = None,
    ) -> None:  # fmt: skip
        """Undo what a task learned from a question no longer asked: forgotten, all it taught
        (every version, from the question's record: idempotent); edited, only the pieces of the
        task's text (`written`, or those the record lists), and the workflow's QUERY line says
        the new text again (the task may have written the old one back). The task's done mark
        goes too: the edit took the marks of the texts it does not say out, maybe before this
        task set its own, and editing back to that text must learn it again."""
        learned, asked = self.memory.governance.learned, _asked(task)
        if state == FORGOTTEN:
            await learned.forget(scope.tenant, [asked], also=written or ())
            return
        await learned.unwritten(scope.tenant, asked, _version(task))
        keys = await learned.taught(scope.tenant, asked) if written is None else written
        await learned.discard(scope.tenant, _version(task), keys)
        for key in learned.workflows(scope.tenant, keys):
            await learned.requery(scope.tenant, asked, key, now)

    async def _learn(
        self, scope: Scope, task: dict[str, Any], authors: list[str], *,
        learn_workflow: bool, learn_entities: bool,
    ) -> list[str]:  # fmt: skip
        """Write a turn's workflow and entities (those `_teaching` says are still to write);
        their keys, each noted first under the stored question's id (forgetting it takes them:
        memory/governance_learned.py; a question forgotten already refuses the note, and
        nothing more is written)."""
        question, answer = task["question"], task["answer"]
        asked, learned = _asked(task), self.memory.governance.learned
        written: list[str] = []
        if learn_workflow:  # not when every step failed: no procedure to offer again
            key = await self._learn_workflow(scope, task, authors)
            if key is None:
                return written
            written.append(key)
            # marked told at once (refused once forgotten, like any note): a run again after
            # the entities failed must not write it back over a memory-page edit or removal
            await learned.note(scope.tenant, asked, [TOLD])
        if learn_entities and mentions_names(f"{question}\n{answer}"):
            try:
                entities = await self.extract_entities(question, answer)
            except Exception as exc:  # delivered again, unless no run comes after this one
                if not last_delivery():
                    raise
                log.warning("entity extraction failed on its last delivery: %s", exc)
                entities = []
            replaced = set(await learned.replaced(scope.tenant, asked)) if asked else set()
            entities = [
                e for e in entities if self.memory.entities.key(scope, e.name) not in replaced
            ]
            if entities:  # those a person's edit replaced are not taught again (an edit's relearn)
                keys = [self.memory.entities.key(scope, e.name) for e in entities]
                if not await learned.note(scope.tenant, asked, keys):
                    return written
                stored = await self.memory.entities.upsert(
                    scope, entities, authors=authors, question=_version(task)
                )
                written += [self.memory.entities.key(scope, e.name) for e in stored]
        return written

    async def _learn_workflow(
        self, scope: Scope, task: dict[str, Any], authors: list[str]
    ) -> str | None:
        """Write a turn's workflow: its QUERY line says the task's text, its key is that of the
        text the turn was asked as (`_retold`: one workflow for the turn, whichever text its
        runs saw). Its key; None when the question was forgotten (the note refused). The
        workflow of a turn that got a 👎 (before or while it is written) is stored rejected:
        never offered again."""
        question, answer, steps = task["question"], task["answer"], task["steps"]
        turn, keyed_by = task.get("turn", ""), task.get("keyed_by", question)
        asked, workflows = _asked(task), self.memory.workflows
        rejected = await self.rejected(scope.tenant, turn)
        taught = workflows.key_for(scope, keyed_by, steps, answer)
        if not await self.memory.governance.learned.note(scope.tenant, asked, [taught]):
            return None
        key = await workflows.add(
            scope, question, steps, answer, authors=authors, turn=turn, rejected=rejected,
            question=asked, keyed_by=keyed_by,
        )  # fmt: skip
        noted = turn and await self.memory.turn_records.set_workflow(scope.tenant, turn, key)
        if noted and not rejected and await self.rejected(scope.tenant, turn):
            await workflows.reject(key)  # a 👎 came meanwhile
        return key

    async def rejected(self, tenant: str, turn: str) -> bool:
        """True when someone gave the turn a 👎."""
        if not turn:
            return False
        try:
            record = await self.memory.turn_records.get(tenant, turn)
        except UnknownTurn:
            return False
        return any(vote.rating < 0 for vote in record.feedback.values())

    async def _asking(self, scope: Scope, task: dict[str, Any]) -> tuple[str, str]:
        """Whether the turn's question is still stored (memory/governance.py forgets it) and,
        for a task that names its text, still says it (an edit on the platform): ASKED,
        EDITED or FORGOTTEN, and the text it says now ("" when forgotten)."""
        asked = task.get("asked")
        if not asked:
            return ASKED, task["question"]  # a task from before questions were named
        seq = asked["seq"]
        stored = (await self.memory.conversation.at(scope, [seq])).get(seq)
        if stored is None or stored.id != asked["id"] or stored.forgotten:
            return FORGOTTEN, ""
        if await self.memory.governance.learned.forgotten(scope.tenant, asked["id"]):
            return FORGOTTEN, ""  # being forgotten: its lessons went first
        if "text" in asked and stored.content != asked["text"]:
            return EDITED, stored.content
        return ASKED, stored.content

    async def extract_entities(self, question: str, answer: str) -> list[Entity]:
        """The entities the model names in the exchange. A failed call, a reply without JSON or
        one cut off raise: the durable task is delivered again, not acked with nothing learned
        (on its last delivery, `_learn` gives up on the entities and keeps the rest)."""
        exchange = f"User: {question[:EXTRACT_CHARS]}\n\nAssistant: {answer[:EXTRACT_CHARS]}"
        reply = await self.llm.chat(
            [
                {"role": "system", "content": ENTITY_INSTRUCTIONS},
                {"role": "user", "content": exchange},
            ]
        )
        if reply.finish_reason == "length":
            raise LLMResponseError("The entity extraction was cut off; it is tried again.")
        data = extract_json(reply.content)
        if isinstance(data, dict):
            data = data.get("entities", [data] if "name" in data else [])
        if not isinstance(data, list):
            return []
        return [
            Entity(name, str(item.get("type") or "other"), str(item.get("description") or ""))
            for item in data
            if isinstance(item, dict)
            and (name := str(item.get("name") or "").strip())
            and str(item.get("description") or "").strip()
        ]


def _retold(task: dict[str, Any], text: str) -> dict[str, Any]:
    """The task as if its question had been asked as `text` (its stored text now): the
    workflow's QUERY line and the entities' exchange say it, and its pieces are that version's.
    Its workflow keeps the key of the text the turn was asked as (`keyed_by`): a run of it
    delivered again after an edit back finds the same record, not a second one."""
    keyed_by = task.get("keyed_by", task["question"])
    return {
        **task,
        "question": text,
        "asked": {**task["asked"], "text": text},
        "keyed_by": keyed_by,
    }


def _succeeded(steps: list[str]) -> bool:
    """Whether any step (`Step.describe`) succeeded."""
    return any(step.endswith("-> success") for step in steps)
