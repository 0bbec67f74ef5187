"""Tool log memory: the full input and output of every tool call, kept out of the context.

The model gets a truncated result that names the log id; `read_tool_log` brings the rest back.
Each log keeps who asked the turn that made the call (`author`), so erasing a person takes the
logs of their turns too (memory/governance.py), and is stored for who may see what the call
showed (`log_audience`), not only for who asked. It keeps the ids of the stored messages its
output showed too (`message_ids`, indexed per message), and of its turn's question (its input
quotes it), of the summary it expanded or the log it read back, and of the papers whose passages
it showed (`paper_shown`): forgetting any of them deletes every log that showed it
(`forget_showing`), wherever that call was made. A log from before has none.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from memory.keys import shown_in_logs_key
from memory.scope import NOWHERE, PUBLIC, Scope, Visibility, narrowest
from memory.stores.base import decode, stored_ids
from memory.stores.records import ThreadRecordStore, UnknownRecord

log = logging.getLogger(__name__)

LEFTOVER_BATCH = 500  # ids of one set checked by one run of `_DROP_ABSENT`
# KEYS: a shown-in-logs set, then the log key of each id in ARGV (one tenant: one hash slot).
# Takes out each id whose log is absent now: a log's entry is never added before its hash (one
# MULTI in `write`, the HSET first in an import), so a log written meanwhile is there and keeps
# its entry. Redis deletes a set its last id leaves.
_DROP_ABSENT = """
local removed = 0
for i, log_id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    removed = removed + redis.call('SREM', KEYS[1], log_id)
  end
end
return removed
"""


def log_audience(scope: Scope, shown: Iterable[str]) -> str:
    """Who may read the log of a call made in `scope` that showed items of the audiences
    `shown`: the narrowest of them (`narrowest`). A member's call in a public channel C that
    showed what walled people said there (`private:<C>`) is C's private memory; if it showed the
    team's public memory too, no audience fits: C's walled people read `private:<C>` but not the
    team's memory, the rest of the team reads that but not C's, so it is read by nobody
    (`NOWHERE`, fail closed; the memory page's admins still see it). The same in a private
    channel G: a log of the team's memory stored `private:<G>` would be read by G's walled
    guests, who may not read the team's memory. Only a DM has no walled reader besides its
    owner (who, walled, is never shown the team's memory)."""
    shown = set(shown)
    audience = narrowest([scope.audience, *shown])
    if scope.visibility is not Visibility.DM and audience != PUBLIC and PUBLIC in shown:
        return NOWHERE
    return audience


PAPER_SHOWN = "paper:"  # + a paper's stored id: a log's `message_ids` entry for its passages


def paper_shown(paper_id: str) -> str:
    """How a log notes that its output showed passages of a paper: forgetting the paper then
    finds the log (`forget_showing`), as forgetting a message finds the logs that showed it.
    No message, summary or log id starts so."""
    return f"{PAPER_SHOWN}{paper_id}"


def _sets(tenant: str, showed: dict[str, Iterable[str]]) -> dict[str, set[str]]:
    """The shown-in-logs sets each log is in (by what it showed), with the logs in each."""
    sets: dict[str, set[str]] = {}
    for log_id, message_ids in showed.items():
        for message_id in message_ids:
            sets.setdefault(shown_in_logs_key(tenant, message_id), set()).add(log_id)
    return sets


class UnknownToolLog(UnknownRecord):
    what = "tool log"


@dataclass
class ToolLogEntry:
    thread_id: str
    tool_name: str
    tool_input: dict[str, Any] | str
    output: str
    status: str  # success | error | timeout
    error: str = ""
    duration_ms: float = 0.0
    iteration: int = 0
    id: str = field(default_factory=lambda: f"log_{uuid.uuid4().hex[:12]}")
    created_at: float = field(default_factory=time.time)
    audience: str = ""
    author: str = ""  # who asked the turn that made the call (empty in logs from before)
    # the stored messages its output showed and its turn's question, which its input quotes
    # (and the summary or tool log, or `paper_shown` the papers whose passages, it showed)
    message_ids: list[str] = field(default_factory=list)


class ToolLogStore(ThreadRecordStore[ToolLogEntry]):
    """Every deletion of a log takes it out of the shown-in-logs sets `write` put it in
    (`remove`, `forget_showing`, or `unindex` after a thread erased whole:
    memory/governance_threads.py): else those sets keep ids of logs long gone for ever, and
    forgetting what they showed reads them all again. It is only tidying (an entry of no log
    is skipped): its failure is logged (`unindex`), never raised over logs already gone."""

    KIND, PLURAL = "toollog", "toollogs"
    RECORD = ToolLogEntry
    JSON_FIELDS = ("tool_input", "message_ids")
    MISSING = UnknownToolLog

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self._drop_absent = redis.register_script(_DROP_ABSENT)

    async def write(self, scope: Scope, entry: ToolLogEntry) -> str:
        """Store the log and index it under each message it showed, in one transaction: a
        forget never finds the one without the other (an index entry whose log is not there
        yet would be dropped as a leftover, and the log written after it never found)."""
        pipe = self.redis.pipeline(transaction=True)
        for message_id in set(entry.message_ids):
            pipe.sadd(shown_in_logs_key(scope.tenant, message_id), entry.id)
        self._stored(pipe, scope, entry)
        await pipe.execute()
        return entry.id

    async def forget_showing(self, tenant: str, message_ids: Iterable[str]) -> int:
        """Delete every log whose output showed one of these messages (they are being
        forgotten: their text must not live on in another turn's log, or in a log read from
        it), then their index entries (those read: one a log wrote meanwhile stays) and the
        other sets those logs were in; how many logs went. Run again, it finds what is left.
        Four round trips: the sets, the logs' threads and what they showed, the deletion, the
        SREMs."""
        read = await self.indexed((tenant, message_id) for message_id in message_ids)
        if not read:
            return 0
        logs = sorted(set().union(*read.values()))
        pipe = self.redis.pipeline(transaction=False)
        for log_id in logs:
            pipe.hmget(self.key(tenant, log_id), ["thread_id", "message_ids"])
        by_thread: dict[str, list[str]] = {}
        showed: dict[str, list[str]] = {}
        for log_id, (thread, raw) in zip(logs, await pipe.execute(), strict=True):
            if thread is not None:  # else gone already (its thread's erasure, retention)
                by_thread.setdefault(decode(thread), []).append(log_id)
                showed[log_id] = stored_ids(raw)
        removed = await super().remove(tenant, by_thread)
        for (_, message_id), log_ids in read.items():  # the sets read: logs gone before too
            for log_id in log_ids:
                showed.setdefault(log_id, []).append(message_id)
        await self.unindex(tenant, showed)
        return removed

    async def remove(self, tenant: str, by_thread: dict[str, Iterable[str]]) -> int:
        """Delete logs (`ThreadRecordStore.remove`), then their shown-in-logs index entries:
        a few round trips whatever the number of logs. A crash in between leaves entries of no
        log, which `forget_showing` skips, never a log its index lost."""
        by_thread = {thread: list(ids) for thread, ids in by_thread.items()}
        showed = await self.shown(tenant, (i for ids in by_thread.values() for i in ids))
        removed = await super().remove(tenant, by_thread)
        await self.unindex(tenant, showed)
        return removed

    async def shown(self, tenant: str, ids: Iterable[str]) -> dict[str, list[str]]:
        """What each of these logs showed (its `message_ids`: the sets `write` indexed it in),
        read in one pipeline; a log gone, or from before it was kept, showed nothing."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for log_id in ids:
            pipe.hget(self.key(tenant, log_id), "message_ids")
        found = {i: stored_ids(raw) for i, raw in zip(ids, await pipe.execute(), strict=True)}
        return {log_id: showed for log_id, showed in found.items() if showed}

    @staticmethod
    def unindex_in(pipe: Any, tenant: str, showed: dict[str, Iterable[str]]) -> None:
        """Queue on the caller's `pipe` the SREMs that take these logs out of the sets of what
        they showed: an import replacing a stored log with a version that showed less
        (memory/portability_write.py) sends them with its own writes."""
        for key, log_ids in _sets(tenant, showed).items():
            pipe.srem(key, *sorted(log_ids))

    async def indexed(self, sets: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """The log ids each of these shown-in-logs sets (tenant, message id) holds, read in
        one pipeline; an empty or absent set holds none."""
        sets = list(dict.fromkeys(sets))
        if not sets:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant, message_id in sets:
            pipe.smembers(shown_in_logs_key(tenant, message_id))
        found = await pipe.execute()
        return {s: sorted(decode(i) for i in ids) for s, ids in zip(sets, found, strict=True)}

    async def drop_absent(self, indexed: dict[tuple[str, str], Iterable[str]]) -> int:
        """Take out of each set (read by `indexed`) those of its ids whose log is absent, each
        checked as it is removed, in a script per set (and batch of ids): a log written since
        the sets were read keeps its entry. For the ids left by logs deleted before deletions
        trimmed the sets (memory/migrate.py); how many ids went. Harmless to run again."""
        pipe = self.redis.pipeline(transaction=False)
        for (tenant, message_id), log_ids in indexed.items():
            log_ids = list(log_ids)
            for start in range(0, len(log_ids), LEFTOVER_BATCH):
                batch = log_ids[start : start + LEFTOVER_BATCH]
                keys = [shown_in_logs_key(tenant, message_id)]
                keys += [self.key(tenant, log_id) for log_id in batch]
                await self._drop_absent(keys=keys, args=batch, client=pipe)
        return sum(int(n) for n in await pipe.execute()) if len(pipe) else 0

    async def unindex(self, tenant: str, showed: dict[str, Iterable[str]]) -> None:
        """Take deleted logs out of the sets of what they showed (`shown`, read before they
        went; `unindex_in`), one SREM per set in one pipeline (Redis deletes a set its last
        log leaves). Only tidying, so a failure is logged, not raised: the caller's next steps
        still run, and an entry of no log is skipped (`forget_showing`)."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            self.unindex_in(pipe, tenant, showed)
            if len(pipe):
                await pipe.execute()
        except Exception:
            log.exception("deleted tool logs could not leave their shown-in-logs sets")

    async def authors(self, tenant: str, ids: Iterable[str]) -> dict[str, str]:
        """Who asked the turn of each log (empty for logs from before it was kept)."""
        ids = list(ids)
        pipe = self.redis.pipeline(transaction=False)
        for log_id in ids:
            pipe.hget(self.key(tenant, log_id), "author")
        return {i: decode(a) or "" for i, a in zip(ids, await pipe.execute(), strict=True)}

    async def recent(
        self, scope: Scope, limit: int = 50, failed_only: bool = False
    ) -> list[ToolLogEntry]:
        """The thread's latest calls, newest first (optionally only those that failed)."""
        entries = await self.for_thread(scope, newest_first=True, limit=limit)
        return [e for e in entries if e.status != "success"] if failed_only else entries
