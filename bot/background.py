"""Work that must not delay replies (writing workflows and entities), run by a few workers.

The workers give way to turns being prepared: while any turn assembles its context, queued
jobs wait (up to `max_wait`). In a burst of messages every turn is prepared first, and the jobs
then use the time the turns spend waiting for the model, instead of competing with them for
the CPU and the embedding model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from typing import Any

log = logging.getLogger(__name__)


class BackgroundWork:
    def __init__(self, workers: int = 4, max_wait: float = 10.0) -> None:
        self.workers = workers
        self.max_wait = max_wait
        self._jobs: asyncio.Queue | None = None
        self._tasks: list[asyncio.Task] = []
        self._preparing = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Mark a turn being prepared: background jobs wait until no turn is."""
        self._preparing += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self._preparing -= 1
            if not self._preparing:
                self._quiet.set()

    def submit(self, job: Coroutine[Any, Any, Any]) -> None:
        if self._jobs is None:
            self._jobs = asyncio.Queue()
            self._tasks = [asyncio.create_task(self._work(self._jobs)) for _ in range(self.workers)]
        self._jobs.put_nowait(job)

    async def _work(self, jobs: asyncio.Queue) -> None:
        while True:
            job = await jobs.get()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.max_wait):
                        await self._quiet.wait()
                await job
            except Exception:  # each job logs its own failures; a worker never dies
                log.exception("background job failed")
            finally:
                jobs.task_done()

    async def drain(self) -> None:
        """Wait until every queued job is done (before shutdown, and in tests)."""
        if self._jobs is not None:
            await self._jobs.join()

    async def close(self) -> None:
        await self.drain()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks, self._jobs = [], None
