"""Dead letters: the tasks a `TaskStream` gave up on (`TaskStream.dead_letter` writes them to
its `dead_letters_key`), read and put back by an operator (`arxivscout tasks`). A requeued
task's payload says `requeued` (its dead letter's id: `memory.tasks.requeued`).

A dead letter keeps its task's payload: people's words (an `episodes` task's messages, an
`artifacts` task's question and answer, an edit's new text, a share's turn). An erasure drops
those of what it forgot (`forget_dead_letters`, with a `Forgotten`): a thread's, a message's, a
person's, what is older than the retention cutoff.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from memory.keys import (
    dead_letter_streams_key,
    dead_letters_key,
    dead_letters_pattern,
    upgrade_key,
)
from memory.tasks import TaskStream

REGISTRY_UPGRADE = "dead-letter-streams"  # the note of streams with dead letters, filled once
SUFFIX = dead_letters_key("")  # a dead-letter stream's key is its task stream's and this

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
    """Every task stream of the deployment that has dead letters, in name order: those
    `TaskStream.dead_letter` noted (`dead_letter_streams_key`; the streams are named in several
    places, some per platform), and once, those of before that note, found by their keys."""
    if not await redis.exists(upgrade_key(REGISTRY_UPGRADE)):  # two processes may both scan
        async for key in redis.scan_iter(match=dead_letters_pattern(), count=1000, _type="stream"):
            await redis.sadd(dead_letter_streams_key(), _text(key).removesuffix(SUFFIX))
        await redis.set(upgrade_key(REGISTRY_UPGRADE), "1")
    streams = sorted(_text(s) for s in await redis.smembers(dead_letter_streams_key()))
    held = [bool(await redis.exists(dead_letters_key(s))) for s in streams]  # one key each
    return [TaskStream(redis, s, group) for s, h in zip(streams, held, strict=True) if h]


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


# -- erasure ------------------------------------------------------------------------------------

PAGE = 500  # dead letters read per XRANGE
KNOWN_KINDS = frozenset({  # payloads read field by field (`_Named`); others by their strings
    "episodes", "roll", "artifacts", "deleted-message", "edited-message", "shared_files",
})  # fmt: skip


@dataclass(frozen=True)
class Forgotten:
    """What an erasure took from one tenant: a dead letter of the tenant whose payload names
    any of it goes. `before`: retention's cutoff (a task queued, or a message said, before)."""

    tenant: str
    threads: frozenset[str] = frozenset()
    messages: frozenset[str] = frozenset()  # message ids
    sources: frozenset[str] = frozenset()  # the platform's ids of those messages
    texts: frozenset[str] = frozenset()  # what they said (an artifacts task's answer)
    people: frozenset[str] = frozenset()  # platform user ids
    before: float | None = None

    def __or__(self, other: Forgotten) -> Forgotten:
        """What two erasures of the tenant took: one pass over the dead letters for both."""
        befores = [b for b in (self.before, other.before) if b is not None]
        return Forgotten(
            self.tenant, self.threads | other.threads, self.messages | other.messages,
            self.sources | other.sources, self.texts | other.texts, self.people | other.people,
            max(befores, default=None),
        )  # fmt: skip

    def is_empty(self) -> bool:
        """Nothing to look for: no dead letter is read (each pass reads every one)."""
        named = self.threads | self.messages | self.sources | self.texts | self.people
        return not named and self.before is None

    def holds(self, letter: DeadLetter) -> bool:
        """Whether `letter` carries something of this erasure."""
        if letter.kind not in KNOWN_KINDS or not isinstance(letter.payload, dict):
            return self._named_anywhere(letter)
        named = _Named.of(letter)
        if named.tenant != self.tenant:
            return False
        if self.before is not None and min(named.times, default=self.before) < self.before:
            return True
        return bool(
            named.threads & self.threads or named.messages & self.messages
            or named.sources & self.sources or named.texts & self.texts
            or named.people & self.people
        )  # fmt: skip

    def _named_anywhere(self, letter: DeadLetter) -> bool:
        """A payload not read field by field (a digest's, a summary's, a malformed one): it
        goes when one of its strings is the tenant and another names what went."""
        strings = set(_strings(letter.payload))
        if self.tenant not in strings:
            return False
        if self.before is not None and _task_time(letter) < self.before:
            return True
        wanted = self.threads | self.messages | self.sources | self.people
        return bool(strings & wanted)


@dataclass(frozen=True)
class _Named:
    """What a payload of a known kind names: its tenant, threads, messages (ids, the
    platform's ids, texts), people, and times (when queued, when said)."""

    tenant: str
    threads: frozenset[str]
    messages: frozenset[str]
    sources: frozenset[str]
    texts: frozenset[str]
    people: frozenset[str]
    times: tuple[float, ...]

    @classmethod
    def of(cls, letter: DeadLetter) -> _Named:
        payload: dict[str, Any] = letter.payload
        scope = _dict(payload.get("scope"))
        said = [_dict(m) for m in _list(payload.get("messages"))]  # episodes
        asked = _dict(payload.get("asked"))  # artifacts
        threads = [
            scope.get("thread"),
            *_list(payload.get("threads")),
            *_dict(payload.get("places")),
        ]
        sources = [payload.get("source"), payload.get("share")]
        sources += [_dict(m.get("metadata")).get("source") for m in said]
        texts = [payload.get(k) for k in ("question", "answer", "text")] + [asked.get("text")]
        texts += [m.get("content") for m in said]
        people = [scope.get("user"), payload.get("sharer")]
        people += [m.get("author") for m in said if m.get("role") == "user"]
        times = [_task_time(letter), *(m.get("timestamp") for m in said)]
        times += [payload.get(k) for k in ("at", "queued_at")]
        return cls(
            str(payload.get("tenant") or scope.get("tenant") or ""), _set(threads),
            _set([*(m.get("id") for m in said), asked.get("id")]), _set(sources), _set(texts),
            _set(people), tuple(float(t) for t in times if isinstance(t, int | float)),
        )  # fmt: skip


async def forget_dead_letters(redis: aredis.Redis, forgotten: Forgotten) -> int:
    """Delete, in every task stream's dead letters, those holding something of `forgotten`
    (one key per command: each stream's own). Returns how many went. Each call reads every
    dead letter of the deployment: an erasure collects what it took and calls this once
    (memory/governance_threads.py `ThreadEraser.dead_letters_once`)."""
    if forgotten.is_empty():
        return 0
    dropped = 0
    for stream in await dead_letter_streams(redis):
        start = "-"
        while entries := await redis.xrange(stream.dead_stream, start, "+", count=PAGE):
            doomed = [
                i for i, f in ((_text(i), f) for i, f in entries)
                if forgotten.holds(_dead_letter(stream.stream, i, f))
            ]  # fmt: skip
            if doomed:
                dropped += int(await redis.xdel(stream.dead_stream, *doomed))
            start = "(" + _text(entries[-1][0])
            if len(entries) < PAGE:
                break
    return dropped


def _task_time(letter: DeadLetter) -> float:
    """When its task was queued (its id's time), else when it was dead-lettered."""
    try:
        return int(letter.task_id.split("-", 1)[0]) / 1000
    except ValueError:
        return letter.dead_at


def _strings(value: Any) -> Iterator[str]:
    """Every string in a payload, keys too; a string that is JSON (a queued turn) opened."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value
        yield from _strings(_json(value)) if value[:1] in ("{", "[") else ()


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _set(values: list[Any]) -> frozenset[str]:
    return frozenset(str(v) for v in values if v and isinstance(v, str))
