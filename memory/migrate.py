"""The one-time upgrade steps run at start-up: the move of keys to the hash-tagged layout
(memory/keys.py), then the tidying of the shown-in-logs sets (`tidy_shown_in_logs`).

Before, a tenant's keys were `arxivscout:t:<tenant>:...`, the task stream `arxivscout:tasks` and
a cached vector `arxivscout:embcache:<model>:<digest>`; now the tenant, `tasks` and the model
stand in braces (hash tags), so that every script, MULTI and MGET touches keys of one hash slot.
The vector stores' documents keep their names, so every index keeps its prefix and nothing is
re-indexed.

Each key moves by DUMP, RESTORE under its new name (with what is left of its time to live) and
DEL: each command names one key, so the move also runs on a sharded Redis, where a RENAME
between two slots is refused. A new name that is already taken keeps its value, and the old
key stays where it is, logged, unless both hold the same value (a move stopped between its
RESTORE and its DEL): then the old copy goes. Processes of the older version must be stopped
first: one that kept writing under the old names would write where nobody reads.

Before deleting a tool log took it out of the shown-in-logs sets of what it showed
(memory/stores/tool_log.py), the logs gone by retention, forgetting or erasure stayed in them:
a set no live log is in stays for ever, and forgetting its message reads them all again. The
tidying takes those ids out once, by one process, while the others run: an id goes only when
its log is absent as it is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from memory.coordination import Upgrades
from memory.keys import (
    LEGACY_PATTERNS,
    legacy_renames,
    shown_in_logs_of_key,
    shown_in_logs_pattern,
    tagged_key,
    upgrade_key,
)
from memory.locks import OwnedLocks
from memory.stores.base import decode
from memory.stores.tool_log import ToolLogStore

log = logging.getLogger(__name__)

UPGRADE = "hash-tags"
SHOWN_SETS = "shown-in-logs-leftovers"  # the tidying of sets that kept ids of logs gone
CLAIM_SECONDS = 600  # a process that died while moving keys frees the step after this
POLL_SECONDS = 0.2
BATCH = 200  # keys moved concurrently (their commands share round trips)


@dataclass
class MoveReport:
    moved: int = 0
    kept: int = 0  # old keys left in place because their new name was taken


async def migrate_to_hash_tags(redis: Redis, upgrades: Upgrades) -> MoveReport:
    """Move the keys of the older layout, once per Redis. A process that finds another one
    moving them waits until it is done: it must not read before the keys are where it looks."""
    while not await upgrades.done(UPGRADE):
        if await upgrades.claim(UPGRADE, CLAIM_SECONDS):
            try:
                report = await move_legacy_keys(redis)
            except BaseException:
                with contextlib.suppress(RedisError, OSError):  # Redis may be what failed
                    await redis.delete(upgrade_key(UPGRADE))  # the next start tries again
                raise
            await upgrades.finish(UPGRADE)
            return report
        await asyncio.sleep(POLL_SECONDS)
    return MoveReport()


async def tidy_shown_in_logs(redis: Redis, upgrades: Upgrades, tool_logs: ToolLogStore) -> int:
    """Take the ids of logs gone out of the shown-in-logs sets, once per Redis; how many went.
    Safe while other processes run, so none waits for it. Only tidying (an id of no log is
    skipped where the sets are read): a failure is logged, not raised, and the step runs
    again at the next start, as after a crash midway."""
    if await upgrades.done(SHOWN_SETS) or not await upgrades.claim(SHOWN_SETS, CLAIM_SECONDS):
        return 0
    claim = OwnedLocks(redis).kept(  # renewed while it runs: a big keyspace takes long
        upgrade_key(SHOWN_SETS), Upgrades.RUNNING, CLAIM_SECONDS * 1000, name=SHOWN_SETS
    )
    try:
        # released at its end however it ends (cancelled too), unless `finish` recorded the
        # step done; if Redis is what failed, the claim lapses
        async with claim:
            removed = await drop_leftover_shown(redis, tool_logs)
            await upgrades.finish(SHOWN_SETS)
    except Exception:
        log.exception("the shown-in-logs sets were not tidied; the next start tries again")
        return 0
    return removed


async def drop_leftover_shown(redis: Redis, tool_logs: ToolLogStore) -> int:
    """Every tenant's shown-in-logs sets, found by SCAN in batches, rid of the ids of logs
    absent (`ToolLogStore.drop_absent`); harmless to run again."""
    removed, batch = 0, []
    async for raw in redis.scan_iter(match=shown_in_logs_pattern(), count=1000, _type="set"):
        if (found := shown_in_logs_of_key(decode(raw))) is not None:
            batch.append(found)
        if len(batch) >= BATCH:
            removed += await tool_logs.drop_absent(await tool_logs.indexed(batch))
            batch = []
    removed += await tool_logs.drop_absent(await tool_logs.indexed(batch))
    if removed:
        log.warning("shown-in-logs: %d ids of tool logs gone taken out", removed)
    return removed


async def move_legacy_keys(redis: Redis) -> MoveReport:
    """Move every key of the older layout to its new name; harmless to run again."""
    report = MoveReport()
    moves = list(legacy_renames().items())
    for pattern in LEGACY_PATTERNS:
        async for raw in redis.scan_iter(match=pattern, count=1000):
            old = decode(raw)
            new = tagged_key(old)  # None for the keys already tagged
            if new is not None:
                moves.append((old, new))
            if len(moves) >= BATCH:
                await _move_all(redis, moves, report)
                moves = []
    await _move_all(redis, moves, report)
    if report.moved or report.kept:
        log.warning("hash tags: %d keys moved, %d kept apart", report.moved, report.kept)
    return report


async def _move_all(redis: Redis, moves: list[tuple[str, str]], report: MoveReport) -> None:
    for outcome in await asyncio.gather(*(_move(redis, old, new) for old, new in moves)):
        if outcome == "moved":
            report.moved += 1
        elif outcome == "kept":
            report.kept += 1


async def _move(redis: Redis, old: str, new: str) -> str:
    """'moved', 'kept' (the new name was taken by another value) or 'gone' (no old key)."""
    payload, ttl_ms = await asyncio.gather(redis.dump(old), redis.pttl(old))
    if payload is None or ttl_ms == -2:
        return "gone"
    try:
        await redis.restore(new, max(ttl_ms, 0), payload)
    except ResponseError as exc:
        if "BUSYKEY" not in str(exc):
            raise
        if await redis.dump(new) != payload:
            log.warning("hash tags: %s was not moved: %s exists; both are kept", old, new)
            return "kept"
    await redis.delete(old)
    return "moved"
