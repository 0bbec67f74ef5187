"""Conversation memory: every message of a thread, in a Redis list, oldest first.

Summarized messages always form a prefix of the list (a summary covers the oldest unsummarized
messages, all of them or the first n), so the unsummarized ones are a suffix: the thread's
recent window. The prefix's length is kept in a counter beside the list, so reading the window
is one script (the counter and an LRANGE from it); threads from before the counter are scanned
from the end once and the counter stored. Marking messages with a summary id is one Lua script
that checks each element is still what the summarizer read and that the marked messages extend
the summarized prefix, moves the counter and stores the summary (hash and index entry) with
them: a concurrent append is never lost or marked, and no summary is listed that marks nothing.

A forgotten message (memory/governance.py) stays in its place as a tombstone: no content, no
author, `forgotten` set; its id, role, position, timestamp and summary id are kept, so no
position moves and the summarized prefix stays a prefix. Replacing it is a compare-and-set
too (`replace`). Every reader of messages skips tombstones: the recent window, summaries'
notes, episodic indexing, `all`; only the summarizers' snapshots keep them, for their positions.
A tombstone keeps no author, so the append of a DM's message records whose DM the place is
(`dm_people_key`): erasing that person takes the DM's threads whole (memory/governance_sweeps.py).

While an import runs in a tenant (memory/portability.py: from right after it takes its lock
to its end, `import_running_key` is set), appends there are refused (`MemoryRestoring`): the
import pushes a thread's old messages with positions of its own and sets its score and
summarized counter, so a live message in a thread the file also holds would share a position
with one of them and sink under them. A crashed import's key lapses with its lock: the bot
writes again, and the next import refuses that used tenant rather than wipe what was said since.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from memory.keys import (
    appended_id_key,
    appended_key,
    dm_people_key,
    import_running_key,
    messages_key,
    summarized_count_key,
    summarizing_key,
    tenant_of_key,
    tenants_pattern,
    threads_key,
)
from memory.locks import OwnedLocks
from memory.scope import Scope, Visibility
from memory.stores.base import Segment, decode
from memory.text import clean_text
from memory.tokens import count_tokens

# What a person may send in one message. The bot's own answers are stored whole, however long:
# refusing one would lose it and blame the user (delivery caps what is shown instead).
MAX_MESSAGE_CHARS = 200_000

# One command that appends a message and lists its thread: atomic like MULTI/EXEC, and sent
# in the same batch as whatever else the turn (or a burst of turns) is asking Redis.
# The message's position in its thread (`seq`, the JSON's last field) is filled in here.
# With fifth and sixth keys (an idempotency key, see `appended_key`, and `appended_id_key`),
# the append records where it stored which message (its position stays a bare number, as the
# version before reads it), and a second append under it stores nothing and returns that
# record. A DM's message (ARGV[6] its audience, ARGV[7] its person) records whose DM the place
# is in the tenant's DM-people hash (KEYS[3], `dm_people_key`). While an import runs in the
# tenant (KEYS[4], `import_running_key`), nothing is stored. The thread's index is written with
# its message, so an import that set its key sees every message stored before (its emptiness
# check) and none after. Returns {seq, ""} when stored, {-1, "<seq> <id>"} when appended
# before, {-2, ""} when an import running refused it.
_APPEND_SCRIPT = """
if KEYS[5] then
  local prior = redis.call('GET', KEYS[5])
  if prior then return {-1, prior .. ' ' .. (redis.call('GET', KEYS[6]) or '')} end
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {-2, ''} end
local seq = redis.call('LLEN', KEYS[1])
local json = string.gsub(ARGV[1], '"seq":%-1}$', '"seq":' .. seq .. '}')
redis.call('RPUSH', KEYS[1], json)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[3], ARGV[6], ARGV[7]) end
if KEYS[5] then
  redis.call('SET', KEYS[5], seq, 'EX', ARGV[4])
  redis.call('SET', KEYS[6], ARGV[5], 'EX', ARGV[4])
end
return {seq, ''}
"""
_IMPORTING = -2  # the append script's reply when an import running refused the message
ONCE_TTL_SECONDS = 7 * 24 * 3600

_MARK_SCRIPT = """
-- KEYS[1] list, KEYS[2] summarized-prefix counter, optionally KEYS[3] the summary's hash and
-- KEYS[4] its thread's index; ARGV[1] first index, ARGV[2] n, then n pairs (expected,
-- replacement), then (with KEYS[3]) the summary id, its score and its hash's field/value pairs
local first = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
-- its summary stored and the first message marked with it: a resend of a marking that ran, a
-- message edited or forgotten since (the summary was rewritten in place: not written again)
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  local at = redis.call('LINDEX', KEYS[1], first)
  if at and cjson.decode(at)['summary_id'] == ARGV[3 + 2 * n] then return n end
end
if first > 0 then
  local before = redis.call('LINDEX', KEYS[1], first - 1)
  local sid = before and cjson.decode(before)['summary_id']
  if type(sid) ~= 'string' or sid == '' then
    return redis.error_reply('CHANGED message ' .. (first - 1) .. ' is not summarized: '
      .. 'the summarized messages would not be a prefix')
  end
end
local done = 0
for i = 0, n - 1 do
  local current = redis.call('LINDEX', KEYS[1], first + i)
  if current == ARGV[4 + 2 * i] then
    done = done + 1
  elseif current ~= ARGV[3 + 2 * i] then
    return redis.error_reply('CHANGED message ' .. (first + i) .. ' changed during summarization')
  end
end
if done == n then return n end  -- a resend of a marking that ran (its reply was lost)
if done > 0 then
  return redis.error_reply('CHANGED messages from ' .. first .. ' changed during summarization')
end
if KEYS[3] then  -- first: an error here (a key of another type) leaves no message marked
  redis.call('HSET', KEYS[3], unpack(ARGV, 5 + 2 * n))
  redis.call('ZADD', KEYS[4], ARGV[4 + 2 * n], ARGV[3 + 2 * n])
end
for i = 0, n - 1 do
  redis.call('LSET', KEYS[1], first + i, ARGV[4 + 2 * i])
end
redis.call('SET', KEYS[2], first + n)
return n
"""

# Replace messages in place where they are still what was read: ARGV triples (index, expected,
# replacement). Returns the indexes that differed (nothing is replaced there).
_REPLACE_SCRIPT = """
local changed = {}
for i = 1, #ARGV, 3 do
  local index = tonumber(ARGV[i])
  if redis.call('LINDEX', KEYS[1], index) == ARGV[i + 1] then
    redis.call('LSET', KEYS[1], index, ARGV[i + 2])
  else
    table.insert(changed, index)
  end
end
return changed
"""

# The counter and the list from one message before it (to check the counter), atomically.
_TAIL_SCRIPT = """
local count = redis.call('GET', KEYS[2])
if not count then return {-1, {}} end
count = tonumber(count)
local start = count > 0 and count - 1 or 0
return {count, redis.call('LRANGE', KEYS[1], start, -1)}
"""

# Store a counter found by scanning, unless it was moved meanwhile (compare-and-set).
_SET_COUNT_SCRIPT = """
local current = redis.call('GET', KEYS[1]) or '-1'
if current == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end
return 0
"""

ITEM_SEPARATOR = "\n\n"  # between two items of a rendered segment (Segment.render)


class InvalidMessage(ValueError):
    """A message that cannot be stored (empty, a user's that is too long, wrong role)."""


class MemoryRestoring(InvalidMessage):
    """The tenant's memory is being restored from an export: the message is not stored (it
    would be mixed up with the import's), and the person is asked to send it again shortly.
    An InvalidMessage, so the turn path says it as the message refused (bot/turns.py)."""

    def __init__(self) -> None:
        super().__init__(
            "my memory is being restored from an export right now, so your message was not "
            "saved; please send it again in a few minutes."
        )


class MarkConflict(RuntimeError):
    """The messages to mark changed since they were read, or would not extend the summarized
    prefix: nothing was marked."""


@dataclass
class IndexedRecord:
    """A record the marking writes in the same script as it marks (a summary): its hash and
    its entry in its thread's index, so no record is ever listed without its messages marked."""

    key: str
    fields: list[str]  # field/value pairs of its hash, as strings
    index: str
    member: str
    score: float


@dataclass
class Message:
    role: str
    content: str
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:16]}")
    thread_id: str = ""
    timestamp: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    summary_id: str = ""
    author: str = ""  # platform user id; empty for the assistant
    author_name: str = ""
    audience: str = ""  # who may see it (Scope.audience); empty in messages from before
    forgotten: bool = False  # a tombstone: its content and author were erased
    seq: int = -1  # its position in the thread, set when it is stored (-1: not yet)
    duplicate: bool = field(default=False, repr=False, compare=False)  # see `append(once=)`

    @property
    def speaker(self) -> str:
        """Who the Conversation segment shows as saying it: the user's name, or the role."""
        if self.role == "user":
            return self.author_name or self.author or "user"
        return self.role

    @property
    def line(self) -> str:
        """The message as an item of the Conversation segment."""
        return f"[{self.speaker}] {self.content}"

    def tombstone(self) -> Message:
        """What stays of the message once forgotten: its place, not what was said or by whom."""
        return Message(
            role=self.role, content="", id=self.id, thread_id=self.thread_id,
            timestamp=self.timestamp, summary_id=self.summary_id, audience=self.audience,
            forgotten=True, seq=self.seq,
        )  # fmt: skip

    def to_json(self) -> str:
        data = dict(vars(self))  # fields in their order (no deep copy: nothing is changed)
        del data["duplicate"]  # `seq` must stay last: the append script fills it in
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Message:
        return cls(**json.loads(raw))


def message_tokens(messages: list[Message], model: str) -> list[int]:
    """Each message's share of the tokens of the Conversation segment's items (`Message.line`
    joined by `ITEM_SEPARATOR`), separator included but for the last: the shares add up to the
    exact count of the joined items, and the shares of the newest k messages to the exact
    count of those k alone. (Each item starts with '[', where `count_tokens` cuts its blocks,
    so a separator never merges with what follows.) A tombstone is not shown: its share is 0."""
    last = max((i for i, m in enumerate(messages) if not m.forgotten), default=-1)
    return [
        0 if m.forgotten else count_tokens(m.line if i == last else m.line + ITEM_SEPARATOR, model)
        for i, m in enumerate(messages)
    ]


class ConversationStore:
    ROLES = ("user", "assistant", "system")

    def __init__(self, redis: Redis, recent: int = 20) -> None:
        self.redis = redis
        self.recent = recent
        self._mark = redis.register_script(_MARK_SCRIPT)
        self._append = redis.register_script(_APPEND_SCRIPT)
        self._tail = redis.register_script(_TAIL_SCRIPT)
        self._set_count = redis.register_script(_SET_COUNT_SCRIPT)
        self._replace = redis.register_script(_REPLACE_SCRIPT)
        self._locks = OwnedLocks(redis)

    @staticmethod
    def key(scope: Scope) -> str:
        return messages_key(scope.tenant, scope.thread)

    @staticmethod
    def count_key(scope: Scope) -> str:
        return summarized_count_key(scope.tenant, scope.thread)

    async def append(
        self,
        scope: Scope,
        role: str,
        content: str,
        timestamp: float | None = None,
        once: str = "",
        **metadata: Any,
    ) -> Message:
        """Store a message of `scope.thread`; a user's message is by `scope.user`. `timestamp`
        (seconds since the epoch) dates it, when given: replayed conversations keep their
        dates; otherwise it is now. With `once` (an idempotency key, e.g. a job id and role),
        a repeated append stores nothing and returns the message stored the first time (its
        id, its text as it is now) with `duplicate` set: a tombstone (`forgotten`) when it was
        forgotten since, alone or with its whole thread (known by its id: another message
        at its position, in a thread that grew again, is not it). Raises `MemoryRestoring`,
        storing nothing, while an import writes the tenant."""
        if role not in self.ROLES:
            raise InvalidMessage(f"role must be one of {self.ROLES}, got {role!r}")
        if not isinstance(content, str) or not content.strip():
            raise InvalidMessage("A message must not be empty.")
        if role == "user" and len(content) > MAX_MESSAGE_CHARS:
            raise InvalidMessage(
                f"A message is limited to {MAX_MESSAGE_CHARS:,} characters "
                f"(this one has {len(content):,}). Save long texts to the knowledge base instead."
            )
        by_user = role == "user"
        message = Message(
            role=role, content=clean_text(content), thread_id=scope.thread, metadata=metadata,
            author=scope.user if by_user else "", author_name=scope.user_name if by_user else "",
            audience=scope.audience,
        )  # fmt: skip
        if timestamp is not None:
            message.timestamp = float(timestamp)
        tenant = scope.tenant
        keys = [self.key(scope), threads_key(tenant), dm_people_key(tenant),
                import_running_key(tenant)]  # fmt: skip
        if once:
            keys += [appended_key(tenant, once), appended_id_key(tenant, once)]
        dm = scope.visibility is Visibility.DM and bool(scope.user)  # whose DM: erasure finds it
        args = [message.to_json(), message.timestamp, scope.thread, ONCE_TTL_SECONDS, message.id,
                scope.audience if dm else "", scope.user if dm else ""]  # fmt: skip
        seq, prior = await self._append(keys=keys, args=args)
        if int(seq) == _IMPORTING:
            raise MemoryRestoring()
        if int(seq) >= 0:
            message.seq = int(seq)
            return message
        return await self._stored_at(scope, decode(prior), message)  # appended before: a re-run

    async def appended(self, scope: Scope, once: str, role: str = "user") -> Message | None:
        """The message an append with idempotency key `once` stored (a tombstone when it was
        forgotten since), or None when none was (or its key expired)."""
        if not once:
            return None
        seq, first_id = await self.redis.mget(
            appended_key(scope.tenant, once), appended_id_key(scope.tenant, once)
        )
        if seq is None:
            return None
        record = f"{decode(seq)} {decode(first_id) or ''}"
        return await self._stored_at(scope, record, Message(role=role, content=""))

    async def _stored_at(self, scope: Scope, record: str, message: Message) -> Message:
        """The message an append under an idempotency key stored (`record`: "<seq> <id>", the
        id empty when recorded before ids were) as it is now, or a tombstone of it when it is
        not there: its thread was forgotten whole since (and may have grown again: another
        message at its position is not it; an old record knows only the role)."""
        position, *named = record.split()
        seq, first_id = int(position), "".join(named[:1])
        stored = await self.redis.lindex(self.key(scope), seq)
        first = Message.from_json(stored) if stored is not None else None
        if first is not None and first.role == message.role and first.id == (first_id or first.id):
            found = first
        else:
            found = message.tombstone()
            found.id = first_id or found.id  # the forgotten message's own id, when known
        found.seq, found.duplicate = seq, True
        return found

    async def all(self, scope: Scope, forgotten: bool = False) -> list[Message]:
        """The thread's messages, oldest first; tombstones only with `forgotten`."""
        messages = [Message.from_json(r) for r in await self.redis.lrange(self.key(scope), 0, -1)]
        for i, message in enumerate(messages):
            message.seq = i  # messages stored before `seq` was kept have none
        return messages if forgotten else [m for m in messages if not m.forgotten]

    async def raw_threads(self, tenant: str, threads: Iterable[str]) -> dict[str, list[str]]:
        """Each thread's list as stored (raw JSON, tombstones included), in one pipeline."""
        threads = list(threads)
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.lrange(messages_key(tenant, thread), 0, -1)
        rows = await pipe.execute()
        return {t: [decode(r) for r in raw] for t, raw in zip(threads, rows, strict=True)}

    async def replace(
        self, tenant: str, changes: dict[str, list[tuple[int, str, str]]]
    ) -> dict[str, list[int]]:
        """Replace messages in place, each only if it is still what was read: `changes` maps a
        thread to (index, raw JSON as read, replacement) triples. One script per thread, all
        in one pipeline; returns, per thread, the indexes that changed meanwhile (untouched)."""
        threads = [t for t, triples in changes.items() if triples]
        if not threads:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            args = [x for triple in changes[thread] for x in triple]
            await self._replace(keys=[messages_key(tenant, thread)], args=args, client=pipe)
        replies = await pipe.execute()
        return {t: [int(i) for i in r] for t, r in zip(threads, replies, strict=True) if r}

    async def at(self, scope: Scope, seqs: Iterable[int]) -> dict[int, Message]:
        """{seq: message} of the thread's messages at these positions (those that exist,
        tombstones included)."""
        seqs = sorted(set(seqs))
        if not seqs:
            return {}
        key = self.key(scope)  # one tick: the reads go out as one pipeline (autopipeline)
        raws = await asyncio.gather(*(self.redis.lindex(key, seq) for seq in seqs))
        found = {seq: Message.from_json(raw) for seq, raw in zip(seqs, raws, strict=True) if raw}
        for seq, message in found.items():
            message.seq = seq  # messages stored before `seq` was kept have none
        return found

    async def recent_unsummarized(self, scope: Scope, limit: int | None = None) -> list[Message]:
        rows = await self.redis.lrange(self.key(scope), -(limit or self.recent), -1)
        return [m for m in map(Message.from_json, rows) if not m.summary_id and not m.forgotten]

    async def unsummarized(self, scope: Scope) -> list[Message]:
        """Every unsummarized message of the thread (its recent window), oldest first; no
        tombstones."""
        return [m for m in (await self._window(scope))[2] if not m.forgotten]

    async def unsummarized_tokens(self, scope: Scope, model: str) -> int:
        """Exact tokens of the unsummarized messages as the Conversation segment renders them
        (its items, without the segment's fixed heading); per-block counts are cached, so this
        is cheap after every turn."""
        return sum(message_tokens(await self.unsummarized(scope), model))

    async def unsummarized_snapshot(self, scope: Scope) -> tuple[int, list[str]]:
        """The index of the first unsummarized message and the raw JSON of all that follow
        (tombstones included: marking goes by position)."""
        first, raw, _ = await self._window(scope)
        return first, raw

    async def _window(self, scope: Scope) -> tuple[int, list[str], list[Message]]:
        """(index of the first unsummarized message, their raw JSON, the messages)."""
        count, rows = await self._tail(keys=[self.key(scope), self.count_key(scope)])
        count = int(count)
        raw = [decode(r) for r in rows]
        if count >= 0:
            # The counter is checked, not trusted: the message before it must be summarized
            # and the one at it (if any) unsummarized.
            head = 1 if count > 0 else 0
            messages = [Message.from_json(r) for r in raw[head:]]
            before_ok = head == 0 or (len(raw) >= 1 and bool(Message.from_json(raw[0]).summary_id))
            if before_ok and not (messages and messages[0].summary_id):
                return count, raw[head:], messages
        first, raw = await self._scan(scope)
        if first or raw:  # no counter for a thread with no message: it would outlive nothing
            await self._set_count(keys=[self.count_key(scope)], args=[count, first])
        return first, raw, [Message.from_json(r) for r in raw]

    async def _scan(self, scope: Scope) -> tuple[int, list[str]]:
        """The summarized prefix found by reading the whole list from its end."""
        rows = [decode(r) for r in await self.redis.lrange(self.key(scope), 0, -1)]
        first = len(rows)
        for i in range(len(rows) - 1, -1, -1):
            if Message.from_json(rows[i]).summary_id:
                break
            first = i
        return first, rows[first:]

    async def mark_summarized(
        self,
        scope: Scope,
        first: int,
        raw: list[str],
        summary_id: str,
        record: IndexedRecord | None = None,
    ) -> list[str]:
        """Set `summary_id` on exactly the messages read by `unsummarized_snapshot`, or on the
        first n of them (`raw[:n]`): compare-and-set, and the summarized messages stay a prefix.
        With `record` (the summary), it is stored and indexed in the same script. Raises
        `MarkConflict` (marking and storing nothing) when one changed or `first` is not the end
        of the summarized prefix. A resend of a marking that ran (redis-py retries a command
        whose reply was lost) finds every message marked so, or its summary stored and the
        message at `first` marked with it (one edited since), and succeeds."""
        args: list[Any] = [first, len(raw)]
        ids = []
        for original in raw:
            message = Message.from_json(original)
            message.summary_id = summary_id
            ids.append(message.id)
            args += [original, message.to_json()]
        keys = [self.key(scope), self.count_key(scope)]
        if record is not None:
            keys += [record.key, record.index]
            args += [record.member, repr(record.score), *record.fields]
        if raw:
            try:
                await self._mark(keys=keys, args=args)
            except Exception as exc:
                if "CHANGED" in str(exc):
                    raise MarkConflict(str(exc)) from exc
                raise
        return ids

    async def claim_summarizing(self, scope: Scope, token: str, seconds: int) -> bool:
        """Take the thread's summary lock: one summary of a thread is written at a time."""
        key = summarizing_key(scope.tenant, scope.thread)
        return await self._locks.acquire(key, token, seconds * 1000)

    async def release_summarizing(self, scope: Scope, token: str) -> None:
        await self._locks.release(summarizing_key(scope.tenant, scope.thread), token)

    async def renew_summarizing(self, scope: Scope, token: str, seconds: int) -> bool:
        """Keep the summary lock through a long summary; False when it was lost."""
        key = summarizing_key(scope.tenant, scope.thread)
        return await self._locks.renew(key, token, seconds * 1000)

    async def tenants(self) -> list[str]:
        """Every tenant that has a conversation (a scan: for upgrades, not for turns)."""
        found = [decode(k) async for k in self.redis.scan_iter(match=tenants_pattern(), count=1000)]
        return sorted({tenant for tenant in map(tenant_of_key, found) if tenant})

    async def threads(self, tenant: str) -> list[tuple[str, float]]:
        rows = await self.redis.zrevrange(threads_key(tenant), 0, -1, withscores=True)
        return [(r.decode() if isinstance(r, bytes) else r, score) for r, score in rows]

    @staticmethod
    def segment(messages: list[Message]) -> Segment:
        items = [m.line for m in messages if not m.forgotten]
        return Segment(
            name="Conversation",
            description="the most recent messages of this thread that no summary covers yet, oldest first.",
            usage="keep continuity: resolve references like 'the paper' or 'it', and follow the user's preferences and open requests.",
            items=items,
            empty_note="(no recent messages in this thread)",
        )


def still_holds(stored: Message | None, copy: Message) -> bool:
    """Whether a queued task's copy of a message is still what its thread holds in its place
    (`stored`, read with `ConversationStore.at`): the same message, not forgotten, saying what
    the copy says (a copy may outlive the message, or its text: an edit on the platform,
    memory/governance_edits.py). A copy without text (an id and a place) is checked by those."""
    if stored is None or stored.id != copy.id or stored.forgotten:
        return False
    return not copy.content or stored.content == copy.content
