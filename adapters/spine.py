"""The platform spine: what happens to a message between a platform event and the reply.

A platform adapter only translates: it reads its events into `Job`s (a `Scope`, the text, and
where to reply in the platform's own terms), shows status while a turn runs, and sends parts.
Everything else happens here, the same way for every platform:

    submit: de-duplicate -> prefetch the question's embedding -> the thread's queue in Redis
    drain:  one job at a time per thread (across processes) -> run the turn or the command
    run:    answer -> split to the platform's size -> send; any failure -> the one failure reply

Jobs are delivered at least once and answered exactly once: a job stays in its thread's
running slot (with its progress) until delivered, under a lease its process renews; when a
process dies, any live one takes the thread over (`Pipeline.start`), and a delivered job is
recorded so a re-run or a platform's retry never answers twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import aiohttp
import openai

from adapters.text import split_for_delivery
from bot.agent import AgentEvent
from bot.harness import question_once
from bot.turns import TurnHandler
from memory.coordination import Taken
from memory.embeddings import EmbeddingError
from memory.errors import PASSING_ERRORS, error_chain, in_passing, memory_full, memory_unavailable
from memory.governance_edits import Change
from memory.scope import Scope
from memory.text import clean_text

log = logging.getLogger(__name__)

PROVIDERS = ("openai", "httpx", "aiohttp")  # whose error text is not said in a reply

LEASE_MS = 15_000  # renewed every 5 s; lapses this long after its process died
RECOVER_EVERY_SECONDS = 5.0  # how often a process looks for threads whose lease lapsed
SHUTDOWN_GRACE_SECONDS = 25.0  # what a stopping process gives running turns to finish
SUBMIT_TIMEOUT_SECONDS = 4.0  # an unreachable memory is reported within 5 s
# A job the platform failed in passing (Slack down for a while) runs again after a growing
# pause: RETRY_PAUSE_SECONDS times each step, 2 s, 10 s, 30 s, 1 min, 2 min (under 4 minutes in
# all), the job kept in its thread's running slot meanwhile; it is given up only after that.
RETRY_PAUSE_SECONDS = 2.0
RETRY_BACKOFF = (1, 5, 15, 30, 60)
# a job that keeps killing its process is given up after this many runs; runs ended by a
# shutdown, a lost lease, memory down or the platform in passing are not counted ("spared")
MAX_ATTEMPTS = 3

# A failed job's reply: what failed, then whether the message is kept (a turn stores its
# question after embedding it and reading the memory); a job that keeps nothing of the
# person's (a /summarize) only says to try again.
SAVED = "Your message is saved; please try again in a moment."
UNSAVED = "Your message was not saved; please send it again in a moment."
AGAIN = "Please try again in a moment."
WENT_WRONG = "Sorry, something went wrong on my side and I could not answer this."
FAILURE = f"{WENT_WRONG} {SAVED}"
NOT_SAVED = f"{WENT_WRONG} {UNSAVED}"
NOT_DONE = f"{WENT_WRONG} {AGAIN}"
# the embedding service in passing (no connection, a timeout, 429, 5xx), or its setup
EMBEDDINGS_DOWN = (
    "Sorry, I could not reach the embedding model ({cause}), so I could not answer this."
)
EMBEDDINGS_BROKEN = (
    "Sorry, the embedding model failed ({cause}), so I could not answer this. The bot's "
    "operator should check its embedding settings (ARXIVSCOUT_EMBEDDINGS, the model's name, "
    "ARXIVSCOUT_EMBEDDING_DIMS, the API key, the model installed). {saved}"
)
SAVED_TILL_FIXED = "Your message is saved; ask again once that is fixed."
UNSAVED_TILL_FIXED = "Your message was not saved; send it again once that is fixed."
AGAIN_TILL_FIXED = "Please try again once that is fixed."
MEMORY_DOWN = (
    "My memory (Redis) is unreachable right now, so I cannot answer yet. Your message is "
    "kept: I will answer here as soon as my memory is back."
)
NOT_TAKEN = (
    "My memory (Redis) is unreachable right now. I will answer this as soon as it is back; "
    "if I have not within a few minutes, please send it again."
)
GAVE_UP = (
    "Sorry, I tried to answer this several times and failed each time. Your message is "
    "saved; please rephrase it or try again later."
)
GAVE_UP_UNSAVED = (
    "Sorry, I tried to answer this several times and failed each time. Your message was "
    "not saved; please send it again later."
)
GAVE_UP_AGAIN = (
    "Sorry, I tried to do this several times and failed each time; please try again later."
)
DELETED_UNANSWERED = "Your message was deleted; I did not answer it."
NOT_SHOWN = (
    "Sorry, I could not post an answer here, so I did not answer this message. Please ask "
    "again elsewhere (or in a direct message with me)."
)
REST_UNSENT = (
    "Sorry, I could not send the rest of this answer. Your message is saved; please ask "
    "again to see the answer in full."
)
REST_UNSENT_AGAIN = "Sorry, I could not send the rest of this; please try again to see it in full."

JobKind = Literal["turn", "summarize"]
Save = Callable[[], Awaitable[object]]


class MemoryUnavailable(RuntimeError):
    """A job could not be queued because Redis is unreachable (the person was told)."""


class LeaseLost(RuntimeError):
    """The thread's lease lapsed while a job ran (memory restarted, or was out longer than the
    lease): another run may hold the job now, so this one stops and leaves it to that one."""


def not_queued_for_now(exc: BaseException) -> bool:
    """True when taking a message failed only because the memory is unreachable: the message
    can be taken again once it is back (by the platform's redelivery, or by the adapter)."""
    return isinstance(exc, MemoryUnavailable) or memory_unavailable(exc)


@contextlib.contextmanager
def unavailable_raised() -> Iterator[None]:
    """Queueing a platform's event: the memory unreachable is raised as MemoryUnavailable
    (Slack is answered 503 and sends the event again); any other error as it is."""
    try:
        yield
    except Exception as exc:
        if memory_unavailable(exc) and not isinstance(exc, MemoryUnavailable):
            raise MemoryUnavailable(str(exc)) from exc
        raise


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Job:
    """One thing to do in one thread: answer a message, or summarize the thread.

    `progress` is what a run has done so far (the placeholder it posted, the answer, how many
    parts were sent); the pipeline saves it in Redis, so a re-run after a crash picks up there
    instead of answering twice."""

    kind: JobKind
    scope: Scope
    text: str = ""
    event_id: str = ""  # the platform's id of the event, for de-duplication
    reply: dict[str, Any] = field(default_factory=dict)  # where to answer, in platform terms
    id: str = field(default_factory=_new_id)
    source: str = ""  # the platform's id of the person's message: a deletion there finds it
    progress: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.text = clean_text(self.text)  # a lone surrogate cannot even be queued

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "scope": self.scope.to_dict()}, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str) -> Job:
        """A queued job; fields this version does not know (queued by a newer process during
        a rolling deploy) are left out rather than failing the thread's queue."""
        data = json.loads(raw)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "scope": Scope.from_dict(data["scope"])})


# whether the job this task runs (`Pipeline.run`) may run again: on its last run a platform
# failing in passing where it can go on (Slack: a stream it could not stop) goes on, the
# answer shown as it can be, rather than raise and have the person told it gave up
may_run_again: ContextVar[bool] = ContextVar("may_run_again", default=False)


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
        """Shown while `job` runs (a placeholder, a typing indicator). What it posts that a
        re-run should reuse, it records in `job.progress` (saved once this yields)."""
        yield Status()

    @abstractmethod
    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        """Deliver part `index` of the answer (already split to `limit`) where `job.reply`
        says. Part 0 may replace what `working` showed."""

    @abstractmethod
    async def notice(self, job: Job, text: str) -> None:
        """Tell the person something outside a turn (their message could not be queued)."""

    async def withdraw(self, job: Job, text: str) -> None:
        """Replace what a run that died left showing (`job.progress`) with `text`, its
        message deleted: never posted anew (that would ping the thread for nothing), nothing
        said if it is gone. Nothing by default (no placeholder)."""
        return

    def passing(self, exc: BaseException) -> bool:
        """True when `exc` is a passing failure of the platform (the network, a timeout, its
        server's own error): the job stays queued and runs again after a growing pause
        (RETRY_BACKOFF), then is given up."""
        return isinstance(exc, (TimeoutError, ConnectionError, aiohttp.ClientError))

    def refused(self, exc: BaseException) -> bool:
        """True when `exc` is the platform refusing for good to show the turn where it was
        asked (an archived channel, the bot removed): the person is told NOT_SHOWN if nothing
        was sent. Anything else (a bug, memory's own error) is only logged. False by default."""
        return False


@contextlib.asynccontextmanager
async def if_shown(indicator: contextlib.AbstractAsyncContextManager[Any]) -> AsyncIterator[None]:
    """A typing indicator or the like: one that fails to show does not stop the turn."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(indicator)
        except Exception as exc:
            log.info("an indicator could not be shown (%s); the turn goes on", exc)
        yield


class Pipeline:
    """De-duplication, per-thread ordering, the turn, splitting, sending, failure replies,
    and taking over the threads of processes that died."""

    def __init__(self, platform: Platform, handler: TurnHandler, lease_ms: int = LEASE_MS):
        self.platform = platform
        self.handler = handler
        self.memory = handler.memory
        self.lease_ms = lease_ms
        self.recover_every = RECOVER_EVERY_SECONDS
        self.retry_pause = RETRY_PAUSE_SECONDS
        self._draining: set[asyncio.Task] = set()
        self._recovering: asyncio.Task | None = None
        self._stopping = False
        self._stopped = asyncio.Event()  # ends a drain's pause before a job runs again
        # job id -> its run that outside causes ended (memory down, a lost lease), not yet
        # marked spared in Redis: the next run here marks it, if that was the run saved last
        self._spared: dict[str, int] = {}

    # -- taking jobs -----------------------------------------------------------------------

    async def submit(self, job: Job, notify: bool = True) -> bool:
        """Queue a job unless its event was taken before; False for a redelivery. Raises
        `MemoryUnavailable` when Redis cannot be reached (after telling the person, if
        `notify`), so the platform can ask for a redelivery."""
        if job.kind == "turn":
            self.handler.prefetch(job.text, job.scope.tenant, job.source)
        try:
            async with asyncio.timeout(SUBMIT_TIMEOUT_SECONDS):
                queued = await self.memory.turns.push(
                    job.scope, job.to_json(), job.event_id, watch=self.platform.name
                )
        except Exception as exc:
            if not (memory_unavailable(exc) or isinstance(exc, TimeoutError)):
                raise
            log.warning("memory unavailable; %s in %s not queued", job.kind, job.scope.thread)
            if notify:
                await self._notice(job, NOT_TAKEN)
            raise MemoryUnavailable(str(exc)) from exc
        if queued:
            self.start()
            self._spawn(job.scope)
        return queued

    def start(self) -> None:
        """Look for threads whose lease lapsed (a process died) and run them; idempotent."""
        if self._recovering is None or self._recovering.done():
            self._recovering = asyncio.create_task(self._recover())

    async def _recover(self) -> None:
        while not self._stopping:
            try:
                for scope in await self.memory.turns.busy(self.platform.name):
                    if not await self.memory.turns.leased(scope):
                        self._spawn(scope)
            except Exception as exc:  # memory down: look again later
                log.debug("recovery scan failed: %s", exc)
            await asyncio.sleep(self.recover_every)

    def _spawn(self, scope: Scope) -> None:
        if self._stopping:
            return  # a live process takes it (it stays queued in Redis)
        task = asyncio.create_task(self._drain_safely(scope))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    # -- running jobs ----------------------------------------------------------------------

    async def _drain_safely(self, scope: Scope) -> None:
        try:
            await self._drain(scope)
        except Exception as exc:  # the jobs stay in Redis; the lease lapses; recovery retries
            log.warning("draining %s stopped (%s); it will be retried", scope.thread, exc)

    async def _drain(self, scope: Scope) -> None:
        """Run the thread's jobs while holding its lease; jobs pushed by other processes
        meanwhile are run too, since it takes until the queue is empty."""
        turns, drain = self.memory.turns, asyncio.current_task()
        while not self._stopping:
            token = uuid.uuid4().hex
            if not await turns.lease(scope, token, self.lease_ms):
                return
            slot = _Slot()
            keeper = asyncio.create_task(self._keep(scope, token, slot, drain))
            try:
                while not self._stopping and (taken := await turns.take(scope, token)):
                    if (pause := await self._run_taken(scope, token, taken, slot)) is not None:
                        await self._pause(pause)  # still running: taken again
                        # saved again: a memory that lost its data meanwhile gets it back
                        await self._kept(scope, token, slot, slot.written)
            except asyncio.CancelledError:  # shutdown (or the lease lost): run again from here
                await asyncio.shield(turns.hand_back(scope, token))
                raise
            finally:
                keeper.cancel()
            if not await turns.release(scope, token):
                return

    async def _pause(self, seconds: float) -> None:
        """Wait before a job the platform failed runs again; a shutdown ends the wait (the
        job stays in the running slot, the lease released: a live process takes it over)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def _keep(
        self, scope: Scope, token: str, slot: _Slot, drain: asyncio.Task | None
    ) -> None:
        """Renew the lease while a long turn runs, so no other process takes the thread. A
        renewal refused (another run took the thread over while memory was out) stops the
        drain: the job is still in Redis, run again from there. A lease gone with the
        memory's data is taken again (memory/coordination.py `TurnQueue.keep`): no other run has the job."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.lease_ms / 3000)
                try:
                    renewed = await self._kept(scope, token, slot)
                except Exception:  # a blip: the next renewal may work
                    continue
                if not renewed:
                    log.warning("the lease on %s was lost; its run stops", scope.thread)
                    if drain is not None:
                        drain.cancel()
                    return

    async def _kept(self, scope: Scope, token: str, slot: _Slot, progress: str = "") -> bool:
        """Renew the lease (saving `progress`, if given): a lease the memory forgot is taken
        back with the job this run last wrote, which is queued again if another run took the
        thread meanwhile (memory/coordination.py `TurnQueue.keep`)."""
        kept = await self.memory.turns.keep(
            scope, token, self.lease_ms, slot.job_id, slot.written, progress, self.platform.name
        )
        if kept and progress:
            slot.written = progress
        return kept

    async def _run_taken(self, scope: Scope, token: str, taken: Taken, slot: _Slot) -> float | None:
        """Run a taken job and complete it: None; or the pause after which it runs again, when
        the platform failed in passing (the job stays in the running slot, its progress saved:
        a process that dies meanwhile loses nothing, another takes it over)."""
        turns, job = self.memory.turns, Job.from_json(taken.job)
        slot.job_id, slot.written = job.id, taken.job

        async def save() -> bool:
            return await self._kept(scope, token, slot, job.to_json())

        # delivered already: by a run that died before completing it, or a copy of it queued
        # again (given back by a run that lost its lease, a platform's redelivery seen again)
        if not await turns.delivered(scope, job.id):
            try:
                await self.run(job, save=save)
            except LeaseLost:  # not completed: the run holding the lease now finishes it
                log.warning("the lease on %s was lost; %s left to its holder", scope.thread, job.id)
                return None
            except Exception as exc:
                if memory_unavailable(exc) or not self.platform.passing(exc):
                    raise  # memory down: the lease lapses, a process takes the job when it is back
                return retry_pause_after(_passed(job), self.retry_pause)
        await turns.complete(scope, job.id)
        slot.job_id = slot.written = ""
        self._spared.pop(job.id, None)  # a run of it stopped here may have left its mark
        return None

    async def run(self, job: Job, save: Save | None = None) -> None:
        """Run one job now and deliver its outcome: an answer, or a reply saying what went
        wrong. `save` keeps `job.progress` (the queue's running slot). Raises when the memory
        is unreachable (said when the turn met it), when a queued job's platform failed in
        passing (`Platform.passing`, as many runs as RETRY_BACKOFF has pauses), or its lease
        was lost: the job stays queued and runs again from its saved progress."""
        progress = job.progress
        progress["attempts"] = attempts = progress.get("attempts", 0) + 1
        if self._spared.pop(job.id, None) == attempts - 1:  # the run saved last: not its fault
            progress["spared"] = progress.get("spared", 0) + 1
        again = (
            save is not None and _counted(job) <= MAX_ATTEMPTS and _passed(job) < len(RETRY_BACKOFF)
        )
        save = save or _nothing
        running = may_run_again.set(again)
        try:
            await self._run(job, save, again)
        except asyncio.CancelledError:  # a shutdown hands it back: this run is not counted
            progress["spared"] = progress.get("spared", 0) + 1
            if not await asyncio.shield(_quietly_saved(save)):
                self._spared[job.id] = attempts
            raise
        except LeaseLost:
            self._spared[job.id] = attempts
            raise
        except Exception as exc:
            if memory_unavailable(exc):
                if not memory_full(exc):  # a full Redis still reads: its runs must end
                    self._spared[job.id] = attempts
                raise
            if again and self.platform.passing(exc):
                log.warning("%s in %s runs again: %r", job.kind, job.scope.thread, exc)
                progress["passed"] = _passed(job) + 1  # the platform's doing: paused, not
                progress["spared"] = progress.get("spared", 0) + 1  # counted as a crash
                await save()  # with what it posted or answered
                raise
            # the platform refused the turn (the channel is gone, the bot was removed): the
            # person is told, if the platform has a way (Slack: the command's response_url),
            # unless a part of the answer is out (a failed part told them already)
            log.exception("%s in %s could not be run or shown", job.kind, job.scope.thread)
            if self.platform.passing(exc):
                await self._notice(job, await self._gave_up(job))
            elif self.platform.refused(exc) and not job.progress.get("sent"):
                await self._notice(job, NOT_SHOWN)
        finally:
            may_run_again.reset(running)
        try:  # whatever the platform did: the turn (or a run before it) may have stored it
            await self._caught_up(job, save)
        except Exception as exc:
            if memory_unavailable(exc):
                raise
            log.exception("what the platform changed of %s's message was not caught up", job.id)

    async def _run(self, job: Job, save: Save, again: bool = False) -> None:
        change = await self._platform_change(job)
        if change.deleted:
            log.info("turn %s in %s not run: its message was deleted", job.id, job.scope.thread)
            await self._first_text_uncached(job, job.text)  # what `submit` fetched ahead
            if job.progress.get("placeholder"):  # a run that died showed it working (Slack)
                await _saved(save)  # still this run's job
                try:
                    await self.platform.withdraw(job, DELETED_UNANSWERED)
                except Exception as exc:  # nothing said for a message deleted (`withdraw`)
                    if memory_unavailable(exc) or (again and self.platform.passing(exc)):
                        raise
                    log.warning("turn %s's placeholder left in %s: %r", job.id, job.scope.thread,
                                exc)  # fmt: skip
            return
        if (edited := change.edited_from(job.text)) is not None:  # runs with the latest text
            job.progress.setdefault("first_text", job.text)  # its vectors go at the end
            job.text = edited
        async with self.platform.working(job) as status:
            await _saved(save)
            text = job.progress.get("answer")
            if text is None:
                if _counted(job) > MAX_ATTEMPTS:
                    text = await self._gave_up(job)
                    await self._first_text_uncached(job)
                else:
                    text = await self._outcome(job, status)
                job.progress["answer"] = text  # saved before the first part is sent
            parts = split_for_delivery(self.platform.render(text), self.platform.limit) or ["…"]
            job.progress["parts"] = len(parts)  # the last one carries the feedback buttons
            for index, part in enumerate(parts):
                if index < job.progress.get("sent", 0):
                    continue  # delivered by an earlier run
                await _saved(save)  # still this run's job: else another run delivers it
                if not await self._deliver(job, status, index, part, again):
                    job.progress["sent"] = len(parts)  # the person was told: none sent again
                    break
                job.progress["sent"] = index + 1
            await save()  # all sent (the job completes next; a lost lease changes nothing)

    async def _caught_up(self, job: Job, save: Save) -> None:
        """A turn's message deleted or edited on the platform while the turn ran (or before a
        run that died stored it) is caught up once the answer is out, or the turn not run
        (bot/turns.py `changed_meanwhile`; a deletion queued again finds nothing to do). Marked
        in the job's progress: a run that died before it, or found memory unreachable (raised:
        the job stays), does it when the job runs again; when nothing changed, the mark is
        not saved (a run again repeats one read), so most turns write nothing more."""
        if job.kind != "turn" or not job.source or job.progress.get("caught_up"):
            return
        queued = await self.handler.changed_meanwhile(job.scope, job.source)
        job.progress["caught_up"] = True
        if queued:
            await save()

    async def _platform_change(self, job: Job) -> Change:
        """What the platform said meanwhile of a turn's message not answered yet: deleted (the
        turn is neither stored nor answered: bot/upkeep.py `forget_deleted`), or edited (it
        runs with the latest text: `message_edited`)."""
        if job.kind != "turn" or not job.source or "answer" in job.progress:
            return Change()
        return await self.memory.governance.edits.change(job.scope.tenant, job.source)

    async def _first_text_uncached(self, job: Job, *also: str) -> None:
        """A turn run with an edited text (`_platform_change`), or not run (its message deleted):
        the vectors `submit` fetched ahead for its first text go (`_caught_up` queues the
        edit again if need be). A failure here is logged: the answer stands."""
        texts = [t for t in (job.progress.pop("first_text", None), *also) if t]
        if texts:
            try:
                await self.memory.governance.edits.uncache(texts)
            except Exception:
                log.exception("the vectors of an edited or deleted text could not be dropped")

    async def _outcome(self, job: Job, status: Status) -> str:
        try:
            if job.kind == "summarize":
                return await self.handler.summarize(job.scope)
            on_delta = status.delta if self.platform.streams else None
            try:
                reply = await self.handler.handle(
                    job.scope, job.text, status.event, on_delta, turn_id=job.id,
                    source=job.source, rerun=job.progress["attempts"] > 1,
                )  # fmt: skip
            finally:
                await self._first_text_uncached(job)
            job.progress["turn"] = reply.turn_id  # saved with the answer
            return reply.text
        except Exception as exc:
            if memory_unavailable(exc):
                log.warning("memory unavailable during %s in %s", job.kind, job.scope.thread)
                with contextlib.suppress(Exception):
                    await self.platform.deliver(job, status, 0, MEMORY_DOWN)
                raise
            log.exception("%s failed in thread %s", job.kind, job.scope.thread)
            return await self._failed(job, exc)

    async def _failed(self, job: Job, exc: Exception) -> str:
        """The reply to a job that failed: "your message is saved" only when it was (the turn
        stores the question after embedding it and reading the memory). An embedding model
        failing in passing is said as unreachable for now; one failing for its setup (a key
        refused, a model missing, the wrong dimensions) as what its operator must fix."""
        if not isinstance(exc, EmbeddingError):
            return await self._said_as_kept(job, FAILURE, NOT_SAVED, NOT_DONE)
        cause = error_kind(exc)  # the provider's own text (logged above) stays out of the reply
        if in_passing(exc):
            saved = await self._said_as_kept(job, SAVED, UNSAVED, AGAIN)
            return f"{EMBEDDINGS_DOWN.format(cause=cause)} {saved}"
        saved = await self._said_as_kept(
            job, SAVED_TILL_FIXED, UNSAVED_TILL_FIXED, AGAIN_TILL_FIXED
        )
        return EMBEDDINGS_BROKEN.format(cause=cause, saved=saved)

    async def _gave_up(self, job: Job) -> str:
        """The reply to a job given up: "your message is saved" only when it was."""
        return await self._said_as_kept(job, GAVE_UP, GAVE_UP_UNSAVED, GAVE_UP_AGAIN)

    async def _said_as_kept(self, job: Job, kept: str, lost: str, neither: str) -> str:
        """`kept` when the person's message is kept (a turn's question stored), `lost` when it
        is not, `neither` for a job that keeps nothing of theirs (a /summarize): telling its
        person "your message is saved" would promise what no one keeps."""
        if job.kind != "turn":
            return neither
        return kept if await self._question_saved(job) else lost

    async def _question_saved(self, job: Job) -> bool:
        try:
            stored = await self.memory.conversation.appended(job.scope, question_once(job.id))
        except Exception as exc:  # not known: nothing is promised
            log.warning("whether %s's question was stored is not known: %r", job.id, exc)
            return False
        return stored is not None and not stored.forgotten

    async def _deliver(
        self, job: Job, status: Status, index: int, part: str, again: bool = False
    ) -> bool:
        """A part that fails in passing is raised while the job may run `again` (a re-run
        sends it and the rest from its saved answer); else the person is told, once, and
        False: the parts after it are not sent (an answer with a hole would mislead)."""
        try:
            await self.platform.deliver(job, status, index, part)
        except Exception as exc:
            if again and self.platform.passing(exc):
                raise
            log.exception("could not deliver part %d in %s", index, job.scope.thread)
            if index:  # an answer computed: a turn's question stored
                await self._notice(job, REST_UNSENT if job.kind == "turn" else REST_UNSENT_AGAIN)
            elif self.platform.refused(exc):  # refused for good where it was asked
                await self._notice(job, NOT_SHOWN)
            else:  # an answer computed (the question stored) or a failure reply
                await self._notice(job, await self._said_as_kept(job, FAILURE, NOT_SAVED, NOT_DONE))
            return False
        return True

    async def _notice(self, job: Job, text: str) -> None:
        try:
            await self.platform.notice(job, text)
        except Exception:
            log.exception("could not tell the person in %s: %s", job.scope.thread, text[:60])

    # -- stopping --------------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Wait until this process has no thread to drain (tests, benchmarks)."""
        while self._draining:
            await asyncio.gather(*list(self._draining), return_exceptions=True)

    async def shutdown(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Stop taking jobs; give running ones `grace` seconds, then hand them back to the
        queue for another process (their progress is kept)."""
        self._stopping = True
        self._stopped.set()
        if self._recovering is not None:
            self._recovering.cancel()
        running = list(self._draining)
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def close(self) -> None:
        """Finish what runs, then stop looking for work (tests and orderly exits)."""
        await self.wait_idle()
        if self._recovering is not None:
            self._recovering.cancel()
            await asyncio.gather(self._recovering, return_exceptions=True)
            self._recovering = None


def feedback_turn(job: Job, index: int) -> str:
    """The turn id whose 👍/👎 buttons part `index` carries: the last part of an answer
    (not of a failure reply, a summary or a notice); else ""."""
    last = index == job.progress.get("parts", 0) - 1
    return str(job.progress.get("turn") or "") if last else ""


@dataclass
class _Slot:
    """The job a drain runs and what it last wrote to the thread's running slot: a lease
    gone with the memory's data is taken again only while the slot still holds that."""

    job_id: str = ""
    written: str = ""


async def _nothing() -> None:
    return None


def retry_pause_after(passed: int, unit: float = RETRY_PAUSE_SECONDS) -> float:
    """The pause before a job runs again after `passed` runs the platform failed in passing
    (1 or more): `unit` times RETRY_BACKOFF's step for it, its last past the end."""
    return unit * RETRY_BACKOFF[min(passed, len(RETRY_BACKOFF)) - 1]


def _passed(job: Job) -> int:
    """The runs of `job` the platform failed in passing (each paused after: RETRY_BACKOFF)."""
    return int(job.progress.get("passed", 0))


def _counted(job: Job) -> int:
    """The runs of `job` that count towards MAX_ATTEMPTS: those not ended by outside causes."""
    return int(job.progress["attempts"]) - int(job.progress.get("spared", 0))


async def _quietly_saved(save: Save) -> bool:
    """Save while the run is being stopped: False if it could not be (no lease, no memory)."""
    try:
        return await save() is not False
    except Exception:
        return False


async def _saved(save: Save) -> None:
    """Save a running job's progress; LeaseLost if its lease lapsed meanwhile."""
    if await save() is False:
        raise LeaseLost("the lease lapsed while the job ran")


def error_kind(exc: BaseException) -> str:
    """What kind of failure `exc` is, fit for a channel: "HTTP 401", "connection refused"
    (also under a client's timeout), "timed out", "no connection", else the class of what
    caused it. A provider's error text may hold a masked key or an internal address: an error
    with a provider's (openai, httpx, aiohttp) in its chain is shortened; our own words (the
    wrong dimensions, a model not installed, raised from an ImportError) are said whole."""
    chain = list(error_chain(exc))[1:]  # what caused it
    if not any(type(e).__module__.split(".")[0] in PROVIDERS for e in chain):
        return str(exc)
    statuses = [getattr(e, "status_code", None) for e in chain]
    if status := next((s for s in statuses if isinstance(s, int)), None):
        return f"HTTP {status}"
    for kind, types in (
        ("connection refused", ConnectionRefusedError),
        ("timed out", (TimeoutError, openai.APITimeoutError)),
        ("no connection", PASSING_ERRORS),
    ):
        if any(isinstance(e, types) for e in chain):
            return kind
    return type(chain[-1]).__name__
