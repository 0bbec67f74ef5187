"""Durable background tasks: a Redis stream read through a consumer group.

Work that must happen after a reply (workflows, entities, later indexing and summaries) is
added to the stream before the reply goes out, so a crash cannot lose it. Consumers read new
entries with XREADGROUP; an entry stays in the group's pending list until XACK, and a live
process takes over a dead consumer's entries with XAUTOCLAIM. Delivery is at least once, so
handlers must be idempotent. Acknowledged entries are deleted at once (XACK + XDEL), which
keeps the stream small and makes its length the number of unfinished tasks; this assumes one
consumer group per stream. Tasks given up on go to `<stream>:dead`, from where
memory/dead_letters.py's `requeue` puts them back (`arxivscout tasks`); a process shutting
down gives back what it read but never ran (`give_back`), so a deploy spends no delivery.
When a handler starts, the delivery its run began on is written to `<stream>:started`
(`mark_started`, one write per batch; cleared with the ack or the dead letter): a task claimed
past its last delivery is buried unrun only if that run really began (a delivery spent
without a run, a SIGKILL before it started, is not).
A requeued task's payload says `requeued` (its dead letter's id): a kind that keeps progress of
its own across runs starts it afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis.asyncio as aredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from memory.errors import Deferred
from memory.keys import (
    InvalidName,
    dead_letter_streams_key,
    dead_letters_key,
    erased_tenant_key,
    task_runs_key,
)

DEAD_MAXLEN = 10_000  # dead letters are for inspection; bound them (approximately)
PAYLOAD_DEPTH = 4  # how deep a payload is searched for its tenant
TENANT_FIELDS = ("tenant", "team")  # how payloads name theirs (`team`: Slack's /summarize)

# Reset the idle time of the entries (ARGV[3..]) that consumer ARGV[2] of group ARGV[1] still
# holds, and only those: XCLAIM alone would take an entry over from whoever holds it now.
# JUSTID leaves the delivery count alone. Returns how many were still held.
_KEEP_ALIVE_SCRIPT = """
local held = 0
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    held = held + 1
  end
end
return held
"""

# Hand back the entries (ARGV[4..]) that consumer ARGV[2] of group ARGV[1] read but never ran:
# each with the delivery its read counted taken back (RETRYCOUNT) and idle for ARGV[3] ms, so
# any live process claims it at once and a restart spends no delivery. Only entries it still
# holds. With KEYS[2] (the started hash, for a task put back after its run began), their
# started marks go too. Returns how many went back.
_GIVE_BACK_SCRIPT = """
local given = 0
for i = 4, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == ARGV[2] then
    local count = math.max(tonumber(row[4]) - 1, 0)
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3],
               'RETRYCOUNT', count, 'JUSTID')
    if KEYS[2] then
      redis.call('HDEL', KEYS[2], ARGV[i])
    end
    given = given + 1
  end
end
return given
"""


class PartlyDeferred(Deferred):
    """A batch's handler did its other tasks' work and only `payloads`' cannot be done now:
    those are put back (bot/background.py) and the others acknowledged, not run again."""

    def __init__(self, payloads: list[dict], reason: Deferred) -> None:
        super().__init__(str(reason))
        self.payloads = payloads


@dataclass(frozen=True)
class Task:
    id: str
    kind: str
    payload: dict
    deliveries: int = 1


def requeued(payload: dict) -> str | None:
    """The dead letter a task was requeued from (`arxivscout tasks requeue`), if it was."""
    value = payload.get("requeued")
    return str(value) if value else None


def payload_tenants(payload: Any, depth: int = PAYLOAD_DEPTH) -> set[str]:
    """The tenants a task's payload names: a `tenant` (or `team`) field anywhere in it (its
    own, its scope's, its watch's)."""
    if depth < 0:
        return set()
    found: set[str] = set()
    if isinstance(payload, dict):
        found |= {v for f in TENANT_FIELDS if isinstance(v := payload.get(f), str) and v}
        payload = list(payload.values())
    if isinstance(payload, list):
        for value in payload:
            found |= payload_tenants(value, depth - 1)
    return found


def queued_at(task_id: str) -> float:
    """When a task was added: its stream id's milliseconds (0 for an id of another shape)."""
    try:
        return int(task_id.split("-", 1)[0]) / 1000
    except ValueError:
        return 0.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def default_consumer() -> str:
    """Unique per process (and per instance): a restarted process must not inherit the
    pending entries of its previous life under the same name, they are claimed instead."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class TaskStream:
    """One stream of tasks, read by the consumer group `group` as `consumer`. Its dead letters
    go to `<stream>:dead` in the same MULTI as the ack: on a sharded Redis, name the stream
    with a hash tag (as `task_stream()` does) so both lie in one slot."""

    def __init__(
        self, redis: aredis.Redis, stream: str, group: str = "workers", consumer: str | None = None
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer or default_consumer()
        self.dead_stream = dead_letters_key(stream)
        self.runs = task_runs_key(stream)  # task id -> the delivery its last started run began
        self._keep_alive: AsyncScript | None = None  # registered on first use
        self._give_back: AsyncScript | None = None

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; from id 0, so tasks added before the
        group existed are delivered too."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def add(self, kind: str, payload: dict) -> str:
        """Queue a task; durable (as far as Redis persists) once this returns. Never trimmed."""
        fields = {"kind": kind, "payload": json.dumps(payload, separators=(",", ":"))}
        return _text(await self.redis.xadd(self.stream, fields))

    async def read(self, count: int, block_ms: int) -> list[Task]:
        """New entries for this consumer, waiting up to `block_ms` for some to arrive."""
        reply = await self._recreating_group(
            partial(
                self.redis.xreadgroup,
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms,
            )
        )  # fmt: skip
        return [task for entries in _streams(reply) for task in _tasks(entries)]

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Task]:
        """Take over up to `count` entries delivered at least `min_idle_ms` ago and not acked
        (their consumer died, or their handler failed), with their delivery counts."""
        claimed: list[Task] = []
        cursor = "0-0"
        while len(claimed) < count:
            reply = await self._recreating_group(
                partial(
                    self.redis.xautoclaim, self.stream, self.group, self.consumer, min_idle_ms,
                    start_id=cursor, count=count - len(claimed),
                )
            )  # fmt: skip
            if not reply:
                break
            # Entries deleted meanwhile come back as nil (Redis 6.2) or in reply[2] (7+): skip.
            claimed += _tasks(reply[1])
            cursor = _text(reply[0])
            if cursor == "0-0":
                break
        if not claimed:
            return []
        counts = await self._delivery_counts([t.id for t in claimed], self.consumer)
        return [Task(t.id, t.kind, t.payload, counts.get(t.id, t.deliveries)) for t in claimed]

    async def keep_alive(self, tasks: Iterable[Task]) -> int:
        """Tell the group these tasks are still being worked on (their idle time starts
        again), so that no process takes them over while a long handler runs. Entries another
        consumer has taken over meanwhile are left with it. Returns how many are still ours."""
        ids = [t.id for t in tasks]
        if not ids:
            return 0
        if self._keep_alive is None:
            self._keep_alive = self.redis.register_script(_KEEP_ALIVE_SCRIPT)
        held = await self._keep_alive(keys=[self.stream], args=[self.group, self.consumer, *ids])
        return int(held)

    async def give_back(self, tasks: Iterable[Task], idle_ms: int, *, ran: bool = False) -> int:
        """Hand back tasks read but never run (a graceful shutdown): the delivery their read
        counted is taken back, and they look idle for `idle_ms`, so another process claims
        them at once. Those another consumer took meanwhile stay with it. Returns how many.
        `ran`: their run began and was put off (`Deferred`); their started mark goes too, or
        the next claim, back on the same delivery, would take one lost before its run for a
        run that never ended, and dead-letter the task unrun."""
        ids = [t.id for t in tasks]
        if not ids:
            return 0
        if self._give_back is None:
            self._give_back = self.redis.register_script(_GIVE_BACK_SCRIPT)
        keys = [self.stream, self.runs] if ran else [self.stream]
        args = [self.group, self.consumer, idle_ms, *ids]
        return int(await self._give_back(keys=keys, args=args))

    async def mark_started(self, tasks: Iterable[Task]) -> None:
        """Record that these tasks' handler starts now, on their current delivery (one write
        for the batch): what tells a run that never ended from a delivery never run."""
        started = {t.id: t.deliveries for t in tasks}
        if started:
            await self.redis.hset(self.runs, mapping=started)

    async def started_on(self, tasks: Iterable[Task]) -> dict[str, int]:
        """The delivery on which each task's last started run began (absent: none began)."""
        ids = [t.id for t in tasks]
        if not ids:
            return {}
        values = await self.redis.hmget(self.runs, ids)
        return {i: int(v) for i, v in zip(ids, values, strict=True) if v is not None}

    async def unmark(self, tasks: Iterable[Task]) -> None:
        """Forget the started marks of tasks whose run ended without an outcome (a batch
        deferred, its tasks to be run alone): a task killed before its own run began is then
        run when claimed again, not taken for one whose last run never ended."""
        ids = [t.id for t in tasks]
        if ids:
            await self.redis.hdel(self.runs, *ids)

    async def ack(self, tasks: Iterable[Task]) -> None:
        """Acknowledge and delete, atomically: the stream holds only unfinished tasks."""
        ids = [t.id for t in tasks]
        if not ids:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, self.group, *ids)
            pipe.xdel(self.stream, *ids)
            pipe.hdel(self.runs, *ids)
            await pipe.execute()

    async def destroy(self) -> None:
        """Delete the stream and its dead letters (a throwaway stream, e.g. an eval run's)."""
        await self.redis.delete(self.stream)
        await self.redis.delete(self.dead_stream)
        await self.redis.delete(self.runs)
        await self.redis.srem(dead_letter_streams_key(), self.stream)

    async def pending_count(self) -> int:
        """Tasks not yet acknowledged, delivered or not (the stream's length, see above)."""
        return int(await self.redis.xlen(self.stream))

    async def present(self, ids: Iterable[str]) -> set[str]:
        """Those of `ids` still on the stream (not yet acknowledged): one XRANGE each, in one
        round trip on the one key."""
        ids = list(ids)
        if not ids:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.xrange(self.stream, task_id, task_id, count=1)
            found = await pipe.execute()
        return {i for i, entries in zip(ids, found, strict=True) if entries}

    async def deliveries(self, task_id: str) -> int:
        """How many times the task was delivered; 0 if it is not pending."""
        counts = await self._delivery_counts([task_id], consumer=None)
        return counts.get(task_id, 0)

    async def dead_letter(self, task: Task, error: str) -> None:
        """Give up on a task: copy it with its error to `<stream>:dead`, then ack it. Not
        copied when its tenant was erased after it was queued (`erased_since`): the erasure
        dropped its tenant's dead letters, one written after would keep what it erased."""
        if await self.erased_since(task):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xack(self.stream, self.group, task.id)
                pipe.xdel(self.stream, task.id)
                pipe.hdel(self.runs, task.id)
                await pipe.execute()
            return
        fields = {
            "id": task.id,
            "kind": task.kind,
            "payload": json.dumps(task.payload, separators=(",", ":")),
            "deliveries": str(task.deliveries),
            "error": error,
            "consumer": self.consumer,
        }
        await self.redis.sadd(dead_letter_streams_key(), self.stream)  # before: a superset
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_stream, fields, maxlen=DEAD_MAXLEN, approximate=True)
            pipe.xack(self.stream, self.group, task.id)
            pipe.xdel(self.stream, task.id)
            pipe.hdel(self.runs, task.id)
            await pipe.execute()

    async def erased_since(self, task: Task) -> bool:
        """Whether a tenant the task's payload names was erased whole after the task was
        queued (its note, kept a day: memory/governance_tenants.py)."""
        keys = []
        for tenant in payload_tenants(task.payload):
            with contextlib.suppress(InvalidName):  # a name no tenant has: never erased
                keys.append(erased_tenant_key(tenant))
        notes = await asyncio.gather(*(self.redis.get(key) for key in keys))  # one slot each
        return any(float(t) >= queued_at(task.id) for t in notes if t is not None)

    async def _delivery_counts(self, ids: list[str], consumer: str | None) -> dict[str, int]:
        """XPENDING (extended form) per id, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.xpending_range(
                    self.stream, self.group, min=task_id, max=task_id, count=1,
                    consumername=consumer,
                )  # fmt: skip
            replies = await pipe.execute()
        return {
            _text(row["message_id"]): int(row["times_delivered"])
            for rows in replies
            for row in rows
        }

    async def _recreating_group(self, command: Callable[[], Awaitable[Any]]) -> Any:
        """Run a group command; if the stream or group vanished (flushed, deleted), recreate
        the group and try once more."""
        try:
            return await command()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        await self.ensure_group()
        return await command()


def _streams(reply: Any) -> list[Any]:
    """XREADGROUP's entries per stream, whichever shape the client returns (list or dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.values())
    return [entries for _name, entries in reply]


def _tasks(entries: Any) -> list[Task]:
    tasks = []
    for entry in entries or []:
        if entry is None or entry[0] is None or not entry[1]:
            continue  # an entry deleted while pending
        tasks.append(_task(_text(entry[0]), {_text(k): v for k, v in entry[1].items()}))
    return tasks


def _task(task_id: str, fields: dict[str, Any]) -> Task:
    """A malformed entry (not written by `add`) becomes a task of kind "invalid", which no
    handler takes: it fails, and is dead-lettered, instead of wedging the consumer."""
    kind = _text(fields.get("kind", ""))
    try:
        payload = json.loads(fields["payload"])
        if isinstance(payload, dict) and kind:
            if "requeued" in fields:  # said to its handler, which may start its progress afresh
                payload["requeued"] = _text(fields["requeued"])
            return Task(task_id, kind, payload)
    except (KeyError, ValueError):
        pass
    return Task(task_id, "invalid", {_text(k): _text(v) for k, v in fields.items()})
