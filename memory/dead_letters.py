"""Dead letters: the tasks a `TaskStream` gave up on (`TaskStream.dead_letter` writes them to
its `dead_letters_key`), read and put back by an operator (`arxivscout tasks`). A requeued
task's payload says `requeued` (its dead letter's id: `memory.tasks.requeued`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from memory.keys import dead_letters_key, dead_letters_pattern
from memory.tasks import TaskStream

# Put the dead letter ARGV[1] of KEYS[2] (`<stream>:dead`) back on its stream KEYS[1] as a new
# task, marked `requeued` (with the dead letter's id, which its handler sees in the payload):
# added and removed in one atomic step, so it is never lost nor doubled (of two
# requeues at once, one finds it gone). Returns the new task's id, or nil.
_REQUEUE_SCRIPT = """
local entry = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])[1]
if not entry then return false end
local fields = {}
for i = 1, #entry[2], 2 do fields[entry[2][i]] = entry[2][i + 1] end
local id = redis.call('XADD', KEYS[1], '*', 'kind', fields['kind'] or 'invalid',
                      'payload', fields['payload'] or '{}', 'requeued', ARGV[1])
redis.call('XDEL', KEYS[2], ARGV[1])
return id
"""


class UnknownDeadLetter(LookupError):
    """A dead letter asked for that is not (or no longer) there."""


@dataclass(frozen=True)
class DeadLetter:
    """A task given up on, as `dead_letter` wrote it to `<stream>:dead` (entry `id`)."""

    stream: str  # the task stream's key
    id: str
    task_id: str
    kind: str
    payload: Any  # as queued: JSON-decoded if it decodes
    deliveries: int
    error: str
    consumer: str

    @property
    def dead_at(self) -> float:
        """When it was dead-lettered (seconds since the epoch): its entry id's time."""
        return int(self.id.split("-", 1)[0]) / 1000


async def dead_letters(stream: TaskStream) -> list[DeadLetter]:
    """The tasks `stream` gave up on, oldest first (at most DEAD_MAXLEN, roughly)."""
    entries = await stream.redis.xrange(stream.dead_stream)
    return [_dead_letter(stream.stream, _text(i), fields) for i, fields in entries]


async def requeue(stream: TaskStream, dead_id: str) -> str | None:
    """Queue a dead letter again as a fresh task (its deliveries from 0), removing it from
    the dead letters in the same atomic step. Its new id; None if it was not there."""
    script = stream.redis.register_script(_REQUEUE_SCRIPT)
    new_id = await script(keys=[stream.stream, stream.dead_stream], args=[dead_id])
    return None if new_id is None else _text(new_id)


async def dead_letter_streams(redis: aredis.Redis, group: str = "workers") -> list[TaskStream]:
    """Every task stream of the deployment that has dead letters, found by their keys (the
    streams are named in several places, some per platform), in name order."""
    found = {
        _text(key)
        async for key in redis.scan_iter(match=dead_letters_pattern(), count=1000, _type="stream")
    }
    return [
        TaskStream(redis, key.removesuffix(dead_letters_key("")), group) for key in sorted(found)
    ]


def _dead_letter(stream: str, dead_id: str, raw: dict[Any, Any]) -> DeadLetter:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    try:
        payload: Any = json.loads(fields.get("payload", ""))
    except ValueError:
        payload = fields.get("payload", "")
    try:
        deliveries = int(fields.get("deliveries", 0))
    except ValueError:
        deliveries = 0
    return DeadLetter(
        stream, dead_id, fields.get("id", ""), fields.get("kind", ""), payload, deliveries,
        fields.get("error", ""), fields.get("consumer", ""),
    )  # fmt: skip


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
