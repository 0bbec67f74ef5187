"""Retention: how long a tenant's conversation memory is kept, and the sweep that enforces it.

A tenant's own period (set by an admin, on the memory page or with `arxivscout memory
retention`) is kept in Redis; a tenant without one gets the default (ARXIVSCOUT_RETENTION_DAYS,
none: kept for ever). "Off" is a setting of its own: a tenant may keep everything even when the
default is a period.

The sweep is durable background work that several processes share without doing it twice.
Every process calls `schedule` about once per sweep interval; the first to take the interval's
claim (SET NX, with a TTL) queues one `sweep_retention` task per tenant with a period on the
task stream (memory/tasks.py), and the stream's consumer group gives each task to one process,
or to another when that one dies before it acknowledges the task. A sweep reads the period again
when it runs, so one turned off meanwhile removes nothing. It forgets conversation memory
(messages, summaries over them, tool logs, episodic entries, dead letters) said or queued
before now minus the period, through `Governance.sweep_retention`, and the PDFs shared
privately in a thread that went whole; papers from arXiv, the team's PDFs, entities and
workflows are kept. The process that takes the interval's claim also finishes the purges of
forgotten messages' episodic documents that stopped processes left
(`Governance.purge_leftovers`), for every tenant. A sweep queued before the whole tenant was
erased and run after it does nothing (`Governance.sweep_retention`): it would write its note
back into the erased tenant.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from memory.errors import Deferred
from memory.keys import retention_key, retention_swept_key, sweep_claim_key
from memory.stores.base import decode
from memory.tasks import PartlyDeferred

DAY = 86_400.0
MAX_DAYS = 36_500
OFF = "off"
SWEEP = "sweep_retention"  # the background task: sweep one tenant
DEFAULT_SWEEP_SECONDS = 3600.0

log = logging.getLogger(__name__)

Submit = Callable[[str, dict], Awaitable[Any]]  # e.g. BackgroundWork.submit


class InvalidRetention(ValueError):
    """A retention period that is not a number of days from 1 second to MAX_DAYS."""


def as_days(seconds: float) -> int | float:
    """Whole days as an int (30, not 30.0): what people set and read."""
    days = seconds / DAY
    return int(days) if days.is_integer() else days


def check_days(days: float) -> float:
    """The period in seconds; `InvalidRetention` for anything but a positive number of days."""
    if isinstance(days, bool) or not isinstance(days, int | float):
        raise InvalidRetention(f"A retention period is a number of days, not {days!r}.")
    if not math.isfinite(days) or days <= 0 or days > MAX_DAYS:
        raise InvalidRetention(
            f"A retention period is more than 0 and at most {MAX_DAYS:,} days (got {days})."
        )
    return float(days) * DAY


class Retention:
    def __init__(
        self,
        memory: Any,
        default_days: float | None = None,
        sweep_seconds: float = DEFAULT_SWEEP_SECONDS,
    ) -> None:
        self.memory = memory
        self.redis = memory.redis
        self.default_days = default_days  # the setting; the wiring (app/runtime.py) sets it
        self.sweep_seconds = sweep_seconds

    # -- the setting ----------------------------------------------------------------------------

    async def own(self, tenant: str) -> tuple[bool, int | float | None]:
        """(whether the tenant has its own setting, its days or None for "kept for ever")."""
        raw = decode(await self.redis.get(retention_key(tenant)))
        if raw is None:
            return False, None
        return True, None if raw == OFF else as_days(float(raw))

    async def get(self, tenant: str) -> int | float | None:
        """The period in force, in days: the tenant's own, else the default; None: kept for
        ever."""
        has_own, days = await self.own(tenant)
        if has_own:
            return days
        return None if self.default_days is None else as_days(check_days(self.default_days))

    async def period(self, tenant: str) -> float | None:
        """The period in force in seconds (None: kept for ever)."""
        days = await self.get(tenant)
        return None if days is None else days * DAY

    async def set(self, tenant: str, days: float | None) -> None:
        """The tenant's own period in days; None keeps its conversation memory for ever, whatever
        the default."""
        value = OFF if days is None else repr(check_days(days))
        await self.redis.set(retention_key(tenant), value)

    async def clear(self, tenant: str) -> None:
        """Drop the tenant's own setting: the default applies again."""
        await self.redis.delete(retention_key(tenant))

    # -- the sweep ------------------------------------------------------------------------------

    async def schedule(self, submit: Submit, now: float | None = None) -> list[str]:
        """Queue this interval's sweeps, if no process did yet, and finish the purges stopped
        processes left: returns the tenants queued (none when another process holds the
        interval's claim)."""
        now = time.time() if now is None else now
        bucket = int(now // self.sweep_seconds)
        ttl = max(1, math.ceil(self.sweep_seconds * 2))
        if not await self.redis.set(sweep_claim_key(bucket), str(now), nx=True, ex=ttl):
            return []
        queued = []
        seconds, micros = await self.redis.time()  # the clock of the erased-tenant notes
        for tenant in await self.memory.conversation.tenants():
            if await self.period(tenant) is not None:
                await submit(SWEEP, {"tenant": tenant, "queued_at": seconds + micros / 1e6})
                queued.append(tenant)
        try:  # after the sweeps are queued: a failure here does not keep them back
            await self.memory.governance.purge_leftovers()
        except Exception:  # Redis away: the next interval's claim tries again
            log.exception("the purges stopped processes left could not be finished")
        return queued

    async def sweep(
        self, tenant: str, now: float | None = None, queued_at: float | None = None
    ) -> Any:
        """Forget the tenant's conversation memory older than its period (read now) and note
        the sweep (`last_sweep`); returns the `Erasure`, or None when the tenant keeps
        everything, or when the whole tenant was erased at or after `queued_at` (a sweep queued
        before the erasure: nothing is written back into the erased tenant)."""
        period = await self.period(tenant)
        if period is None:
            return None
        now = time.time() if now is None else now

        async def note(erasure: Any) -> None:  # under the erasure lock
            swept = {"at": repr(now), "cutoff": repr(now - period), **asdict(erasure)}
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(retention_swept_key(tenant), mapping=swept)
            pipe.hincrby(retention_swept_key(tenant), "sweeps", 1)
            await pipe.execute()

        queued = math.inf if queued_at is None else queued_at  # not queued: run now
        return await self.memory.governance.sweep_retention(tenant, now - period, queued, note)

    async def sweep_tasks(self, payloads: list[dict]) -> None:
        """The `sweep_retention` handler: each tenant once, however often it was queued (as of
        its latest queueing; a task from before `queued_at` was kept counts as queued at 0).
        A tenant whose sweep is deferred (an import holds its erasure lock) holds back no other:
        the others are swept, and only its tasks are put back (`PartlyDeferred`), so no tenant
        is swept twice."""
        queued: dict[str, float] = {}
        for payload in payloads:
            tenant, at = str(payload["tenant"]), float(payload.get("queued_at") or 0)
            queued[tenant] = max(queued.get(tenant, at), at)
        deferred: dict[str, Deferred] = {}
        for tenant, at in queued.items():
            try:
                await self.sweep(tenant, queued_at=at)
            except Deferred as exc:
                deferred[tenant] = exc
        if deferred:
            held_back = [p for p in payloads if str(p["tenant"]) in deferred]
            raise PartlyDeferred(held_back, next(iter(deferred.values())))

    async def last_sweep(self, tenant: str) -> dict[str, float] | None:
        """When the tenant was last swept (`at`, `cutoff`), what went (per store), and how many
        sweeps ran (`sweeps`); None before the first."""
        row = await self.redis.hgetall(retention_swept_key(tenant))
        if not row:
            return None
        return {decode(k): float(decode(v)) for k, v in row.items()}
