"""The scheduler's tick: each due watch's period claimed once and queued as a durable digest task.

Every ARXIVSCOUT_WATCH_CHECK_SECONDS, each process with a poster attached queues a `digest` task
for each due watch of the platforms it posts to, then claims the period for the task's token
(memory/stores/watches.py: one token wins among the processes). The task claims again
(bot/watch_digest.py), so a crash between the two loses nothing and a duplicate task does
nothing. Terminal watches are run by hand (`arxivscout watch run`) and leave the due index.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from bot.watch_digest import DIGEST
from bot.watch_places import Poster
from memory.stores.watches import WatchStore
from memory.tasks import TaskStream

DEFAULT_CHECK_SECONDS = 60.0
PLATFORMS = ("slack", "discord")  # the ones with a stream; a terminal watch is run by hand


class WatchScheduler:
    """Queues and claims the due digests of the platforms this process posts to."""

    def __init__(
        self, store: WatchStore, posters: dict[str, Poster],
        stream: Callable[[str], TaskStream], now: Callable[[], float],
    ) -> None:  # fmt: skip
        self.store = store
        self.posters = posters  # shared with the service: `attach` adds to it
        self.stream = stream
        self.now = now

    async def queue_due(self) -> list[tuple[str, str]]:
        """Queue the digest of every due watch this process posts, and claim its period for the
        task; returns the (tenant, watch id) claimed here. A watch that is gone, paused or of
        the terminal leaves the due index; one not due yet is indexed again at its time."""
        now = self.now()
        queued = []
        for tenant, watch_id in await self.store.due(now, limit=1000):
            watch = await self.store.get(tenant, watch_id)
            if watch is None or watch.platform not in PLATFORMS or watch.paused:
                await self.store.reindex(None, tenant, watch_id)
                continue
            if watch.platform not in self.posters:
                continue  # a process that posts there claims it (when it runs)
            if watch.next_due > now:
                await self.store.reindex(watch, tenant, watch_id)
                continue
            token, next_due = uuid.uuid4().hex, watch.next_after(now)
            payload = {"tenant": tenant, "watch": watch_id, "due": str(watch.next_due),
                       "next": next_due, "until": now, "token": token}  # fmt: skip
            await self.stream(watch.platform).add(DIGEST, payload)  # first: a crash after it
            if await self.store.claim(watch, now, token, next_due=next_due) is not None:
                queued.append((tenant, watch_id))  # loses nothing (the task claims too)
        return queued
