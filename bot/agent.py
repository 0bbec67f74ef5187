"""The agent loop: assemble, call the model, act; until a final answer, an error, the
iteration cap or the wall-clock timeout. Every ending gives the user a useful reply."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from bot.citations import CitationStream, Source, cite
from bot.harness import Harness, Prepared, Step
from bot.llm import ChatReply, DeltaCallback, LLMContextTooLong, LLMError, failure_kind
from bot.metering import Meter, metered
from memory.context import ContextSegment
from memory.scope import Scope
from memory.stores.conversation import Message
from memory.tokens import context_window

log = logging.getLogger(__name__)

# A platform's status call failing in passing: its network (Slack's and Discord's clients are
# on aiohttp), a connection reset, a timeout.
PASSING = (aiohttp.ClientError, OSError, TimeoutError)

# "length": the answer stopped at the model's output limit (kept, with a note saying so);
# "filtered": the provider's content filter withheld it; "empty": a final reply with no text.
StopReason = Literal["final", "error", "max_iterations", "timeout", "length", "filtered", "empty"]

CUT_AT_OUTPUT_LIMIT = (
    "\n\n(The answer was cut here: it reached the model's output limit. Ask me to continue, "
    "or to answer more briefly.)"
)
NOTHING_BEFORE_OUTPUT_LIMIT = (
    "The model reached its output limit before it wrote an answer. Try a narrower question."
)
FILTERED = (
    "The model's provider withheld this answer: its content filter flagged it. Your message "
    "is saved; rephrasing the question may help."
)
EMPTY = "The model returned an empty answer. Your message is saved; ask again or rephrase."
TRIMMED = "[... cut to fit the model's context window]"
MIN_CHARS_TO_CUT = 200  # shorter texts are kept whole: halving them saves little
TOOL_RESULT_DROPPED = "[tool result dropped to fit the model's context window; its log keeps it]"


@dataclass
class AgentEvent:
    """Something the user may want to see while the agent works (tool steps)."""

    kind: Literal["tool_start", "tool_end", "compacted"]
    name: str = ""
    detail: str = ""


EventCallback = Callable[[AgentEvent], Awaitable[None] | None]


@dataclass
class TurnResult:
    answer: str
    stop_reason: StopReason
    iterations: int
    steps: list[Step] = field(default_factory=list)
    tools_offered: list[str] = field(default_factory=list)
    citations_removed: int = 0  # citations of passages the model was not shown, taken out
    sources: list[Source] = field(default_factory=list)  # the passages the answer cites
    turn_id: str = ""  # its record's id (memory/stores/turn_records.py): feedback names it


@dataclass
class Agent:
    harness: Harness
    max_iterations: int = 10
    timeout_seconds: float = 300.0

    async def run_turn(
        self,
        scope: Scope,
        question: str,
        on_event: EventCallback | None = None,
        on_delta: DeltaCallback | None = None,
        turn_id: str = "",
        source: str = "",
    ) -> TurnResult:
        """One question of `scope.user` in `scope.thread`, answered. A `turn_id` makes the
        turn's writes idempotent: run again (after a crash), it stores its messages once.
        `source`: the platform's id of the question's message, stored with it."""
        with metered() as meter:  # every model call of the turn, compaction included
            return await self._run_turn(scope, question, on_event, on_delta, turn_id, meter, source)

    async def _run_turn(
        self, scope, question, on_event, on_delta, turn_id, meter, source=""
    ) -> TurnResult:
        prepared = await self.harness.before(scope, question, turn_id, source)
        if prepared.compacted:
            await _emit(on_event, AgentEvent("compacted", detail=f"{prepared.usage_percent:.0f}%"))
        steps: list[Step] = []
        state = {"iterations": 0}
        if (before := await self._answered_before(scope, prepared)) is not None:
            return await self._given_again(scope, prepared, before, meter)
        # What streams is filtered as `cite` filters the answer: no made-up citation is shown.
        stream = CitationStream(prepared.sources, on_delta) if on_delta is not None else None
        try:
            async with asyncio.timeout(self.timeout_seconds):
                answer, reason = await self._loop(scope, prepared, steps, state, on_event, stream)
        except TimeoutError:
            answer, reason = self._timed_out(steps), "timeout"
        except LLMError as exc:
            log.warning("model error in thread %s: %s", scope.thread, exc)
            answer, reason = self._model_failed(exc, steps), "error"
        cited = cite(answer, prepared.sources)  # unshown citations out, the Sources list in
        if cited.removed:
            log.info("thread %s: %d citation(s) of passages not shown removed",
                     scope.thread, cited.removed)  # fmt: skip
        answer = cited.text
        result = TurnResult(
            answer, reason, state["iterations"], steps, prepared.tool_names,
            citations_removed=cited.removed, sources=cited.sources,
        )  # fmt: skip
        result.turn_id = prepared.record_id
        await self.harness.after(
            scope, prepared, steps, answer, usage=meter, stop_reason=reason,
            citations_removed=result.citations_removed, cited=result.sources,
        )  # fmt: skip
        return result

    async def _answered_before(self, scope: Scope, prepared: Prepared) -> Message | None:
        """The answer a run of this turn stored before it died (its question a duplicate):
        given again, not asked of the model anew (the person would see another answer than
        the one memory, the turn record and its 👍/👎 hold). None if none is stored, or it
        was forgotten since. Looked up after `harness.before`, not before it: `after` (the
        record, if the first run died before writing it; the messages' indexing and the roll)
        needs what `before` read (the context, the passages shown, the question as stored). So
        a re-run that cannot embed or compact fails as any turn then does (its reply says
        why); the stored answer stays in the thread, seen by the next turn."""
        asked = prepared.question
        if not (prepared.turn_id and asked is not None and asked.duplicate):
            return None
        once = f"{prepared.turn_id}:answer"
        stored = await self.harness.memory.conversation.appended(scope, once, role="assistant")
        return stored if stored is not None and not stored.forgotten else None

    async def _given_again(
        self, scope: Scope, prepared: Prepared, stored: Message, meter: Meter
    ) -> TurnResult:
        """A stored answer delivered again; its record and upkeep done if the first run did
        not get to them (`after` stores nothing twice). Its citations are kept as stored."""
        reason: Any = str(stored.metadata.get("stop_reason") or "final")
        log.info("thread %s: turn %s answered before; its answer is given again",
                 scope.thread, prepared.turn_id)  # fmt: skip
        result = TurnResult(stored.content, reason, 0, [], prepared.tool_names)
        result.turn_id = prepared.record_id
        await self.harness.after(scope, prepared, [], stored.content, usage=meter,
                                 stop_reason=reason)  # fmt: skip
        return result

    async def _loop(self, scope, prepared, steps, state, on_event, stream):
        messages = prepared.messages
        for iteration in range(1, self.max_iterations + 1):
            state["iterations"] = iteration
            reply = await self._ask(prepared, messages, state, stream)
            if stream is not None:
                await stream.flush()  # the reply's held-back end; the next one starts afresh
            if reply.finish_reason == "content_filter":
                return FILTERED, "filtered"
            if reply.finish_reason == "length":  # any tool call in it is cut too: not run
                text = reply.content.strip()
                ending = text + CUT_AT_OUTPUT_LIMIT if text else NOTHING_BEFORE_OUTPUT_LIMIT
                return ending + self._done_so_far(steps), "length"
            if reply.is_final:  # an empty one is no answer: stored as a failure, not learned
                text = reply.content.strip()
                return (text, "final") if text else (EMPTY + self._done_so_far(steps), "empty")
            messages.append(reply.assistant_message())
            for call in reply.tool_calls:
                await _emit(on_event, AgentEvent("tool_start", call.name, call.arguments))
                output, step = await self.harness.run_tool(
                    scope, call, iteration, prepared.sources, asked=prepared.asked_id
                )
                steps.append(step)
                await _emit(on_event, AgentEvent("tool_end", call.name, step.status))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        return self._out_of_iterations(steps), "max_iterations"

    async def _ask(self, prepared, messages, state, stream) -> ChatReply:
        """One model call. A request the server finds longer than the model's window is sent
        once more with half the memory and the older tool results left out (the harness
        sized it for the window it assumes, which an unknown local model may not have)."""
        try:
            return await self.harness.llm.chat(messages, prepared.tools, on_delta=stream)
        except LLMContextTooLong as exc:
            if state.get("shrunk"):
                raise
            log.warning("context too long for the model, retrying it shrunk: %s", exc)
            state["shrunk"] = True
            shrink(prepared, messages)
            return await self.harness.llm.chat(messages, prepared.tools, on_delta=stream)

    def _done_so_far(self, steps: list[Step]) -> str:
        if not steps:
            return ""
        lines = "\n".join(f"- {s.name}: {s.status} (log {s.log_id})" for s in steps)
        return f"\n\nWhat I did so far:\n{lines}"

    def _out_of_iterations(self, steps: list[Step]) -> str:
        return (
            f"I could not finish this within {self.max_iterations} steps. Try a narrower "
            f"question, or ask me to continue." + self._done_so_far(steps)
        )

    def _timed_out(self, steps: list[Step]) -> str:
        return (
            f"I ran out of time ({self.timeout_seconds:.0f} s) before finishing. Your message is "
            "saved; ask again or narrow the question." + self._done_so_far(steps)
        )

    def _model_failed(self, exc: LLMError, steps: list[Step]) -> str:
        if isinstance(exc, LLMContextTooLong):
            window = context_window(self.harness.memory.model, self.harness.window)
            status = f" (HTTP {exc.status})" if exc.status else ""
            return (
                f"This conversation does not fit the language model's context window{status}, "
                "even with my memory of it cut by half. Your message is saved. If the "
                f"model's window is smaller than the {window:,} tokens I assume, set "
                "ARXIVSCOUT_CONTEXT_WINDOW to it." + self._done_so_far(steps)
            )
        # A refused request (a 4xx other than 429) is refused again: no "try again" for it.
        after = (
            "; please try again in a moment."
            if exc.transient
            else ", but asking again will not help until this is fixed."
        )
        return (  # its kind only: the provider's text (the log has it) may hold a key or URL
            f"I could not get an answer from the language model: {failure_kind(exc)}. Your "
            f"message is saved{after}" + self._done_so_far(steps)
        )


def shrink(prepared: Prepared, messages: list[dict[str, Any]]) -> None:
    """`messages` with half of each memory segment (the newest half of the conversation, the
    first of the others) and only the latest tool results, themselves halved. The prepared
    context itself is left as assembled: the turn's record and upkeep count what it holds."""
    context = prepared.context
    halves = [
        ContextSegment(s.name, (_newer_half if s.name == "Conversation" else _first_half)(s.text),
                       s.tokens)
        for s in context.segments
    ]  # fmt: skip
    messages[1] = {**messages[1], "content": dataclasses.replace(context, segments=halves).render()}
    last_assistant = max(
        (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages)
    )
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            text = str(message.get("content") or "")
            shorter = _first_half(text) if index > last_assistant else TOOL_RESULT_DROPPED
            messages[index] = {**message, "content": shorter}


def _first_half(text: str) -> str:
    """The first half of `text`, ended at a line break when one is near."""
    if len(text) < MIN_CHARS_TO_CUT:
        return text
    kept = text[: len(text) // 2]
    line_end = kept.rfind("\n")
    return f"{kept[:line_end] if line_end > len(kept) // 2 else kept}\n{TRIMMED}"


def _newer_half(text: str) -> str:
    """The segment's heading line, then the second half of the rest (the newer messages)."""
    heading, _, body = text.partition("\n")
    if len(body) < MIN_CHARS_TO_CUT:
        return text
    kept = body[len(body) // 2 :]
    line_start = kept.find("\n")
    if 0 <= line_start < len(kept) // 2:
        kept = kept[line_start + 1 :]
    return f"{heading}\n{TRIMMED}\n{kept}"


async def _emit(callback: EventCallback | None, event: AgentEvent) -> None:
    """A status the platform fails to show is skipped: the answer matters, not the indicator.
    Its network or a timeout failing in passing is noted quietly; anything else (a bug in a
    platform's callback) is logged as a warning with its traceback, the turn going on."""
    if callback is None:
        return
    try:
        result: Any = callback(event)
        if asyncio.iscoroutine(result):
            await result
    except PASSING as exc:
        log.info("a status update (%s) could not be shown (%r); the turn goes on", event.kind, exc)
    except Exception:
        log.warning("a status update (%s) failed; the turn goes on", event.kind, exc_info=True)
