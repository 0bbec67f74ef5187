"""The agent loop: assemble, call the model, act; until a final answer, an error, the
iteration cap or the wall-clock timeout. Every ending gives the user a useful reply."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.citations import CitationStream, Source, cite
from bot.harness import Harness, Step
from bot.llm import DeltaCallback, LLMError
from bot.metering import metered
from memory.scope import Scope

log = logging.getLogger(__name__)

StopReason = Literal["final", "error", "max_iterations", "timeout"]


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

    async def _loop(self, scope, prepared, steps, state, on_event, stream):
        messages = prepared.messages
        for iteration in range(1, self.max_iterations + 1):
            state["iterations"] = iteration
            reply = await self.harness.llm.chat(messages, prepared.tools, on_delta=stream)
            if stream is not None:
                await stream.flush()  # the reply's held-back end; the next one starts afresh
            if reply.is_final:
                return reply.content.strip() or "(the model returned an empty answer)", "final"
            messages.append(reply.assistant_message())
            for call in reply.tool_calls:
                await _emit(on_event, AgentEvent("tool_start", call.name, call.arguments))
                output, step = await self.harness.run_tool(scope, call, iteration, prepared.sources)
                steps.append(step)
                await _emit(on_event, AgentEvent("tool_end", call.name, step.status))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        return self._out_of_iterations(steps), "max_iterations"

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
        return (
            f"I could not get an answer from the language model: {exc} Your message is saved; "
            "please try again in a moment." + self._done_so_far(steps)
        )


async def _emit(callback: EventCallback | None, event: AgentEvent) -> None:
    if callback is None:
        return
    result: Any = callback(event)
    if asyncio.iscoroutine(result):
        await result
