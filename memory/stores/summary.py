"""Summary memory: durable notes that replace older messages of a thread, expandable again.

A summary covers consecutive messages of its thread (`message_ids`, oldest first). When a
thread's summaries pile up, the oldest are merged into one higher-level summary (`level` one
above its highest child) that covers all their messages and records its `children`; each
child records its `parent`. A thread's index (the sorted set) lists only its top-level
summaries, in the order of the messages they cover: the Summary segment stays short, and every
summary stays readable by id.

The deterministic notes (`compact_note` over messages, `merged_note` over summaries) live here:
the bot's forced compaction writes them, and so does forgetting (memory/governance.py), which
rewrites a summary from its remaining messages. A merge is a compare-and-set on its children's
texts, so a summary rewritten meanwhile is never merged from its old text.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import dataclass, field

from redis.asyncio import Redis

from memory.keys import thread_records_key
from memory.scope import Scope, legacy_audience, narrowest
from memory.stores.base import Segment, decode
from memory.stores.conversation import IndexedRecord, Message
from memory.stores.records import ThreadRecordStore, UnknownRecord

COMPACT_CHARS_PER_MESSAGE = 300
_MERGED_HEAD = re.compile(r"^\d+ earlier summaries(?: \(\d+ messages\))?: ")

Note = tuple[str, str]  # (description, text)


class UnknownSummary(UnknownRecord):
    what = "summary"


class SummaryConflict(RuntimeError):
    """The summaries to merge are no longer all top-level: nothing was changed."""


@dataclass
class Summary:
    thread_id: str
    description: str
    text: str
    message_ids: list[str]
    id: str = field(default_factory=lambda: f"sum_{uuid.uuid4().hex[:10]}")
    created_at: float = field(default_factory=time.time)
    audience: str = ""
    level: int = 0  # 0: written over messages; n + 1: merged from summaries of level <= n
    children: list[str] = field(default_factory=list)  # the merged summaries, oldest first
    parent: str = ""  # the summary this one was merged into; empty while top-level


def utc_minute(timestamp: float) -> str:
    """A message's time as notes and transcripts give it: UTC, as everywhere else."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def compact_note(messages: list[Message]) -> Note:
    """The deterministic note: where and how it started, and each message cut short, with who
    said it (forgotten messages are left out)."""
    living = [m for m in messages if not m.forgotten]
    if not living:
        return f"{len(messages)} forgotten messages", ""
    start = utc_minute(living[0].timestamp)
    first_question = next((m.content for m in living if m.role == "user"), "")
    description = f"Compacted {len(living)} messages from {start}: {first_question}"
    lines = [f"[{m.speaker}] {m.content[:COMPACT_CHARS_PER_MESSAGE]}" for m in living]
    return " ".join(description.split()[:16]), "\n".join(lines)


def merged_note(children: list[Summary]) -> Note:
    """The deterministic note of merged summaries: their descriptions, each without the head
    of a merged one (a merge of merges would otherwise begin "6 earlier summaries: 6 earlier
    summaries: ..." and say nothing in its first words)."""
    messages = sum(len(c.message_ids) for c in children)
    description = f"{len(children)} earlier summaries ({messages} messages): " + "; ".join(
        _MERGED_HEAD.sub("", c.description) for c in children
    )
    text = "\n".join(f"[Summary ID: {c.id}] {c.description}" for c in children)
    return " ".join(description.split()[:24]), text


def text_digest(text: str) -> str:
    """What a merge checks a child's text against (Lua's `redis.sha1hex` of the stored text)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# Merge summaries into a new one, if they are all still top-level and their texts are still
# the ones read: store it in the place of the first (its score), take them out of the thread's
# index, point each at its parent.
_MERGE_SCRIPT = """
-- KEYS[1] thread index, KEYS[2] merged hash, KEYS[3..] children's hashes
-- ARGV[1] merged id, ARGV[2] number of field arguments (f), ARGV[3 .. 2 + f] field/value
-- pairs of the merged hash, then the children's ids (in KEYS order), then their texts' SHA-1
local nf = tonumber(ARGV[2])
local n = #KEYS - 2
local score = nil
for i = 1, n do
  local child = ARGV[2 + nf + i]
  local s = redis.call('ZSCORE', KEYS[1], child)
  if not s then
    return redis.error_reply('CHANGED summary ' .. child .. ' is not a top-level summary')
  end
  local digest = ARGV[2 + nf + n + i]
  if digest and redis.sha1hex(redis.call('HGET', KEYS[2 + i], 'text') or '') ~= digest then
    return redis.error_reply('CHANGED summary ' .. child .. ' was rewritten')
  end
  if not score or tonumber(s) < tonumber(score) then score = s end
end
redis.call('HSET', KEYS[2], unpack(ARGV, 3, 2 + nf))
redis.call('ZADD', KEYS[1], score, ARGV[1])
for i = 1, #KEYS - 2 do
  redis.call('ZREM', KEYS[1], ARGV[2 + nf + i])
  redis.call('HSET', KEYS[2 + i], 'parent', ARGV[1])
end
return #KEYS - 2
"""

# Put summary ARGV[2] (hash KEYS[3], written before) in the place of ARGV[1] (hash KEYS[2]):
# in the thread's index (KEYS[1]) or in its parent's children (KEYS[4]), if the old one is
# still where it was read (its parent ARGV[3], '' when top-level); the new one gets that parent
# and the old hash is deleted. The old one gone and the new one in its place is a resend of a
# replacement that ran (redis-py retries a command whose reply was lost): done.
_REPLACE_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  local placed = false
  if redis.call('HGET', KEYS[3], 'parent') == ARGV[3] then
    if ARGV[3] == '' then
      placed = redis.call('ZSCORE', KEYS[1], ARGV[2]) ~= false
    else
      for _, child in ipairs(cjson.decode(redis.call('HGET', KEYS[4], 'children') or '[]')) do
        if child == ARGV[2] then placed = true end
      end
    end
  end
  if placed then return 1 end
  return redis.error_reply('CHANGED summary ' .. ARGV[1] .. ' is gone')
end
local parent = redis.call('HGET', KEYS[2], 'parent') or ''
if parent ~= ARGV[3] then
  return redis.error_reply('CHANGED summary ' .. ARGV[1] .. ' moved')
end
if parent == '' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not score then return redis.error_reply('CHANGED summary ' .. ARGV[1] .. ' moved') end
  redis.call('ZADD', KEYS[1], score, ARGV[2])
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  local children = cjson.decode(redis.call('HGET', KEYS[4], 'children'))
  for i, child in ipairs(children) do
    if child == ARGV[1] then children[i] = ARGV[2] end
  end
  redis.call('HSET', KEYS[4], 'children', cjson.encode(children))
end
redis.call('HSET', KEYS[3], 'parent', parent)
redis.call('DEL', KEYS[2])
return 1
"""


class SummaryStore(ThreadRecordStore[Summary]):
    KIND, PLURAL = "summary", "summaries"
    RECORD = Summary
    JSON_FIELDS = ("message_ids", "children")
    MISSING = UnknownSummary
    OWN_THREAD_SHOWN = True  # a summary says only what its own thread said

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self._merge = redis.register_script(_MERGE_SCRIPT)
        self._replace = redis.register_script(_REPLACE_SCRIPT)

    async def rewrite(self, tenant: str, notes: dict[str, Note]) -> dict[str, str]:
        """Give summaries new notes (description, text) in place; returns each one's parent as
        read after the write, so a merge that took it meanwhile is seen."""
        pipe = self.redis.pipeline(transaction=False)
        ids = list(notes)
        for summary_id in ids:
            description, text = notes[summary_id]
            key = self.key(tenant, summary_id)
            pipe.hset(key, mapping={"description": description, "text": text})
            pipe.hget(key, "parent")
        replies = await pipe.execute()
        return {i: decode(replies[2 * n + 1]) or "" for n, i in enumerate(ids)}

    def flat_fields(self, summary: Summary) -> list[str]:
        """A summary's hash as field/value strings, for a script's HSET."""
        flat: list[str] = []
        for name, value in self.fields(summary).items():
            flat += [name, repr(value) if isinstance(value, float) else str(value)]
        return flat

    def indexed(self, scope: Scope, summary: Summary) -> IndexedRecord:
        """A new top-level summary of `scope.thread` as the marking of its messages stores it
        (`ConversationStore.mark_summarized`): one script, so a failure or a crash never leaves
        it listed over messages it does not mark."""
        summary.audience = narrowest([scope.audience, summary.audience])
        return IndexedRecord(
            key=self.key(scope.tenant, summary.id), fields=self.flat_fields(summary),
            index=self.thread_index(scope), member=summary.id, score=summary.created_at,
        )  # fmt: skip

    async def store(self, tenant: str, summary: Summary) -> None:
        """Write a summary's hash only: it is listed nowhere until `replace` puts it in place."""
        await self.redis.hset(self.key(tenant, summary.id), mapping=self.fields(summary))

    async def replace(self, tenant: str, old: Summary, new: Summary) -> None:
        """Put `new` (stored) in `old`'s place, the thread's index or its parent's children,
        and delete `old`; `SummaryConflict` when `old` moved since it was read (merged)."""
        keys = [
            thread_records_key(tenant, old.thread_id, self.PLURAL), self.key(tenant, old.id),
            self.key(tenant, new.id), self.key(tenant, old.parent or old.id),
        ]  # fmt: skip
        try:
            await self._replace(keys=keys, args=[old.id, new.id, old.parent])
        except Exception as exc:
            if "CHANGED" in str(exc):
                raise SummaryConflict(str(exc)) from exc
            raise
        new.parent = old.parent

    async def descriptions(self, scope: Scope) -> list[tuple[str, str]]:
        """(id, description) of a thread's top-level summaries, oldest first, in one command."""
        rows = await self._top_level(scope, "description")
        return [(sid, description or "") for sid, description in rows]

    async def descriptions_with_audience(self, scope: Scope) -> list[tuple[str, str, str]]:
        """`descriptions` with each summary's audience (a legacy one's is its thread's), for a
        reader shown only what they may see (Slack's Home tab); apart, so that the context's
        hot read fetches no more than it uses."""
        rows = await self._top_level(scope, "description", "audience")
        legacy = legacy_audience(scope.thread)
        return [(sid, description or "", audience or legacy) for sid, description, audience in rows]

    async def _top_level(self, scope: Scope, *fields: str) -> list[tuple[str | None, ...]]:
        """A thread's top-level summaries, oldest first: (id, *fields) each, in one command:
        SORT over the thread's index (in its own order) fetching those fields of each hash."""
        pattern = self.key(scope.tenant, "*")
        get = ["#", *(f"{pattern}->{name}" for name in fields)]
        rows = await self.redis.sort(self.thread_index(scope), by="nosort", get=get)
        width = len(get)
        return [
            tuple(decode(row) for row in rows[i : i + width]) for i in range(0, len(rows), width)
        ]

    async def merge(self, scope: Scope, merged: Summary, children: list[Summary]) -> Summary:
        """Store `merged` as the top-level summary in place of `children` (top-level summaries
        of `scope.thread`), atomically; `SummaryConflict` if one of them is no longer
        top-level, and then nothing changes. It is stored for the narrowest audience of its
        children (`narrowest`): it says what they said."""
        if not children:
            raise ValueError("A merged summary needs children.")
        merged.audience = narrowest(
            [scope.audience, merged.audience]
            + [c.audience or legacy_audience(c.thread_id) for c in children]
        )
        merged.children = [c.id for c in children]
        fields = self.flat_fields(merged)
        keys = [self.thread_index(scope), self.key(scope.tenant, merged.id)]
        keys += [self.key(scope.tenant, c.id) for c in children]
        digests = [text_digest(c.text) for c in children]
        args = [merged.id, len(fields), *fields, *merged.children, *digests]
        try:
            await self._merge(keys=keys, args=args)
        except Exception as exc:
            if "CHANGED" in str(exc):
                raise SummaryConflict(str(exc)) from exc
            raise
        for child in children:
            child.parent = merged.id
        return merged

    @staticmethod
    def segment(entries: list[tuple[str, str]]) -> Segment:
        return Segment(
            name="Summary",
            description="compressed older parts of this thread; each line is a summary id and what it covers.",
            usage="when a detail you need is only here, call expand_summary(summary_id) to get the summary and its original messages.",
            items=[f"[Summary ID: {sid}] {description}" for sid, description in entries],
            empty_note="(no summaries in this thread)",
        )
