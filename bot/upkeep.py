"""Memory upkeep after messages are stored: index them for episodic recall, and roll the
thread's recent window into summaries when it grows past its share of the context; and forget
a message its author deleted on Slack or Discord (`message_deleted`).

Each runs as a durable background task (bot/background.py). The bot's turns and `arxivscout
eval locomo` queue indexing and rolls the same way, after the reply, through `after_messages`.
A queued task keeps a copy of its messages: one forgotten meanwhile (memory/governance.py) is
not indexed, and one forgotten while it is indexed is taken out again. A deletion is queued by
the platform's adapter as it acknowledges the event.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, replace
from typing import Any

from bot.background import BackgroundWork
from bot.consolidation import Consolidator, SummaryInProgress
from bot.metering import metered
from memory.context import ContextLimits
from memory.embeddings import background_embedding
from memory.manager import MemoryManager
from memory.scope import PUBLIC, Scope, legacy_audience
from memory.stores.conversation import Message
from memory.stores.episodic import Episode
from memory.stores.turn_records import TurnUsage

EPISODES = "episodes"  # task: index messages for episodic recall
ROLL = "roll"  # task: summarize what left a thread's recent window
DELETED = "deleted-message"  # task: forget a message its author deleted on the platform
BACKFILL = "episodes-backfill"  # the one-time indexing of threads stored before episodic memory
BACKFILL_BATCH = 64


class Upkeep:
    def __init__(
        self,
        memory: MemoryManager,
        consolidator: Consolidator,
        background: BackgroundWork,
        limits: ContextLimits | None = None,
    ) -> None:
        self.memory = memory
        self.consolidator = consolidator
        self.background = background
        self.limits = limits or ContextLimits()

    def handlers(self) -> dict[str, Any]:
        return {
            EPISODES: self.index_episodes,
            ROLL: self.roll_summaries,
            DELETED: self.forget_deleted,
        }

    async def after_messages(self, scope: Scope, messages: list[Message], window: int) -> None:
        """Queue the indexing of `messages`, and a roll if the window (its tokens) is past its
        share: both in Redis before this returns."""
        await self.background.submit(
            EPISODES, {"scope": scope.to_dict(), "messages": [asdict(m) for m in messages]}
        )
        if window > self.limits.window_target:
            await self.background.submit(ROLL, {"scope": scope.to_dict()})

    async def message_deleted(self, tenant: str, threads: list[str], source: str) -> None:
        """Queue the erasure of a message deleted on the platform (`source`: its id there), in
        whichever of `threads` holds it; in Redis before this returns, so the platform's event
        can be acknowledged at once. The deletion is noted first: a turn for the message that
        starts before the erasure runs is then not answered (adapters/spine.py)."""
        await self.memory.governance.note_deleted(tenant, source)
        await self.background.submit(
            DELETED, {"tenant": tenant, "threads": threads, "source": source}
        )

    async def forget_deleted(self, tasks: list[dict[str, Any]]) -> None:
        """Forget messages deleted on the platform (memory/governance.py `forget_deleted`): a
        message not stored (yet) is noted, so its queued turn is not run; run twice, it finds
        only a tombstone the second time."""
        for task in tasks:
            await self.memory.governance.forget_deleted(
                task["tenant"], task["threads"], task["source"]
            )

    async def index_episodes(self, tasks: list[dict[str, Any]]) -> None:
        """Embed messages and add them to episodic memory, one batch per tenant. Nobody waits
        on these vectors: they are background embeddings (big int8 passes, every core). Only
        messages still stored are indexed, and those forgotten meanwhile are deleted again."""
        by_tenant: dict[str, tuple[Scope, list[Episode]]] = {}
        asked: list[tuple[Scope, list[Message]]] = []
        for task in tasks:
            scope = Scope.from_dict(task["scope"])
            messages = [Message(**m) for m in task["messages"]]
            asked.append((scope, messages))
            messages = await self.memory.conversation.still_stored(scope, messages)
            if not messages:
                continue
            before = await self.memory.conversation.timestamps(
                scope, (m.seq - 1 for m in messages if m.seq > 0)
            )
            episodes = [
                replace(episode_of(m, scope.channel), previous_ts=before.get(m.seq - 1))
                for m in messages
            ]
            by_tenant.setdefault(scope.tenant, (scope, []))[1].extend(episodes)
        with background_embedding():
            for scope, episodes in by_tenant.values():
                await self.memory.episodes.add(scope, episodes)  # embeds messages and parts
        for scope, messages in asked:  # a forget that ran meanwhile deleted before we wrote
            kept = {m.id for m in await self.memory.conversation.still_stored(scope, messages)}
            gone = [m.id for m in messages if m.id not in kept]
            if gone:
                await self.memory.episodes.delete(scope, gone)

    async def roll_summaries(self, tasks: list[dict[str, Any]]) -> None:
        """Summarize what left the recent window of each thread named in `tasks`."""
        for scope in {Scope.from_dict(task["scope"]) for task in tasks}:
            with metered() as meter, contextlib.suppress(SummaryInProgress):  # another rolls it
                await self.consolidator.roll(scope, self.limits.window_target)
            usage = TurnUsage(meter.tokens_in, meter.tokens_out, meter.calls)
            await self.memory.turn_records.add_usage(scope, usage)  # counted to the thread

    async def backfill(self) -> int:
        """Queue, once per Redis, the indexing of every message stored before episodic memory
        existed; returns how many messages were queued (0 when done before, or by another
        process now). Re-running it is harmless: an indexed message is only written again."""
        upgrades = self.memory.upgrades
        if await upgrades.done(BACKFILL) or not await upgrades.claim(BACKFILL):
            return 0
        queued = 0
        for tenant in await self.memory.conversation.tenants():
            for thread, _ in await self.memory.conversation.threads(tenant):
                messages = await self.memory.conversation.all(Scope(tenant, thread))
                for message in messages:
                    message.audience = message.audience or legacy_audience(thread)
                for start in range(0, len(messages), BACKFILL_BATCH):
                    batch = messages[start : start + BACKFILL_BATCH]
                    scope = Scope(tenant, thread)
                    await self.background.submit(
                        EPISODES, {"scope": scope.to_dict(), "messages": [asdict(m) for m in batch]}
                    )
                queued += len(messages)
        await upgrades.finish(BACKFILL)
        return queued


def episode_of(message: Message, channel: str) -> Episode:
    """A stored message as episodic memory keeps it."""
    return Episode(
        message.id, message.thread_id, channel, audience=message.audience or PUBLIC,
        author=message.author, author_name=message.author_name, role=message.role,
        text=message.content, ts=message.timestamp, seq=max(message.seq, 0),
    )  # fmt: skip
