"""The platform spine: what happens to a message between a platform event and the reply.

A platform adapter only translates: it reads its events into `Job`s (a `Scope`, the text, and
where to reply in the platform's own terms), shows status while a turn runs, and sends parts.
Everything else happens here, the same way for every platform:

    submit: de-duplicate -> prefetch the question's embedding -> the thread's queue in Redis
    drain:  one job at a time per thread (across processes) -> run the turn or the command
    run:    answer -> split to the platform's size -> send; any failure -> the one failure reply
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from adapters.text import split_message
from bot.agent import AgentEvent
from bot.turns import TurnHandler
from memory.scope import Scope

log = logging.getLogger(__name__)

LOCK_TTL_MS = 30_000
FAILURE = (
    "Sorry, something went wrong on my side and I could not answer this. Your message is "
    "saved; please try again in a moment."
)

JobKind = Literal["turn", "summarize"]


@dataclass
class Job:
    """One thing to do in one thread: answer a message, or summarize the thread."""

    kind: JobKind
    scope: Scope
    text: str = ""
    event_id: str = ""  # the platform's id of the event, for de-duplication
    reply: dict[str, Any] = field(default_factory=dict)  # where to answer, in platform terms

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "scope": self.scope.to_dict()}, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str) -> Job:
        data = json.loads(raw)
        return cls(**{**data, "scope": Scope.from_dict(data["scope"])})


class Status:
    """What a person sees while a turn runs; a platform shows what it can of it."""

    async def event(self, event: AgentEvent) -> None:
        """A tool started or finished, or older messages were compacted."""

    async def delta(self, piece: str) -> None:
        """A piece of the answer as the model writes it."""


class Platform(ABC):
    """How one platform shows status and sends messages; `Pipeline` does the rest."""

    name: ClassVar[str]
    limit: ClassVar[int]  # characters in one message
    streams: ClassVar[bool] = False  # whether `Status.delta` shows anything

    def render(self, text: str) -> str:
        """The answer as this platform's messages should carry it (Markdown by default)."""
        return text

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        """Shown while `job` runs (a placeholder, a typing indicator)."""
        yield Status()

    @abstractmethod
    async def send(self, job: Job, status: Status, parts: list[str]) -> None:
        """Deliver the answer, already split to `limit`, where `job.reply` says."""


class Pipeline:
    """De-duplication, per-thread ordering, the turn, splitting, sending, failure replies."""

    def __init__(self, platform: Platform, handler: TurnHandler, lock_ttl_ms: int = LOCK_TTL_MS):
        self.platform = platform
        self.handler = handler
        self.memory = handler.memory
        self.lock_ttl_ms = lock_ttl_ms
        self._draining: set[asyncio.Task] = set()

    async def submit(self, job: Job) -> bool:
        """Queue a job unless its event was taken before; False for a redelivery."""
        if job.event_id and not await self.memory.events.first_time(
            f"{self.platform.name}:{job.event_id}"
        ):
            return False
        if job.kind == "turn":
            self.handler.prefetch(job.text)
        await self.memory.turns.push(job.scope, job.to_json())
        task = asyncio.create_task(self._drain(job.scope))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)
        return True

    async def run(self, job: Job) -> None:
        """Run one job now and deliver its outcome: an answer, or the failure reply."""
        async with self.platform.working(job) as status:
            try:
                text = await self._outcome(job, status)
            except Exception:
                log.exception("%s failed in thread %s", job.kind, job.scope.thread)
                text = FAILURE
            parts = split_message(self.platform.render(text), self.platform.limit)
            await self.platform.send(job, status, parts or ["(no answer)"])

    async def _outcome(self, job: Job, status: Status) -> str:
        if job.kind == "summarize":
            return await self.handler.summarize(job.scope)
        on_delta = status.delta if self.platform.streams else None
        reply = await self.handler.handle(job.scope, job.text, status.event, on_delta)
        return reply.text

    async def wait_idle(self) -> None:
        """Wait until this process has no thread to drain (shutdown, tests, benchmarks)."""
        while self._draining:
            await asyncio.gather(*list(self._draining), return_exceptions=True)

    async def _drain(self, scope: Scope) -> None:
        """Run the thread's queued jobs while holding its lock; another process holding it
        runs ours too, since it pops until the queue is empty."""
        turns = self.memory.turns
        while True:
            token = uuid.uuid4().hex
            if not await turns.lock(scope, token, self.lock_ttl_ms):
                return
            keeper = asyncio.create_task(self._keep(scope, token))
            try:
                while (raw := await turns.pop(scope)) is not None:
                    await self._run_queued(raw)
            finally:
                keeper.cancel()
                await turns.unlock(scope, token)
            # a job pushed after our last pop but before the unlock would wait forever
            if not await turns.length(scope):
                return

    async def _keep(self, scope: Scope, token: str) -> None:
        """Renew the lock while a long turn runs, so no other process starts the thread."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.lock_ttl_ms / 3000)
                await self.memory.turns.renew(scope, token, self.lock_ttl_ms)

    async def _run_queued(self, raw: str) -> None:
        try:
            await self.run(Job.from_json(raw))
        except Exception:
            log.exception("job could not be delivered: %s", raw[:200])
