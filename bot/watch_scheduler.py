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
PAGE = 1000  # due watches read at once
# pages read in one tick: the overdue watches of a platform no running process posts to stay
# in the due index (its processes claim them when they run), and each is read again at every
# tick of the others. Ten pages read past 10 000 of them, which a platform down for a while
# does not reach, while a tick reads no more than that (the old single page hid a Slack watch
# behind a thousand Discord ones)
MAX_PAGES = 10
PLATFORMS = ("slack", "discord")  # the ones with a stream; a terminal watch is run by hand


class WatchScheduler:
    """Queues and claims the due digests of the platforms this process posts to."""

    def __init__(
        self, store: WatchStore, posters: dict[str, Poster],
        stream: Callable[[str], TaskStream], now: Callable[[], float], page: int = PAGE,
        max_pages: int = MAX_PAGES,
    ) -> None:  # fmt: skip
        self.store = store
        self.posters = posters  # shared with the service: `attach` adds to it
        self.stream = stream
        self.now = now
        self.page = page
        self.max_pages = max_pages

    async def queue_due(self) -> list[tuple[str, str]]:
        """Queue the digest of every due watch this process posts, and claim its period for the
        task; returns the (tenant, watch id) claimed here. A watch that is gone, paused or of
        the terminal leaves the due index; one not due yet is indexed again at its time. The
        index is read a page at a time, past the watches left for another platform's processes
        (which stay in it): a thousand overdue Discord watches do not hide a Slack one. At
        most `max_pages` pages a tick (MAX_PAGES); the next tick starts over from the first."""
        now = self.now()
        queued: list[tuple[str, str]] = []
        looked: set[tuple[str, str]] = set()
        offset = 0
        for _ in range(self.max_pages):
            page = await self.store.due(now, limit=self.page, offset=offset)
            if not page:
                break
            staying = 0  # entries of this page still due after it: the next page starts past them
            for tenant, watch_id in page:
                if (tenant, watch_id) in looked or not await self._queue(
                    tenant, watch_id, now, queued
                ):
                    staying += 1
                looked.add((tenant, watch_id))
            offset += staying
        return queued

    async def _queue(
        self, tenant: str, watch_id: str, now: float, queued: list[tuple[str, str]]
    ) -> bool:
        """One due watch handled; False when it stays due in the index (another platform's)."""
        watch = await self.store.get(tenant, watch_id)
        if watch is None or watch.platform not in PLATFORMS or watch.paused:
            await self.store.reindex(None, tenant, watch_id)
            return True
        if watch.platform not in self.posters:
            return False  # a process that posts there claims it (when it runs)
        if watch.next_due > now:
            await self.store.reindex(watch, tenant, watch_id)
            return True
        token, next_due = uuid.uuid4().hex, watch.next_after(now)
        payload = {"tenant": tenant, "watch": watch_id, "due": str(watch.next_due),
                   "next": next_due, "until": now, "token": token}  # fmt: skip
        await self.stream(watch.platform).add(DIGEST, payload)  # first: a crash after it
        if await self.store.claim(watch, now, token, next_due=next_due) is not None:
            queued.append((tenant, watch_id))  # loses nothing (the task claims too)
        return True  # claimed here or by another process: due later (a miss: the next tick)
