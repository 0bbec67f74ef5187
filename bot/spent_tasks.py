"""Background tasks that used up their deliveries: knowing the last one, and dead-lettering.

A task is dead-lettered after `max_deliveries` (bot/background.py). A handler knows its last
run by `last_delivery()`. A task claimed once more after its last delivery is run if no run
began on that delivery or after (it was claimed and never started: a SIGKILL, a lapse); if one
began and never ended (it took its process down, say), it is dead-lettered without being run,
or it would take down one process after another, and its kind's `on_dead_letter` hook, if any,
is told (to say so, and pass on what must not be lost; a hook that fails is tried again on the
next claims). Which run began is kept in Redis (`TaskStream.mark_started`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar

from bot.held_tasks import HeldTasks
from memory.tasks import Task, TaskStream

log = logging.getLogger(__name__)

DeadLetterHook = Callable[[dict], Awaitable[None]]  # a task's payload, dead-lettered unrun

HOOK_DELIVERIES = 3  # claims of a spent task that still run its hook (one may die, or fail)

_DELIVERY: ContextVar[tuple[int, int]] = ContextVar("delivery", default=(1, 0))


def last_delivery() -> bool:
    """Whether a failure of the running batch dead-letters it (no run comes after this one):
    its least delivered task's count has reached the work's `max_deliveries` (a task that used
    up its deliveries gets a last run alone). A handler that must say something before its task
    is dead-lettered knows its last run by it, whatever happened to the runs before (one that
    failed before the handler counted it)."""
    count, most = _DELIVERY.get()
    return 0 < most <= count


def running_delivery(count: int, most: int) -> None:
    """Set, for the handler about to run, its batch's least delivery `count` and the `most`
    deliveries it has (what `last_delivery` tells)."""
    _DELIVERY.set((count, most))


class SpentTasks:
    """Buries the tasks whose last run never ended, and gives up on those that failed it."""

    def __init__(
        self,
        stream: TaskStream,
        max_deliveries: int,
        hooks: Mapping[str, DeadLetterHook],
        held: HeldTasks,
    ) -> None:
        self.stream = stream
        self.max_deliveries = max_deliveries
        self.hooks = hooks
        self.held = held

    async def without_buried(self, tasks: list[Task]) -> list[Task]:
        """The tasks to run: those past their last delivery whose run on it (or after) began
        and never ended are buried (`bury`); those whose run never began get it now. Redis
        failing leaves the ones past it pending (claimed again later), the others run."""
        over = [t for t in tasks if t.deliveries > self.max_deliveries]
        if not over:
            return tasks
        try:
            began = await self.stream.started_on(over)
        except Exception:
            log.exception("background: could not tell whether %d tasks ran", len(over))
            self.held.release(over)
            return [t for t in tasks if t not in over]
        spent = [t for t in over if began.get(t.id, 0) >= self.max_deliveries]
        if spent:
            try:
                await self.bury(spent)
            except Exception:
                log.exception("background: could not dead-letter %d tasks", len(spent))
        return [t for t in tasks if t not in spent]

    async def bury(self, tasks: list[Task]) -> None:
        """Dead-letter tasks whose last run began and never ended, unrun, telling their kind's
        hook first, on their first HOOK_DELIVERIES claims past their last delivery (a hook that
        takes its process down too is not run for ever). A failing hook leaves its task pending
        for another claim while it has one; on its last, the hook's error goes with the dead
        letter. Redis failing leaves them pending."""
        self.held.hold(tasks, running=True)  # kept alive while hooks run
        hook_claims = self.max_deliveries + HOOK_DELIVERIES
        try:
            for task in tasks:
                error = f"not run: delivered {task.deliveries} times, its last run never ended"
                hook = self.hooks.get(task.kind)
                if hook is not None and task.deliveries > hook_claims:
                    error += f"; its hook not run again (tried on {HOOK_DELIVERIES} claims)"
                elif hook is not None:
                    try:
                        await hook(task.payload)
                    except Exception as exc:
                        log.exception("background %s %s: its dead-letter hook failed",
                                      task.kind, task.id)  # fmt: skip
                        if task.deliveries < hook_claims:
                            continue  # pending: claimed again, the hook with it
                        error += f"; its hook failed: {exc!r}"
                log.error("background %s %s dead-lettered unrun: %s", task.kind, task.id, error)
                await self.stream.dead_letter(task, error)
        finally:
            self.held.release(tasks)

    async def give_up(self, task: Task, exc: Exception) -> None:
        """Dead-letter `task`, whose last run failed with `exc`."""
        log.error("background %s %s dead-lettered after %d deliveries: %r",
                  task.kind, task.id, task.deliveries, exc)  # fmt: skip
        error = "".join(traceback.format_exception(exc))[-4000:]
        await self.stream.dead_letter(task, error)
