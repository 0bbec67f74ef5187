"""Event de-duplication and per-thread ordering, held in Redis so they hold across processes.

Platforms redeliver events (Slack retries anything not acknowledged fast enough) and several
bot processes may serve one workspace. `Deduplicator` lets the first delivery of an event id
through. `ThreadDispatcher` queues jobs per thread in a Redis list; whichever process holds
the thread's lock runs them one at a time in arrival order, while other threads run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from memory.keys import ROOT

log = logging.getLogger(__name__)

DEDUP_TTL_SECONDS = 3600
LOCK_TTL_MS = 30_000

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

Job = dict[str, Any]


class Deduplicator:
    def __init__(self, redis: Redis, ttl: int = DEDUP_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    async def first_time(self, event_id: str) -> bool:
        """True for the first delivery of `event_id`, False for every redelivery."""
        return bool(await self.redis.set(f"{ROOT}:seen:{event_id}", 1, nx=True, ex=self.ttl))


class ThreadDispatcher:
    def __init__(
        self, redis: Redis, run: Callable[[Job], Awaitable[None]], lock_ttl_ms: int = LOCK_TTL_MS
    ) -> None:
        self.redis = redis
        self.run = run
        self.lock_ttl_ms = lock_ttl_ms
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)
        self._tasks: set[asyncio.Task] = set()

    @staticmethod
    def _queue(thread_key: str) -> str:
        return f"{ROOT}:queue:{thread_key}"

    @staticmethod
    def _lock(thread_key: str) -> str:
        return f"{ROOT}:queue-lock:{thread_key}"

    async def submit(self, thread_key: str, job: Job) -> None:
        """Queue a job for its thread and make sure some process is draining that thread."""
        await self.redis.rpush(self._queue(thread_key), json.dumps(job))
        task = asyncio.create_task(self._drain(thread_key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait until this process has no thread to drain (shutdown, tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _drain(self, thread_key: str) -> None:
        queue, lock = self._queue(thread_key), self._lock(thread_key)
        while True:
            token = uuid.uuid4().hex
            if not await self.redis.set(lock, token, nx=True, px=self.lock_ttl_ms):
                return  # the holder drains our job too: it pops until the queue is empty
            keeper = asyncio.create_task(self._keep(lock, token))
            try:
                while (raw := await self.redis.lpop(queue)) is not None:
                    await self._run_one(json.loads(raw))
            finally:
                keeper.cancel()
                await self._release(keys=[lock], args=[token])
            # a job pushed after our last pop but before the release would wait forever
            if not await self.redis.llen(queue):
                return

    async def _keep(self, lock: str, token: str) -> None:
        """Renew the lock while a long turn runs, so no other process starts the thread."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.lock_ttl_ms / 3000)
                await self._renew(keys=[lock], args=[token, self.lock_ttl_ms])

    async def _run_one(self, job: Job) -> None:
        try:
            await self.run(job)
        except Exception:
            log.exception("job failed: %s", {k: job.get(k) for k in ("thread_id", "event_id")})
