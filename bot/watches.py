"""Topic watches in a running bot: made from chat, checked every minute, posted once a period.

`WatchService` is the one object the rest of the bot holds (app/runtime.py makes it, each chat
adapter attaches its `Poster`, bot/turns.py hands it chat messages); it wires the parts, each in
a module with one job:

- bot/watch_texts.py: reading a request ("state-space models weekly cat:cs.LG author:Gu") or a
  chat watch command, and the texts said back;
- bot/watch_places.py: where a watch posts, and the `Poster` through which a platform posts;
- bot/watch_commands.py: `/watch` make, list, pause, resume, remove;
- bot/watch_scheduler.py: the tick (`check`) that claims due periods and queues digest tasks;
- bot/watch_digest.py: one period's digest task, posted once (and `watch run` by hand);
- bot/watch_saves.py: the Save button's task;
- bot/watch_removals.py: the notice to a watch's creator that its deleted place took it.

Digest, Save and removal-notice tasks go on one durable stream per platform, read in each
process that posts to that platform. The names importers use from here are re-exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from bot.background import BackgroundWork, close_all, stop_reading_all
from bot.watch_commands import WatchCommands
from bot.watch_digest import (
    DIGEST,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    RETRY_TELL_AFTER,
    DigestBusy,
    DigestTasks,
    ForeignPlace,
    retry_delay,
)
from bot.watch_places import TERMINAL, Poster, Undeliverable, WatchPlace, place_of
from bot.watch_removals import REMOVED, RemovalNotices
from bot.watch_saves import SAVE, SaveTasks
from bot.watch_scheduler import DEFAULT_CHECK_SECONDS, PLATFORMS, WatchScheduler
from bot.watch_texts import (
    NOT_QUEUED,
    RESERVED,
    UNREACHABLE,
    USAGE,
    WatchRequest,
    chat_command,
    created_text,
    describe,
    parse_period,
    parse_watch,
    saving_text,
    watch_id_of,
)
from memory.digest import DigestBuilder
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream
from memory.stores.watches import WatchStore
from memory.tasks import TaskStream

__all__ = [
    "DEFAULT_CHECK_SECONDS", "DIGEST", "NOT_QUEUED", "PLATFORMS", "RESERVED",
    "RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS", "RETRY_TELL_AFTER", "SAVE", "TERMINAL",
    "UNREACHABLE", "USAGE", "DigestBusy", "ForeignPlace", "Poster", "Undeliverable", "WatchPlace",
    "WatchRequest", "WatchService", "chat_command", "created_text", "describe", "parse_period",
    "parse_watch", "place_of", "retry_delay", "saving_text", "watch_id_of",
]  # fmt: skip


class WatchService:
    """The watches of one process: commands, the scheduler's tick, the digest and save tasks."""

    def __init__(
        self, memory, arxiv: ArxivSource, encoding, *, now: Callable[[], float] = time.time,
        top_n: int = 5, stream_prefix: str = "digests", claim_idle_ms: int = 30_000,
    ) -> None:  # fmt: skip
        self.memory = memory
        self.store = WatchStore(memory.redis)
        if arxiv.pace is None:  # (app/runtime.py gives one) arXiv's 3 s, kept with all processes
            arxiv.pace = SharedPace(memory.redis, arxiv.delay_seconds)
        self.builder = DigestBuilder(
            memory.knowledge_base, self.store, memory.embedder, arxiv, top_n=top_n
        )
        self.arxiv = arxiv
        self.encoding = encoding
        self.now = now
        self.stream_prefix = stream_prefix
        self.claim_idle_ms = claim_idle_ms
        self.posters: dict[str, Poster] = {}  # shared with the parts: `attach` adds to it
        self.workers: dict[str, BackgroundWork] = {}
        self.commands = WatchCommands(self.store, self.posters, now)
        self.scheduler = WatchScheduler(self.store, self.posters, self.stream, now)
        self.digests = DigestTasks(self.store, self.builder, self.posters, now)
        self.saves = SaveTasks(memory, self.store, arxiv, encoding, self.posters, self.stream)
        self.removals = RemovalNotices(memory.governance.places, self.posters, self.stream)
        # what the adapters, the runtime and the terminal call, done by the part whose job it is
        self.create = self.commands.create
        self.command = self.commands.command
        self.message = self.commands.message
        self.list_text = self.commands.list_text
        self.remove_text = self.commands.remove_text
        self.pause_text = self.commands.pause_text
        self.resume_text = self.commands.resume_text
        self.run_digests = self.digests.run
        self.digest = self.digests.digest
        self.preview = self.digests.preview
        self.run_by_hand = self.digests.run_by_hand
        self.queue_save = self.saves.queue
        self.run_saves = self.saves.run
        self.save = self.saves.save
        self.removing = self.removals.queue  # a deleted place's watches (bot/upkeep.py)

    def stream(self, platform: str) -> TaskStream:
        return TaskStream(self.memory.redis, task_stream(f"{self.stream_prefix}-{platform}"))

    def attach(self, platform: str, poster: Poster) -> None:
        """This process posts `platform`'s digests: read its stream (from now if an event loop
        runs, else from the first `check`)."""
        self.posters[platform] = poster
        if platform not in self.workers:
            self.workers[platform] = BackgroundWork(
                self.stream(platform),
                {DIGEST: self.run_digests, SAVE: self.run_saves, REMOVED: self.removals.run},
                claim_idle_ms=self.claim_idle_ms, on_dead_letter={SAVE: self.saves.given_up},
                gone_with_tenant={SAVE},
            )  # fmt: skip
        with contextlib.suppress(RuntimeError):  # no running loop (yet)
            asyncio.get_running_loop()
            self.workers[platform].start()

    async def check(self) -> list[tuple[str, str]]:
        """Queue the digest of every due watch of the platforms this process posts to, and
        claim its period for the task; returns the (tenant, watch id) claimed here. Terminal
        watches are run by hand (`arxivscout watch run`) and leave the due index."""
        if not self.posters:
            return []  # `ask`, `eval`, a worker: this process posts no digest
        for work in self.workers.values():
            work.start()  # if it was not (attached before the loop ran), or it stopped
        return await self.scheduler.queue_due()

    async def stop_reading(self) -> None:
        """Close's first half (a process closing several parts does this for all first)."""
        await stop_reading_all(self.workers.values())

    async def close(self) -> None:
        await close_all(self.workers.values())
        self.workers.clear()
