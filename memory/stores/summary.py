"""Summary memory: durable notes that replace older messages of a thread, expandable again.

A summary covers consecutive messages of its thread (`message_ids`, oldest first). When a
thread's summaries pile up, the oldest are merged into one higher-level summary (`level` one
above its highest child) that covers all their messages and records its `children`; each
child records its `parent`. A thread's index (the sorted set) lists only its top-level
summaries, in the order of the messages they cover: the Summary segment stays short, and every
summary stays readable by id.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field

from redis.asyncio import Redis

from memory.scope import Scope
from memory.stores.base import Segment, decode
from memory.stores.records import ThreadRecordStore, UnknownRecord


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


# Merge summaries into a new one, if they are all still top-level: store it in the place of the
# first (its score), take them out of the thread's index, point each at its parent.
_MERGE_SCRIPT = """
-- KEYS[1] thread index, KEYS[2] merged hash, KEYS[3..] children's hashes
-- ARGV[1] merged id, ARGV[2] number of field arguments (f), ARGV[3 .. 2 + f] field/value
-- pairs of the merged hash, then the children's ids (in KEYS order)
local nf = tonumber(ARGV[2])
local score = nil
for i = 1, #KEYS - 2 do
  local child = ARGV[2 + nf + i]
  local s = redis.call('ZSCORE', KEYS[1], child)
  if not s then
    return redis.error_reply('CHANGED summary ' .. child .. ' is not a top-level summary')
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


class SummaryStore(ThreadRecordStore[Summary]):
    KIND, PLURAL = "summary", "summaries"
    RECORD = Summary
    JSON_FIELDS = ("message_ids", "children")
    MISSING = UnknownSummary

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self._merge = redis.register_script(_MERGE_SCRIPT)

    async def descriptions(self, scope: Scope) -> list[tuple[str, str]]:
        """(id, description) of a thread's top-level summaries, oldest first, in one command:
        SORT over the thread's index (in its own order) fetching each hash's description."""
        rows = await self.redis.sort(
            self.thread_index(scope),
            by="nosort",
            get=["#", f"{self.key(scope.tenant, '*')}->description"],
        )
        return [(decode(rows[i]), decode(rows[i + 1]) or "") for i in range(0, len(rows), 2)]

    async def merge(self, scope: Scope, merged: Summary, children: list[Summary]) -> Summary:
        """Store `merged` as the top-level summary in place of `children` (top-level summaries
        of `scope.thread`), atomically; `SummaryConflict` if one of them is no longer
        top-level, and then nothing changes."""
        if not children:
            raise ValueError("A merged summary needs children.")
        merged.audience = scope.audience
        merged.children = [c.id for c in children]
        fields: list[str] = []
        for name, value in dataclasses.asdict(merged).items():
            if name in self.JSON_FIELDS:
                value = json.dumps(value, ensure_ascii=False)
            fields += [name, repr(value) if isinstance(value, float) else str(value)]
        keys = [self.thread_index(scope), self.key(scope.tenant, merged.id)]
        keys += [self.key(scope.tenant, c.id) for c in children]
        try:
            await self._merge(keys=keys, args=[merged.id, len(fields), *fields, *merged.children])
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
