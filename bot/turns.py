"""The platform-neutral turn handler: every adapter (terminal, Slack, Discord) calls this.

Adapters translate a platform event into (tenant, thread_id, user, text) and the reply back
into platform messages; what a turn does, and the `/summarize` and `/expand` commands, live here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from bot.agent import EventCallback, TurnResult
from bot.consolidation import SummaryInProgress
from bot.llm import DeltaCallback, LLMError
from bot.runtime import AgentRuntime
from memory.context import AssembledContext, assemble_context
from memory.keys import InvalidName
from memory.stores.conversation import InvalidMessage
from memory.stores.summary import UnknownSummary

log = logging.getLogger(__name__)


@dataclass
class Reply:
    text: str
    result: TurnResult | None = None


class TurnHandler:
    def __init__(self, runtime: AgentRuntime) -> None:
        self.runtime = runtime
        self._prefetching: set[asyncio.Task] = set()

    def prefetch(self, text: str) -> None:
        """Embed a queued message now, while its thread's earlier turns still run: when its
        turn comes, the question's vector is already in the embedding cache."""

        async def embed() -> None:
            try:
                await self.runtime.memory.embedder.embed([text])
            except Exception as exc:  # the turn will embed it again, or report the error
                log.debug("prefetch failed: %s", exc)

        task = asyncio.create_task(embed())
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def handle(
        self,
        tenant: str,
        thread_id: str,
        user: str,
        text: str,
        on_event: EventCallback | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> Reply:
        """One user message in, one reply out; bad input becomes a reply, not a crash."""
        try:
            result = await self.runtime.agent.run_turn(
                tenant, thread_id, text, on_event=on_event, on_delta=on_delta
            )
        except (InvalidMessage, InvalidName) as exc:
            return Reply(f"I can't take that message: {exc}")
        return Reply(result.answer, result)

    async def summarize(self, tenant: str, thread_id: str) -> str:
        try:
            return await self.runtime.harness.consolidator.summarize_and_store(tenant, thread_id)
        except (SummaryInProgress, LLMError, ValueError) as exc:
            return f"Could not summarize this thread: {exc}"

    async def expand(self, tenant: str, summary_id: str) -> str:
        if not summary_id.strip():
            return "Usage: /expand <summary_id> (the id shown as [Summary ID: ...])"
        try:
            return await self.runtime.harness.consolidator.expand_summary(
                tenant, summary_id.strip()
            )
        except UnknownSummary as exc:
            return str(exc)

    async def context(self, tenant: str, thread_id: str, question: str) -> AssembledContext:
        return await assemble_context(self.runtime.memory, tenant, thread_id, question)
