"""The agent loop: assemble, call the model, act; until a final answer, an error, the
iteration cap or the wall-clock timeout. Every ending gives the user a useful reply."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.citations import add_citations, sources_from_passages, sources_from_text
from bot.harness import Harness, Step
from bot.llm import DeltaCallback, LLMError
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
    ) -> TurnResult:
        """One question of `scope.user` in `scope.thread`, answered. A `turn_id` makes the
        turn's writes idempotent: run again (after a crash), it stores its messages once."""
        prepared = await self.harness.before(scope, question, turn_id)
        if prepared.compacted:
            await _emit(on_event, AgentEvent("compacted", detail=f"{prepared.usage_percent:.0f}%"))
        steps: list[Step] = []
        state = {"iterations": 0}
        try:
            async with asyncio.timeout(self.timeout_seconds):
                answer, reason = await self._loop(scope, prepared, steps, state, on_event, on_delta)
        except TimeoutError:
            answer, reason = self._timed_out(steps), "timeout"
        except LLMError as exc:
            log.warning("model error in thread %s: %s", scope.thread, exc)
            answer, reason = self._model_failed(exc, steps), "error"
        sources = sources_from_passages(prepared.context.passages)
        for message in prepared.messages:
            if message["role"] == "tool":
                sources += sources_from_text(message["content"])
        answer = add_citations(answer, sources)
        await self.harness.after(scope, prepared, steps, answer, stop_reason=reason)
        return TurnResult(answer, reason, state["iterations"], steps, prepared.tool_names)

    async def _loop(self, scope, prepared, steps, state, on_event, on_delta):
        messages = prepared.messages
        for iteration in range(1, self.max_iterations + 1):
            state["iterations"] = iteration
            reply = await self.harness.llm.chat(messages, prepared.tools, on_delta=on_delta)
            if reply.is_final:
                return reply.content.strip() or "(the model returned an empty answer)", "final"
            messages.append(reply.assistant_message())
            for call in reply.tool_calls:
                await _emit(on_event, AgentEvent("tool_start", call.name, call.arguments))
                output, step = await self.harness.run_tool(scope, call, iteration)
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
