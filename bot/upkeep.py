"""Memory upkeep after messages are stored: index them for episodic recall, and roll the
thread's recent window into summaries when it grows past its share of the context; and forget
a message its author deleted on Slack or Discord (`message_deleted`), every thread of a
channel or thread deleted there (`place_deleted`), and an answer stored in a thread erased
while its turn ran, when the erasure lock was busy then (`answer_erased`).

Each runs as a durable background task (bot/background.py). The bot's turns and `arxivscout
eval locomo` queue indexing and rolls the same way, after the reply, through `after_messages`.
A queued task keeps a copy of its messages: one forgotten meanwhile (memory/governance.py) is
not indexed, and one forgotten while it is indexed is taken out again. A deletion is queued by
the platform's adapter as it acknowledges the event; so is an edit (`message_edited`): the
stored message gets the new text, and is indexed again with it; what its old text taught goes
(memory/governance_learned.py), and the turn's entities are learned again from the new text
and the stored answer (an `ARTIFACTS` task, bot/harness.py `write_artifacts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from bot.background import BackgroundWork
from bot.consolidation import Consolidator, SummaryInProgress
from bot.metering import metered
from memory.context import ContextLimits
from memory.embeddings import background_embedding
from memory.governance_erasure import NotFound
from memory.governance_places import DeletedPlace
from memory.governance_purge import message_texts
from memory.governance_tenants import DEFAULT_KEEP_DAYS, TenantErasures
from memory.governance_tenants import erased_at as tenant_erased_at
from memory.manager import MemoryManager
from memory.scope import PUBLIC, Scope, legacy_audience, scope_of
from memory.stores.conversation import Message, still_holds
from memory.stores.episodic import Episode
from memory.stores.turn_records import TurnUsage
from memory.stores.watches import Watch

EPISODES = "episodes"  # task: index messages for episodic recall
ROLL = "roll"  # task: summarize what left a thread's recent window
DELETED = "deleted-message"  # task: forget a message its author deleted on the platform
DELETED_PLACE = "deleted-place"  # task: forget a channel's or thread's threads, deleted there
ERASED_ANSWER = "forget-thread"  # task: forget an answer stored in a thread erased meanwhile
EDITED = "edited-message"  # task: give a stored message the text its author edited it to
ARTIFACTS = "artifacts"  # task: write a turn's workflow and entities (bot/harness.py)
BACKFILL = "episodes-backfill"  # the one-time indexing of threads stored before episodic memory
BACKFILL_BATCH = 64
BACKFILL_RETRY_SECONDS = 60.0  # a back-fill that failed at start is tried again after this,
BACKFILL_RETRY_MAX_SECONDS = 3600.0  # twice as long after each failure, up to this
UNINSTALLED_CHECK_SECONDS = 60.0  # how often a process erases the tenants due (one ZRANGE)
log = logging.getLogger(__name__)


class Upkeep:
    def __init__(
        self,
        memory: MemoryManager,
        consolidator: Consolidator,
        background: BackgroundWork,
        limits: ContextLimits | None = None,
        removing: Callable[[list[Watch], DeletedPlace], Awaitable[None]] | None = None,
        uninstalled_keep_days: float = DEFAULT_KEEP_DAYS,
    ) -> None:
        self.memory = memory
        self.consolidator = consolidator
        self.background = background
        self.limits = limits or ContextLimits()
        self.removing = removing  # queues the notices of a deleted place's watches
        # tenants that removed the bot, erased days later (memory/governance_tenants.py)
        self.tenants = TenantErasures(memory, uninstalled_keep_days)
        self.backfill_retry_seconds = BACKFILL_RETRY_SECONDS
        self.backfill_retry_max_seconds = BACKFILL_RETRY_MAX_SECONDS
        self._backfill_delay = 0.0  # after a failure, the wait before the next try (0: none)
        self._backfill_due = 0.0  # time.monotonic() of the next try

    def handlers(self) -> dict[str, Any]:
        return {
            EPISODES: self.index_episodes,
            ROLL: self.roll_summaries,
            DELETED: self.forget_deleted,
            DELETED_PLACE: self.forget_deleted_places,
            ERASED_ANSWER: self.forget_erased_answers,
            EDITED: self.follow_edits,
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

    async def place_deleted(self, place: DeletedPlace) -> None:
        """Queue the erasure of a channel or thread deleted on the platform (its threads
        whole, its watches); in Redis before this returns, so the event is acknowledged at once."""
        await self.background.submit(DELETED_PLACE, place.to_dict())

    async def forget_deleted_places(self, tasks: list[dict[str, Any]]) -> None:
        """Forget deleted channels and threads (memory/governance.py `forget_place`); run
        twice, the second finds nothing left. The creators of the watches removed there are
        told (`removing`: bot/watch_removals.py queues each notice before its watch goes)."""
        for task in tasks:
            place = DeletedPlace.from_dict(task)
            tell = None if self.removing is None else partial(self.removing, place=place)
            await self.memory.governance.forget_place(place, tell)

    async def answer_erased(self, scope: Scope, answer_id: str) -> None:
        """Queue the erasure of an answer stored in a thread erased whole while its turn ran,
        when the tenant's erasure lock was too busy to erase it then (bot/harness.py `_kept`):
        in Redis before this returns, so whichever process runs it, the answer goes."""
        await self.background.submit(
            ERASED_ANSWER,
            {"tenant": scope.tenant, "thread": scope.thread, "messages": [answer_id]},
        )

    async def forget_erased_answers(self, tasks: list[dict[str, Any]]) -> None:
        """Forget answers stored in threads erased meanwhile: the thread whole again when it
        holds nothing else; else (its person spoke there since) only the answers. Run twice,
        the second finds them gone; `Busy` leaves the task for a retry."""
        governance = self.memory.governance
        for task in tasks:
            tenant, thread, ids = task["tenant"], task["thread"], set(task["messages"])
            stored = await self.memory.conversation.all(Scope(tenant, thread), forgotten=True)
            answers = [m.id for m in stored if m.id in ids and not m.forgotten]
            if not answers:
                continue  # erased since
            with contextlib.suppress(NotFound):  # an erasure took them meanwhile
                if all(m.id in ids or m.forgotten for m in stored):
                    await governance.forget_thread(tenant, thread)
                else:
                    for answer in answers:
                        await governance.forget_message(tenant, thread, answer)

    async def bot_removed(self, tenant: str) -> float | None:
        """The workspace or server removed the bot: schedule its memory's erasure (when due;
        None for a Discord person's DMs, never erased so)."""
        return await self.tenants.schedule(tenant)

    async def bot_returned(self, *tenants: str) -> list[str]:
        """An event from these tenants: the bot is back, their scheduled erasures are off."""
        return await self.tenants.cancel(tenants)

    async def erase_uninstalled(self) -> list[str]:
        """The tick (every UNINSTALLED_CHECK_SECONDS, in every bot process): erase the tenants
        whose erasure is due; returns them."""
        return await self.tenants.erase_due()

    async def message_edited(
        self, tenant: str, places: dict[str, str], source: str, text: str, at: float
    ) -> None:
        """Queue the following of an edit on the platform (`source`: the message's id there;
        `text`: its new text, as the adapter takes a new message; `at`: when it was edited) in
        whichever thread of `places` ({thread: its channel}) holds it; in Redis before this
        returns. The text is noted first: a turn for the message still queued runs with it
        (adapters/spine.py). The edit of a message deleted on the platform is dropped."""
        if await self.memory.governance.edits.note(tenant, source, text, at):
            task = {"tenant": tenant, "places": places, "source": source, "text": text, "at": at}
            await self.background.submit(EDITED, task)

    async def follow_edits(self, tasks: list[dict[str, Any]]) -> None:
        """Give stored messages their edited text (memory/governance_edits.py), the latest
        one (the task's or the note's), and queue their indexing with it and the learning of
        their turn's entities from it; run twice, the second finds it done."""
        edits = self.memory.governance.edits
        for task in tasks:
            tenant, places, source = task["tenant"], task["places"], task["source"]
            text, at = task["text"], float(task.get("at") or 0)
            noted = await edits.latest(tenant, source)
            if noted is not None and noted[1] >= at:
                text, at = noted
            followed = await edits.follow(tenant, list(places), source, text, at)
            for thread, message in followed.messages:
                scope = Scope(tenant, thread, channel=places.get(thread, ""))
                await self._index_again(scope, [message])
                await self._learn_again(tenant, thread, message)
            await edits.done(tenant, source, followed)

    async def _learn_again(self, tenant: str, thread: str, question: Message) -> None:
        """Queue the learning of an edited question's turn's entities from its new text and
        the stored answer (its workflow was rewritten in place). The task names the text: it
        learns nothing once a newer edit (or a forget) changed the question. A turn whose record
        is not saved yet (still answering) is left to its own task: finding its question edited
        before the turn's workflow was written, that task learns the text it says now, with the
        turn's steps (bot/harness.py `write_artifacts`); so does one that runs after this (its
        workflow only, when this relearn ran first and learned that text's entities)."""
        record = await self.memory.governance.learned.turn_of(tenant, question.id)
        if record is None or record.thread != thread:
            return
        asked = {"id": question.id, "seq": question.seq, "text": question.content}
        await self.background.submit(
            ARTIFACTS,
            {"scope": scope_of(record).to_dict(), "question": question.content,
             "answer": record.answer, "steps": [], "turn": record.id, "asked": asked},
        )  # fmt: skip

    async def _index_again(self, scope: Scope, messages: list[Message]) -> None:
        """Queue the indexing of messages whose text changed (a stored row read back: one
        stored before audiences were kept is given its thread's)."""
        for message in messages:
            message.audience = message.audience or legacy_audience(scope.thread)
        await self.background.submit(
            EPISODES, {"scope": scope.to_dict(), "messages": [asdict(m) for m in messages]}
        )

    async def index_episodes(self, tasks: list[dict[str, Any]]) -> None:
        """Embed messages and add them to episodic memory, one batch per tenant. Nobody waits
        on these vectors: they are background embeddings (big int8 passes, every core). Only
        messages still stored as the task has them are indexed; those forgotten meanwhile, or
        edited once their old text was written, are deleted again (`_take_out`)."""
        by_tenant: dict[str, tuple[Scope, list[Episode]]] = {}
        asked: list[tuple[Scope, list[Message], set[str]]] = []  # and the ids written
        batch = [
            (Scope.from_dict(task["scope"]), [Message(**m) for m in task["messages"]])
            for task in tasks
        ]
        # each message's place and the one before it (its previous_ts): every task's reads
        # go out together, one round trip for the batch rather than one per task
        places = await self._read_places(
            (scope, [m.seq for m in messages] + [m.seq - 1 for m in messages if m.seq > 0])
            for scope, messages in batch
        )
        for (scope, messages), stored in zip(batch, places, strict=True):
            kept = [m for m in messages if still_holds(stored.get(m.seq), m)]
            asked.append((scope, messages, {m.id for m in kept}))
            episodes = [
                replace(episode_of(m, scope.channel), previous_ts=previous_ts(stored, m.seq))
                for m in kept
            ]
            if episodes:
                by_tenant.setdefault(scope.tenant, (scope, []))[1].extend(episodes)
        with background_embedding():
            for scope, episodes in by_tenant.values():
                await self.memory.episodes.add(scope, episodes)  # embeds messages and parts
        # a forget or edit ran meanwhile: before we wrote?
        nows = await self._read_places(
            (scope, [m.seq for m in messages]) for scope, messages, _ in asked
        )
        for (scope, messages, written), now in zip(asked, nows, strict=True):
            gone = [m for m in messages if not still_holds(now.get(m.seq), m)]
            if gone:
                await self._take_out(scope, gone, written, now)

    async def _read_places(
        self, reads: Iterable[tuple[Scope, list[int]]]
    ) -> list[dict[int, Message]]:
        """The thread's messages at these positions (`conversation.at`), for each read."""
        at = self.memory.conversation.at
        return list(await asyncio.gather(*(at(scope, seqs) for scope, seqs in reads)))

    async def _take_out(
        self, scope: Scope, gone: list[Message], written: set[str], now: dict[int, Message]
    ) -> None:
        """Delete the episodic documents of messages forgotten meanwhile, and of those edited
        meanwhile whose old text this task wrote; queue these again with their text as stored
        now (`now`: the thread's messages at their places, read after the write; the delete
        may have taken the documents the edit's own indexing wrote in between:
        memory/governance_edits.py). An edited message not written here is left."""
        edited = {
            m.id: now[m.seq] for m in gone
            if m.seq in now and now[m.seq].id == m.id and not now[m.seq].forgotten
        }  # fmt: skip
        doomed = [m.id for m in gone if m.id not in edited or m.id in written]
        await self.memory.episodes.delete(scope, doomed)
        # what this task embedded (and cached) after the edit or forget took old vectors out
        taken = [m for m in gone if m.id in written]
        await self.memory.governance.edits.uncache(t for m in taken for t in message_texts(m))
        again = [edited[i] for i in doomed if i in edited]
        if again:
            await self._index_again(scope, again)

    async def roll_summaries(self, tasks: list[dict[str, Any]]) -> None:
        """Summarize what left the recent window of each thread named in `tasks`. Its model
        calls are counted also when the roll failed (`count_thread_usage`)."""
        for scope in {Scope.from_dict(task["scope"]) for task in tasks}:
            with metered() as meter:
                try:
                    with contextlib.suppress(SummaryInProgress):  # another rolls it
                        await self.consolidator.roll(scope, self.limits.window_target)
                finally:
                    usage = TurnUsage(meter.tokens_in, meter.tokens_out, meter.calls)
                    await count_thread_usage(self.memory, scope, usage)

    async def backfill(self) -> int:
        """Queue, once per Redis, the indexing of every message stored before episodic memory
        existed; returns how many messages were queued (0 when done before, or by another
        process now). Re-running it is harmless: an indexed message is only written again.
        A failure does not stop the start: it is logged, and the background loop tries again
        after `backfill_retry_seconds`, twice as long after each failure (each try queues again
        what the failed one had queued), until it is done."""
        try:
            return await self._backfill()
        except Exception:
            if not self._backfill_delay:
                self.background.every(self.backfill_retry_seconds, self._retry_backfill)
            self._backfill_failed()
            return 0

    def _backfill_failed(self) -> None:
        """Log the failure being handled, and put the next try off (longer each time)."""
        delay = min(2 * self._backfill_delay, self.backfill_retry_max_seconds)
        self._backfill_delay = delay or self.backfill_retry_seconds
        self._backfill_due = time.monotonic() + self._backfill_delay
        log.exception("back-fill of episodic memory failed; next try in %gs", self._backfill_delay)

    async def _retry_backfill(self) -> None:
        if not self._backfill_delay or time.monotonic() < self._backfill_due:
            return  # done, or not due: nothing to do, not even a read
        try:
            await self._backfill()
        except Exception:
            self._backfill_failed()
            return
        self._backfill_delay = 0.0

    async def _backfill(self) -> int:
        upgrades = self.memory.upgrades
        if await upgrades.done(BACKFILL) or not await upgrades.claim(BACKFILL):
            return 0
        try:
            queued = await self._queue_backfill()
            await upgrades.finish(BACKFILL)
        except BaseException:
            with contextlib.suppress(Exception):  # Redis may be what failed: then it lapses
                await upgrades.release(BACKFILL)  # the next try need not wait an hour
            raise
        return queued

    async def _queue_backfill(self) -> int:
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
        return queued


async def count_thread_usage(memory: MemoryManager, scope: Scope, usage: TurnUsage) -> None:
    """Count a thread's background model calls (a roll, /summarize) to the thread, tenant and
    day; only to the tenant and day when the thread was forgotten meanwhile (its usage keys
    would bring it back), and to none when the whole tenant was erased (its note:
    memory/governance_tenants.py)."""
    if not usage.model_calls:
        return
    if not await memory.redis.exists(memory.conversation.key(scope)):
        if await tenant_erased_at(memory.redis, scope.tenant) is not None:
            return
        scope = Scope(scope.tenant)
    await memory.turn_records.add_usage(scope, usage)


def previous_ts(stored: dict[int, Message], seq: int) -> float | None:
    """The time of the message before position `seq` (None for a thread's first)."""
    before = stored.get(seq - 1) if seq > 0 else None
    return None if before is None else before.timestamp


def episode_of(message: Message, channel: str) -> Episode:
    """A stored message as episodic memory keeps it."""
    return Episode(
        message.id, message.thread_id, channel, audience=message.audience or PUBLIC,
        author=message.author, author_name=message.author_name, role=message.role,
        text=message.content, ts=message.timestamp, seq=max(message.seq, 0),
    )  # fmt: skip
