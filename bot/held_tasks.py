"""The tasks a process's background work holds: read, not yet acknowledged (bot/background.py).

From the moment they are read until they are acknowledged, a process keeps its tasks alive
(their idle time restarted every third of `claim_idle_ms`), so a long task, or one waiting for a
free worker, is not taken over and run twice; `max_run_ms` after its handler started that stops,
and a hung handler's tasks go to whoever claims them. (Tasks waiting for a worker are kept while
some batch in hand is within its max run; when all are past it, the waiting ones go too.) Those
that close() leaves unstarted are handed back with their delivery unspent.
"""

from __future__ import annotations

import asyncio
import logging

from memory.tasks import Task, TaskStream

log = logging.getLogger(__name__)

GIVE_BACK_IDLE_MS = 86_400_000  # how idle a task handed back on close looks: claimable at once


class HeldTasks:
    """The tasks read and not yet acknowledged, kept alive until they are let go."""

    def __init__(self, stream: TaskStream, claim_idle_ms: int, max_run_ms: int) -> None:
        self.stream = stream
        self.claim_idle_ms = claim_idle_ms
        self.max_run_ms = max_run_ms
        # Read, not yet acknowledged: since when its handler runs (None: waiting for a worker).
        self._held: dict[str, tuple[Task, float | None]] = {}
        self._unstarted: list[Task] = []  # read, left unrun by close(): handed back
        self._cut_short: list[Task] = []  # their run cut short by a cancelled close(): too

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._held

    def hold(self, tasks: list[Task], *, running: bool = False) -> None:
        """Keep `tasks` alive: waiting for a worker, or `running` (from now, up to max_run_ms)."""
        since = asyncio.get_running_loop().time() if running else None
        self._held.update((t.id, (t, since)) for t in tasks)

    def leave_unstarted(self, tasks: list[Task], *, ran: bool = False) -> None:
        """Closing: `tasks` will not start (`ran`: their run began and was cut short by a
        cancelled close, their started mark to go); held until `hand_back` gives them back."""
        if ran:
            self._cut_short += tasks
        else:
            self._unstarted += tasks

    async def started(self, tasks: list[Task]) -> None:
        """Their handler starts now: recorded in Redis (a claim past the last delivery knows
        a run began), and max_run_ms counts from here, not from when they were read (a batch
        that waited long for a worker gets its full run)."""
        await self.stream.mark_started(tasks)
        now = asyncio.get_running_loop().time()
        self._held.update((t.id, (t, now)) for t in tasks if t.id in self._held)

    def within_run(self, tasks: list[Task]) -> list[Task]:
        """Those of `tasks` still held and not run past max_run_ms (not taken for hung): a
        handler that hangs until close() is cancelled is not given back a delivery on every
        deploy, never to be buried."""
        now, limit = asyncio.get_running_loop().time(), self.max_run_ms / 1000
        return [
            task for task, since in (self._held[t.id] for t in tasks if t.id in self._held)
            if since is None or now - since < limit
        ]  # fmt: skip

    def release(self, tasks: list[Task]) -> None:
        for task in tasks:
            self._held.pop(task.id, None)

    async def hand_back(self) -> None:
        """Give back what close() left unrun: their read's delivery taken back, claimable by
        any process at once (those cut short without their started mark, or the next claim,
        back on that delivery, would take their run for one that never ended and bury them).
        Redis failing leaves them pending, claimed later as they were. The cut short go first:
        should the rest fail or run out of time, none keeps a started mark on a delivery
        given back."""
        tasks, self._unstarted = self._unstarted, []
        cut_short, self._cut_short = self._cut_short, []
        if not tasks and not cut_short:
            return
        idle_ms = max(GIVE_BACK_IDLE_MS, self.claim_idle_ms)
        try:
            given = await self.stream.give_back(cut_short, idle_ms, ran=True)
            given += await self.stream.give_back(tasks, idle_ms)
        except Exception:
            log.warning("background: could not hand back %d tasks (%d unstarted, %d cut short)",
                        len(tasks) + len(cut_short), len(tasks), len(cut_short))  # fmt: skip
        else:
            if given:
                log.info("background: handed back %d tasks (%d unstarted, %d cut short)",
                         given, len(tasks), len(cut_short))  # fmt: skip
        finally:  # no longer ours to keep alive
            self.release([*tasks, *cut_short])

    async def keep_alive(self) -> None:
        """Every third of claim_idle_ms, restart the idle time of the tasks this process holds
        (read, not yet acknowledged: waiting for a worker, or run for less than max_run_ms):
        nobody claims them meanwhile."""
        beat, limit = self.claim_idle_ms / 3000, self.max_run_ms / 1000
        while True:
            await asyncio.sleep(beat)
            now = asyncio.get_running_loop().time()
            running = [now - since for _, since in self._held.values() if since is not None]
            # Waiting tasks wait for a worker to come free: not when every batch that holds
            # one is past its max run (hung): then they go to whoever claims them too.
            waiting_kept = not running or min(running) < limit
            held = [
                t
                for t, since in self._held.values()
                if (since is None and waiting_kept) or (since is not None and now - since < limit)
            ]
            try:
                await self.stream.keep_alive(held)
            except Exception:  # Redis away: they may be claimed elsewhere, and run twice
                log.warning("background: could not keep %d tasks alive", len(held))
