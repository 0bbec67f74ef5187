"""Work that must not delay replies (writing workflows and entities, indexing, summaries).

Tasks are durable: `submit` adds them to a Redis stream (`memory.tasks`) before it returns, and a
consumer loop runs them through per-kind handlers, in batches of one kind. A task is
acknowledged only after its handler succeeds; one that fails is retried once it has been idle
`claim_idle_ms`, and dead-lettered after `max_deliveries` (bot/spent_tasks.py: a task's last
delivery, and what is done with a task past it). A task whose handler raises `Deferred` (what
it needs is held by a long job, an import) is put back instead, its delivery unspent, and
claimed again after `claim_idle_ms` like a failed one (`_put_back`). The same claiming hands the
tasks of a crashed process to a live one. Delivery is at least once: handlers must be
idempotent. The tasks read and not yet acknowledged are kept alive, so nobody else claims them
meanwhile, and those left unstarted by close() are handed back (bot/held_tasks.py).

The work gives way to turns being prepared: while any turn assembles its context, the loop does
not read new tasks and batches in hand do not start (for at most `max_wait`). In a burst of
messages every turn is prepared first, and the tasks then use the time the turns spend waiting
for the model instead of competing with them for the CPU and the embedding model. Tasks left
unread stay in Redis, where an idle process can take them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

from bot.held_tasks import GIVE_BACK_IDLE_MS, HeldTasks
from bot.spent_tasks import DeadLetterHook, SpentTasks, running_delivery
from memory.errors import Deferred
from memory.tasks import PartlyDeferred, Task, TaskStream

log = logging.getLogger(__name__)

Handler = Callable[[list[dict]], Awaitable[None]]

MAX_BACKOFF = 5.0  # seconds between retries while Redis is unreachable
MAX_RUN_MS = 1_800_000  # a batch running longer than this is taken for hung: others may claim it
DRAIN_POLL = 0.05  # seconds between pending-count checks in drain()


class BackgroundWork:
    def __init__(
        self,
        stream: TaskStream,
        handlers: Mapping[str, Handler] | None = None,
        *,
        workers: int = 4,
        max_wait: float = 10.0,
        batch: int = 16,
        claim_idle_ms: int = 30_000,
        max_deliveries: int = 5,
        block_ms: int = 1_000,
        max_run_ms: int = MAX_RUN_MS,
        on_dead_letter: Mapping[str, DeadLetterHook] | None = None,
        gone_with_tenant: Iterable[str] = (),
    ) -> None:
        if claim_idle_ms <= 0:
            raise ValueError("claim_idle_ms must be positive")
        self.stream = stream
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.on_dead_letter: dict[str, DeadLetterHook] = dict(on_dead_letter or {})
        # kinds whose task is done with, unrun, when its tenant was erased after it was queued
        self.gone_with_tenant = frozenset(gone_with_tenant)
        self.workers = workers
        self.max_wait = max_wait
        self.batch = batch
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.block_ms = block_ms
        self.max_run_ms = max_run_ms
        # Claim often enough that a failed or orphaned task waits about claim_idle_ms, no more.
        self._claim_every = min(max(claim_idle_ms / 2000, 0.05), 15.0)
        self._next_claim = 0.0
        self._slots = asyncio.Semaphore(workers)
        self._stop = asyncio.Event()
        self._closing = False  # set by stop_reading: nothing starts the consumer again
        self._consumer: asyncio.Task | None = None
        self._beating: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._tickers: set[asyncio.Task] = set()
        self._held = HeldTasks(stream, claim_idle_ms, max_run_ms)
        self._spent = SpentTasks(stream, max_deliveries, self.on_dead_letter, self._held)
        # The last-delivery tasks of the one last group in flight here, not yet started
        # (`_run_last`); None: no last group in flight. And since when its task in hand runs.
        self._last_waiting: list[Task] | None = None
        self._last_started: float | None = None
        self._preparing = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        # The ids submitted here once `track_own` is called (a command that waits for its own
        # writes: `finish_own`), and those of them whose run failed or was put off here.
        self._own: set[str] | None = None
        self._own_tried: set[str] = set()
        self._spend_cut_short = False  # `cut_short(spend=True)`: their delivery stays spent

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Mark a turn being prepared: background tasks wait until no turn is."""
        self._preparing += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self._preparing -= 1
            if not self._preparing:
                self._quiet.set()

    async def submit(self, kind: str, payload: dict) -> str:
        """Queue a task (in Redis before this returns) and make sure the consumer runs, unless
        this process is closing (`start`): then the task waits in Redis for another."""
        if kind not in self.handlers:
            raise ValueError(f"No handler for background task kind {kind!r}.")
        task_id = await self.stream.add(kind, payload)
        if self._own is not None:
            self._own.add(task_id)
        self.start()
        return task_id

    def track_own(self) -> None:
        """Record the ids of the tasks submitted from now on (a handler's follow-ups too), for
        `finish_own`. Off by default: a long-lived process would keep them for ever."""
        if self._own is None:
            self._own = set()

    def handle(self, handlers: Mapping[str, Handler]) -> None:
        """Add handlers (for parts built after this, which queue their tasks through it)."""
        self.handlers.update(handlers)

    def every(
        self, seconds: float, job: Callable[[], Awaitable[object]], first: float | None = None
    ) -> None:
        """Run `job` about every `seconds` in this process (the first time after `first`,
        default `seconds`) until close(): periodic work, such as queueing the retention sweeps,
        whose jobs decide among processes who does it (a claim in Redis). A failing run is
        logged and the job runs again at its next time. Needs a running event loop."""
        delay = seconds if first is None else first
        ticker = asyncio.create_task(self._every(seconds, job, delay), name="background-every")
        self._tickers.add(ticker)
        ticker.add_done_callback(self._tickers.discard)

    async def _every(
        self, seconds: float, job: Callable[[], Awaitable[object]], delay: float
    ) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return  # closed
            except TimeoutError:
                pass
            try:
                await job()
            except Exception:  # Redis down, a bug: never fatal, tried again next time
                log.exception("periodic background job failed; next try in %.0fs", seconds)
            delay = seconds

    def start(self) -> None:
        """Start the consumer loop, if it is not running (needs a running event loop). Not
        once closing (`stop_reading`): an event arriving during shutdown (a deletion that
        queues a task) would restart it, claim what stopping processes handed back, and be
        killed mid-run."""
        if self._closing:
            return
        if self._consumer is None or self._consumer.done():
            self._stop.clear()
            self._next_claim = 0.0  # claim what crashed consumers left, first thing
            self._consumer = asyncio.create_task(self._consume(), name="background-consumer")
        if self._beating is None or self._beating.done():
            self._beating = asyncio.create_task(
                self._held.keep_alive(), name="background-keep-alive"
            )

    async def drain(self) -> None:
        """Wait until every task on the stream (submitted by anyone) is done and acknowledged.
        Tasks that keep failing hold this up until they are dead-lettered, and a deferred one
        (`Deferred`: an import holds what it needs) until it can run, as long as the import
        lasts. A closing process reads no more: it does not wait."""
        if self._closing or not await self.stream.pending_count():
            return
        self.start()
        while await self.stream.pending_count():
            await asyncio.sleep(DRAIN_POLL)

    async def own_left(self) -> bool:
        """Whether a task submitted here since `track_own` is still on the stream; those
        done are forgotten here, so `finish_own` asks only about the rest."""
        own = self._own or set()  # the tracked set itself: what is done leaves it
        asked = set(own)  # those submitted meanwhile are not taken for done
        own -= asked - await self.stream.present(asked)
        return bool(own)

    async def finish_own(self) -> bool:
        """Wait until the tasks submitted here since `track_own` are done (no longer on the
        stream), not for the rest of the shared stream (another process's, a task failing for
        good): True when they are. False at once when every one left failed (or was put off)
        here and is not running here: it is retried only after claim_idle_ms, not worth a
        wait. A closing process reads no more: False, it does not wait."""
        own = self._own or set()
        while own:
            if self._closing:
                return False
            self.start()
            asked = set(own)  # those submitted meanwhile are asked about next time
            own -= asked - await self.stream.present(asked)
            if own and all(i in self._own_tried and i not in self._held for i in own):
                return False
            if own:
                await asyncio.sleep(DRAIN_POLL)
        return True

    async def stop_reading(self) -> None:
        """The first half of close(): stop reading and hand back the tasks read but not
        started, without waiting for the running batches. A process with several workers
        calls this on each before closing any, so that no hand-back waits for another's
        batches (and the platform's kill)."""
        self._closing = True
        self._stop.set()
        if self._last_waiting:  # their turn would come only after the last run in hand
            self._held.leave_unstarted(self._last_waiting)
            self._last_waiting.clear()
        for ticker in list(self._tickers):
            ticker.cancel()
        await asyncio.gather(*self._tickers, return_exceptions=True)
        if self._consumer is not None:
            try:  # returns within block_ms, unless Redis hangs
                await asyncio.wait_for(asyncio.shield(self._consumer), self.block_ms / 1000 + 5)
            except TimeoutError:
                self._consumer.cancel()  # a lost reply leaves entries pending: claimed later
                await asyncio.gather(self._consumer, return_exceptions=True)
            self._consumer = None
        await asyncio.sleep(0)  # batches waiting for a turn see the stop: unstarted
        # Handed back before the running batches are waited for (which may take up to
        # max_run_ms): kept alive until then, so nobody claims them (a delivery spent).
        await self._held.hand_back()

    async def close(self) -> None:
        """Stop reading, hand back the tasks read but not started (kept alive until then, so
        nobody claims them meanwhile) with their delivery unspent, then finish the batches
        whose handler runs; unread and unfinished tasks stay in Redis for the next process (a
        deploy must not bring a task nearer its dead letter). Cancelled, close cuts short what
        still runs here (its batches, and the consumer, maybe in a dead-letter hook), which
        the keep-alive stops with, and hands back, within a second, what they held, the cut
        short batches' delivery unspent too; the cancellation propagates."""
        try:
            await self.stop_reading()
            await asyncio.gather(*self._running, return_exceptions=True)
            await self._held.hand_back()  # any batch that saw the stop only now
        finally:  # the batches in hand are done, or cut short with the close (cancelled, maybe
            # before it awaited them): none runs on unkept, claimed elsewhere and run twice
            await self._cut_running()

    async def cut_short(self, *, spend: bool = False) -> None:
        """Close at once, waiting for nothing: stop reading, cancel the consumer and the
        batches running, and hand back (within a second) the tasks read and not started, with
        their delivery unspent. The batches cut short are handed back so too, claimable at once
        (Ctrl-C); with `spend`, their run began and their delivery stays spent: claimed after
        claim_idle_ms, and dead-lettered in the end should they be cut short every time (a
        task longer than any command waits, never to be rerun by each command for good)."""
        self._closing = True
        self._stop.set()
        self._spend_cut_short = spend
        if self._last_waiting:  # not started: unspent
            self._held.leave_unstarted(self._last_waiting)
            self._last_waiting.clear()
        await self._cut_running(self._tickers)

    async def _cut_running(self, also: Iterable[asyncio.Task] = ()) -> None:
        """Cancel the batches running, the consumer and the keep-alive (and `also`), then hand
        back what they held (nothing, unless cut short): bounded to a second, never over a
        cancel; Redis down leaves them pending, claimed later as they are."""
        stopping = [*also, *self._running, *(t for t in (self._consumer, self._beating) if t)]
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        self._consumer = self._beating = None
        try:
            async with asyncio.timeout(1):
                await self._held.hand_back()
        except Exception:
            log.warning("background: a cut short close could not hand back its tasks")

    # -- the consumer ----------------------------------------------------------------------------

    async def _consume(self) -> None:
        backoff = 0.1
        ready = False
        while not self._stop.is_set():
            try:
                if not ready:
                    await self.stream.ensure_group()
                    ready = True
                await self._step()
                backoff = 0.1
            except Exception:  # Redis down or failing: never fatal, retry after a pause
                log.exception("background consumer failed; retrying in %.1fs", backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _step(self) -> None:
        """Read (or claim) one batch when a worker is free and no turn is being prepared, and
        start a runner per kind in it, and one for its tasks on their last delivery (given back
        instead while this instance's last group is in flight: `_not_now`, unless it is hung:
        `_drop_hung_last`)."""
        await self._drop_hung_last()
        if not await self._free_worker():
            return
        try:
            deadline = asyncio.get_running_loop().time() + self.max_wait
            await self._yield_to_turns(deadline)
            tasks = [] if self._stop.is_set() else await self._fetch()
        except BaseException:
            self._slots.release()
            raise
        ours = [t for t in tasks if t.id in self._held]  # claimed from ourselves
        tasks = [t for t in tasks if t.id not in self._held]
        self._held.hold(tasks)  # kept alive while hooks run
        try:
            await self._give_back_ours(ours)
            tasks = await self._without_erased(tasks)
            tasks = await self._spent.without_buried(tasks)
        except BaseException:
            self._let_go(tasks)
            self._slots.release()
            raise
        groups = self._batches(tasks)
        if groups and self._last_waiting is not None and self._is_last(groups[-1]):
            try:
                await self._not_now(groups.pop())
            except BaseException:  # cancelled by close(): the others are handed back
                for group in groups:
                    self._let_go(group)
                self._slots.release()
                raise
        if not groups:
            self._slots.release()
            return
        started = 0
        try:
            for group in groups:
                if started and not await self._free_worker():
                    break  # closing: the rest is handed back
                if self._is_last(group):
                    self._last_waiting = list(group)  # in flight: the next are not run now
                    self._last_started = None
                    runner = asyncio.create_task(self._run_last())
                else:
                    runner = asyncio.create_task(self._run(group, deadline))
                started += 1
                self._running.add(runner)
                runner.add_done_callback(self._running.discard)
        finally:  # stopped while waiting for a worker: held until close() hands them back
            for group in groups[started:]:
                self._let_go(group)

    async def _without_erased(self, tasks: list[Task]) -> list[Task]:
        """`tasks` less those of the `gone_with_tenant` kinds whose tenant was erased whole
        after they were queued (`TaskStream.erased_since`, on Redis's clock), acknowledged
        unrun: run, they would write back into a tenant that asked for everything to go, or
        answer nobody."""
        kinds = [t for t in tasks if t.kind in self.gone_with_tenant]
        if not kinds:
            return tasks
        erased = [
            task for task, gone in zip(
                kinds, await asyncio.gather(*map(self.stream.erased_since, kinds)), strict=True
            ) if gone
        ]  # fmt: skip
        if erased:
            log.info("%d task(s) of an erased tenant done with, unrun", len(erased))
            await self.stream.ack(erased)
            self._held.release(erased)
        gone = {t.id for t in erased}
        return [t for t in tasks if t.id not in gone]

    def _let_go(self, tasks: list[Task]) -> None:
        """Fetched `tasks` that will not run here: once close() began, held until it hands
        them back with their delivery unspent; otherwise released, claimed again later."""
        if self._stop.is_set():
            self._held.leave_unstarted(tasks)
        else:
            self._held.release(tasks)

    def _batches(self, tasks: list[Task]) -> list[list[Task]]:
        """The runners of a fetch: one batch per kind, and last the group of the tasks on
        their last delivery (or past it), which runs them alone, one after another
        (`_run_last`). A run that never ends (its task took the process down) buries every
        task whose run began on its last delivery (bot/spent_tasks.py): a last run shared with
        such a task would bury its innocent batch-mates unrun, and so would another last run
        of this BackgroundWork beside it. (Only of this instance: another instance in the same
        process, or this one's batches not on their last delivery, may run beside it.)"""
        by_kind: dict[str, list[Task]] = {}
        last = [t for t in tasks if t.deliveries >= self.max_deliveries]
        for task in tasks:
            if task not in last:
                by_kind.setdefault(task.kind, []).append(task)
        return [*by_kind.values(), *([last] if last else [])]

    def _is_last(self, group: list[Task]) -> bool:
        """Whether `group` is the last-delivery group of `_batches`."""
        return group[0].deliveries >= self.max_deliveries

    async def _not_now(self, tasks: list[Task]) -> None:
        """Last-delivery tasks read while this instance's last group is in flight (or waiting
        behind a hung one: `_drop_hung_last`): given back at once with their delivery unspent,
        looking just delivered, so they are claimed again after `claim_idle_ms` (here, or by
        another process), like a failed task. Waiting here instead would hold a worker each,
        and all of them if a last run hangs. Redis failing leaves them pending: claimed later,
        a delivery spent (past the last, they still run, no run having begun on it)."""
        self._held.release(tasks)
        try:
            await self.stream.give_back(tasks, 0)
        except Exception:
            log.warning("background: could not give back %d last-delivery tasks", len(tasks))
        else:
            log.info("background: %d last-delivery tasks wait for the last run here", len(tasks))

    async def _drop_hung_last(self) -> None:
        """A last run in hand for more than max_run_ms is taken for hung, as any batch is (no
        longer kept alive: bot/held_tasks.py): its batch-mates still waiting are given back
        with their delivery unspent (`_not_now`), and the next last group gets a runner of its
        own, or one handler that never returns would hold back every last delivery here for
        good. (Should the hung run then take the process down, the run beside it is lost with
        it: buried on its next claim, as any run that never ended.)"""
        started = self._last_started
        if self._last_waiting is None or started is None:
            return
        if asyncio.get_running_loop().time() - started <= self.max_run_ms / 1000:
            return
        waiting, self._last_waiting, self._last_started = self._last_waiting, None, None
        log.warning("background: a last run hung past max_run_ms; %d behind it go back",
                    len(waiting))  # fmt: skip
        tasks = list(waiting)
        waiting.clear()  # its runner starts no more of them
        if tasks:
            await self._not_now(tasks)

    async def _give_back_ours(self, tasks: list[Task]) -> None:
        """Fetched tasks this process holds already, claimed from itself: a run past
        max_run_ms (taken for hung: no longer kept alive) and those waiting behind one. They
        stay where they are and go back at once as they were (the delivery this claim counted
        taken back, looking just delivered): else each claim, every claim_idle_ms, would spend
        a delivery, and a hung task restarted would be past the claims that still run its
        dead-letter hook (bot/spent_tasks.py). Redis failing: they keep that delivery."""
        if not tasks:
            return
        try:
            await self.stream.give_back(tasks, 0)
        except Exception:
            log.warning("background: could not give back %d tasks held here", len(tasks))

    async def _free_worker(self) -> bool:
        """Wait for a worker; False (none taken) once close() began: it waits no longer."""
        if self._stop.is_set():
            return False
        acquiring = asyncio.ensure_future(self._slots.acquire())
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([acquiring, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not acquiring.done():
                acquiring.cancel()
        return acquiring.done() and not acquiring.cancelled()

    async def _fetch(self) -> list[Task]:
        now = asyncio.get_running_loop().time()
        if now >= self._next_claim:
            claimed = await self.stream.claim_stale(self.claim_idle_ms, self.batch)
            # A full batch may mean more are stale: claim again next time.
            self._next_claim = now if len(claimed) == self.batch else now + self._claim_every
            if claimed:
                return claimed
        block = min(self.block_ms, max(1, int((self._next_claim - now) * 1000)))
        return await self.stream.read(self.batch, block)

    async def _run(self, tasks: list[Task], deadline: float) -> None:
        """A runner of `_batches` for a batch of one kind, on a worker of its own."""
        try:
            await self._run_batch(tasks[0].kind, tasks, deadline)
        finally:
            self._slots.release()

    async def _run_last(self) -> None:
        """The runner of the last-delivery group in flight (`_last_waiting`), on one worker:
        each task alone, one after another, yielding to turns from when its own turn comes.
        Its batch-mates not yet started go back at once when close() begins (`stop_reading`),
        not when the run in hand ends; later groups are given back meanwhile (`_not_now`), so
        a hung last run holds this one worker only, and past max_run_ms no longer holds back
        the others (`_drop_hung_last`)."""
        waiting = self._last_waiting or []
        try:
            while waiting and not self._stop.is_set():
                task = waiting.pop(0)
                self._last_started = asyncio.get_running_loop().time()  # for `_drop_hung_last`
                await self._run_batch(task.kind, [task], self._last_started + self.max_wait)
        finally:
            if waiting:  # cancelled (or stopped): held until close() hands them back
                self._held.leave_unstarted(waiting)
            if self._last_waiting is waiting:  # not taken for hung meanwhile
                self._last_waiting = self._last_started = None
            self._slots.release()

    async def _run_batch(self, kind: str, tasks: list[Task], deadline: float) -> None:
        """One batch of one kind: ack on success, otherwise leave it pending (or dead-letter
        what has used up its deliveries)."""
        unstarted = False
        try:
            await self._yield_to_turns(deadline)
            if self._stop.is_set():  # closing: not started, held until close() hands it back
                self._held.leave_unstarted(tasks)
                unstarted = True
                return
            handler = self.handlers.get(kind)
            if handler is not None:  # Redis failing here: left pending, no run began
                await self._held.started(tasks)
            try:
                if handler is None:
                    raise LookupError(f"no handler for background task kind {kind!r}")
                running_delivery(min(t.deliveries for t in tasks), self.max_deliveries)
                await handler([t.payload for t in tasks])
            except Deferred as exc:
                assert handler is not None  # raised by the handler
                await self._deferred(kind, handler, tasks, exc)
            except Exception as exc:
                await self._failed(kind, tasks, exc)
            else:
                await self.stream.ack(tasks)
        except Exception:  # Redis failed: the tasks stay pending and are claimed again
            log.exception("background %s: could not record the start or the outcome", kind)
        except asyncio.CancelledError:  # cut short by a cancelled close(): handed back by it
            # those still held (not put back, or done, meanwhile) and not past max_run_ms: a
            # hung batch keeps its delivery spent (`within_run`), as all do with `spend`
            if self._stop.is_set() and not self._spend_cut_short:
                cut_short = self._held.within_run(tasks)
                self._held.leave_unstarted(cut_short, ran=True)
                self._held.release([t for t in tasks if t not in cut_short])
                unstarted = True
            raise
        finally:
            if not unstarted:
                self._held.release(tasks)

    async def _deferred(
        self, kind: str, handler: Handler, tasks: list[Task], exc: Deferred
    ) -> None:
        """A batch that cannot run now (`Deferred`): a task alone is put back; of a batch, the
        tasks a `PartlyDeferred` names are put back and the others acknowledged; otherwise
        each is run alone, so that one tenant's import holds back no other tenant's task
        (handlers are idempotent: those done before the deferral only run again). Each run
        alone yields to turns as a batch does; once close() began, the rest are given back as
        its unstarted tasks are (claimable at once), not run."""
        if len(tasks) == 1:
            await self._put_back(kind, tasks, exc)
            return
        if isinstance(exc, PartlyDeferred):
            deferred = [t for t in tasks if t.payload in exc.payloads]
            await self._put_back(kind, deferred, exc)
            await self.stream.ack([t for t in tasks if t not in deferred])
            return
        await self.stream.unmark(tasks)  # the batch's run ended: each alone marks its own
        for i, task in enumerate(tasks):
            await self._yield_to_turns(asyncio.get_running_loop().time() + self.max_wait)
            if self._stop.is_set():
                idle_ms = max(GIVE_BACK_IDLE_MS, self.claim_idle_ms)
                await self._put_back(kind, tasks[i:], "closing", idle_ms)
                return
            try:
                await self._held.started([task])
                running_delivery(task.deliveries, self.max_deliveries)
                await handler([task.payload])
            except Deferred as alone:
                await self._put_back(kind, [task], alone)
            except Exception as alone:
                await self._failed(kind, [task], alone)
            else:
                await self.stream.ack([task])
            self._held.release([task])

    async def _put_back(
        self, kind: str, tasks: list[Task], why: Deferred | str, idle_ms: int = 0
    ) -> None:
        """Give `tasks` back with their delivery unspent, looking just delivered (`idle_ms` 0),
        and their started mark gone (their run ended): the worker is free at once, and they are
        claimed again after `claim_idle_ms`, as a failed task is (no hot loop), however long
        what holds them back lasts. No longer kept alive, which would put the claim off."""
        log.info("background %s: %d tasks put back, tried again later: %s", kind, len(tasks), why)
        self._own_tried.update(t.id for t in tasks if self._own and t.id in self._own)
        self._held.release(tasks)
        await self.stream.give_back(tasks, idle_ms, ran=True)

    async def _failed(self, kind: str, tasks: list[Task], exc: Exception) -> None:
        ids = ", ".join(t.id for t in tasks)
        log.warning("background %s failed for %s: %r", kind, ids, exc, exc_info=exc)
        self._own_tried.update(t.id for t in tasks if self._own and t.id in self._own)
        # a task on its last delivery runs alone (`_batches`): a failed batch has none
        for task in (t for t in tasks if t.deliveries >= self.max_deliveries):
            await self._spent.give_up(task, exc)

    async def _yield_to_turns(self, deadline: float) -> None:
        """Wait while a turn is being prepared, until `deadline` or close()."""
        timeout = deadline - asyncio.get_running_loop().time()
        if self._quiet.is_set() or self._stop.is_set() or timeout <= 0:
            return
        waits = [
            asyncio.ensure_future(self._quiet.wait()),
            asyncio.ensure_future(self._stop.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


async def stop_reading_all(works: Iterable[BackgroundWork]) -> None:
    """Close's first half for several workers: each stops reading and hands back what it has
    not started."""
    for work in works:
        await work.stop_reading()


async def close_all(works: Iterable[BackgroundWork]) -> None:
    """Close several workers: every hand-back first (`stop_reading` on all), so none waits for
    another's running batches (and the platform's kill), then each finishes its batches."""
    works = list(works)
    await stop_reading_all(works)
    for work in works:
        await work.close()
