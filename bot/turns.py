"""The platform-neutral turn handler: every adapter (terminal, Slack, Discord) calls this.

Adapters translate a platform event into a `Scope` and a text, and the reply back into platform
messages; what a turn does, and the `/summarize` and `/expand` commands, live here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from bot.agent import Agent, EventCallback, TurnResult
from bot.consolidation import SummaryInProgress
from bot.harness import FORGOTTEN_QUESTION, AnswerNotSaved, QuestionForgotten
from bot.llm import DeltaCallback, LLMError, failure_kind
from bot.metering import metered
from bot.upkeep import count_thread_usage
from bot.watches import WatchService
from memory.context import AssembledContext, assemble_context
from memory.errors import memory_unavailable
from memory.governance_places import DeletedPlace
from memory.keys import InvalidName
from memory.scope import Scope
from memory.stores.conversation import InvalidMessage, MarkConflict
from memory.stores.summary import UnknownSummary
from memory.stores.turn_records import TurnUsage
from memory.text import clean_text

log = logging.getLogger(__name__)

NO_SUMMARY_MODEL = "Could not summarize this thread: no model is configured to write summaries."
THREAD_CHANGED = (
    "Could not summarize this thread: it changed while I summarized it. Nothing was stored; "
    "try again."
)
# What a slash command that raised says (every adapter's commands: one wording).
COMMAND_MEMORY_DOWN = (
    "My memory (Redis) is unreachable right now, so {command} could not run. Try it again once "
    "Redis is back."
)
COMMAND_FAILED = (
    "Sorry, something went wrong on my side and {command} could not run. Please try again in "
    "a moment."
)


def command_failure(command: str, exc: BaseException) -> str:
    """The reply to a slash command that raised `exc`: memory down is said as such; anything
    else is logged and said as a failure (the person is never left without an answer)."""
    if memory_unavailable(exc):
        log.warning("memory unavailable during %s: %r", command, exc)
        return COMMAND_MEMORY_DOWN.format(command=command)
    log.error("%s failed", command, exc_info=exc)
    return COMMAND_FAILED.format(command=command)


@dataclass
class Reply:
    text: str
    result: TurnResult | None = None
    refused: bool = False  # the message was not taken (invalid, or forgotten): no answer

    @property
    def turn_id(self) -> str:
        """The answered turn's record id (feedback buttons carry it); "" for other replies."""
        return self.result.turn_id if self.result is not None else ""


class TurnHandler:
    def __init__(
        self, agent: Agent, watches: WatchService | None = None, files: Any = None
    ) -> None:
        self.agent = agent
        self.watches = watches  # "watch <topic> weekly" makes a topic watch, not a turn
        self.files = files  # PDFs shared in chat (adapters/shared_files.py's SharedFiles)
        self.memory = agent.harness.memory
        self._prefetching: set[asyncio.Task] = set()

    def prefetch(self, text: str, tenant: str = "", source: str = "") -> None:
        """Embed a queued message now, while its thread's earlier turns still run: when its
        turn comes, the question's vector is already in the embedding cache. A message its
        author edited (or deleted) on the platform meanwhile (`source`: its id there) runs with
        the new text (or not at all): the vectors of this one then go, whether the turn ended
        before or after this."""

        async def embed() -> None:
            try:
                await self.memory.embedder.embed([text])
                edits = self.memory.governance.edits
                change = await edits.change(tenant, source) if source else None
                if change is not None and (change.deleted or change.edited_from(text)):
                    await edits.uncache([text])
            except Exception as exc:  # the turn will embed it again, or report the error
                log.debug("prefetch failed: %s", exc)

        task = asyncio.create_task(embed())
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def handle(
        self,
        scope: Scope,
        text: str,
        on_event: EventCallback | None = None,
        on_delta: DeltaCallback | None = None,
        turn_id: str = "",
        source: str = "",
        rerun: bool = False,
    ) -> Reply:
        """One user message in, one reply out; bad input becomes a reply, not a crash.
        `source`: the platform's id of the message, stored with it (a deletion or edit there
        while the turn ran is caught up by `changed_meanwhile`, which the caller runs after).
        `rerun`: the job ran before (a crash): a question it stored and that was forgotten
        since is not embedded or searched again, let alone answered, nor (its text now a watch
        command: an edit on the platform) does it make a watch."""
        text = clean_text(text)  # before anything encodes it (the model client, the embedder)
        harness = self.agent.harness
        if rerun and turn_id and await harness.forgotten_question(scope, turn_id):
            return Reply(FORGOTTEN_QUESTION)  # a watch command too: it makes no watch
        if self.watches is not None and (made := await self.watches.message(scope, text, turn_id)):
            return Reply(made)
        try:
            result = await self.agent.run_turn(
                scope, text, on_event=on_event, on_delta=on_delta, turn_id=turn_id, source=source
            )
        except (InvalidMessage, InvalidName) as exc:
            return Reply(f"I can't take that message: {exc}", refused=True)
        except QuestionForgotten as exc:  # a re-run after a crash: not answered, just said
            return Reply(str(exc), refused=True)
        except AnswerNotSaved as exc:  # answered, not stored (a restore ran): given, and said
            return Reply(f"{exc.answer}\n\n{exc}")
        return Reply(result.answer, result)

    async def changed_meanwhile(self, scope: Scope, source: str) -> bool:
        """After a turn for the platform's message `source`: if it was deleted or edited there
        (in the last day), the erasure or the edit may have looked before the turn stored it
        (or saved its record), or the turn may have taken over a run that stored the old text
        before it crashed, so it is queued again (durable; a no-op when memory has it already).
        Raises when memory is unreachable: the caller keeps the job and runs this again.
        True when something was queued."""
        tenant = scope.tenant
        change = await self.memory.governance.edits.change(tenant, source)
        if change.deleted:
            await self.message_deleted(tenant, [scope.thread], source)
        elif change.latest is not None:
            await self.message_edited(tenant, {scope.thread: scope.channel}, source, *change.latest)
        return change.deleted or change.latest is not None

    # -- what people change on the platform: durable background work (bot/upkeep.py) -------------

    async def message_deleted(self, tenant: str, threads: list[str], source: str) -> None:
        """A person deleted their message on the platform (`source`: its id there; `threads`:
        where it may be stored): its erasure is queued."""
        await self.agent.harness.upkeep.message_deleted(tenant, threads, source)

    async def message_edited(
        self, tenant: str, places: dict[str, str], source: str, text: str, at: float
    ) -> None:
        """A person edited their message on the platform (`text`: the new text, translated as a
        new message is; `at`: when, so a late retry of an older edit does not win; `places`:
        {thread: its channel} where it may be stored): its following is queued."""
        await self.agent.harness.upkeep.message_edited(tenant, places, source, text, at)

    async def place_deleted(self, place: DeletedPlace) -> None:
        """A channel or thread was deleted on the platform: the erasure of its threads (and its
        watches) is queued."""
        await self.agent.harness.upkeep.place_deleted(place)

    async def summarize(self, scope: Scope) -> str:
        """`/summarize`: what went wrong becomes the reply, but memory down (raised: the caller
        says so). A thread that changed while the model wrote the note (`MarkConflict`: a message
        edited, deleted or erased, or a roll's summary stored meanwhile; nothing stored) is
        summarized again once, from the thread as it is."""
        consolidator = self.agent.harness.consolidator
        if consolidator.llm is None:
            return NO_SUMMARY_MODEL
        try:
            with metered() as meter:
                try:
                    return await consolidator.summarize_and_store(scope)
                except MarkConflict as exc:
                    log.info("summary of %s written again: %s", scope.thread, exc)
                    return await consolidator.summarize_and_store(scope)
        except MarkConflict:
            return THREAD_CHANGED
        except LLMError as exc:  # its kind only: the provider's text goes to the log
            log.warning("summary of %s failed: %s", scope.thread, exc)
            again = " Try again in a moment." if exc.transient else ""
            return f"Could not summarize this thread: {failure_kind(exc)}.{again}"
        except (SummaryInProgress, ValueError) as exc:
            return f"Could not summarize this thread: {exc}"
        finally:  # what the summary cost counts to the thread (unless erased meanwhile)
            usage = TurnUsage(meter.tokens_in, meter.tokens_out, meter.calls)
            await count_thread_usage(self.memory, scope, usage)

    async def expand(self, scope: Scope, summary_id: str) -> str:
        if not summary_id.strip():
            return "Usage: /expand <summary_id> (the id shown as [Summary ID: ...])"
        try:
            return await self.agent.harness.consolidator.expand_summary(scope, summary_id.strip())
        except UnknownSummary as exc:
            return str(exc)

    async def context(self, scope: Scope, question: str) -> AssembledContext:
        return await assemble_context(self.memory, scope, question)
