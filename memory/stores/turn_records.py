"""Turn records: one per answered turn, what it was and how it went.

Each record holds who asked what in which thread and place, the answer, why the loop stopped,
the ids of the memory its context used, every passage shown to the model (with its number) and
those the answer cited, the tools it called, the model usage it cost and the feedback people
gave it (one vote each: a later vote replaces theirs). It is written once per turn id, however
often a job runs (a Lua script checks and writes, and adds the turn's usage to its thread's, the
tenant's and the day's counters in the same step, all in the tenant's slot).

Forgetting finds records through indexes, never by reading them all: the tenant's and each
thread's sorted sets (by time), a set per asker and per voter, and a hash from the stored
question and answer message ids to their turn.

Usage that is not a turn's (rolling summaries, entity extraction) is added to the thread's and
tenant's counters only (`add_usage`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from memory.keys import (
    feedback_key,
    turn_messages_key,
    turn_record_key,
    turn_records_key,
    turns_by_key,
    usage_key,
    usage_threads_key,
)
from memory.scope import Scope
from memory.stores.base import decode

USAGE_FIELDS = ("tokens_in", "tokens_out", "model_calls", "tool_calls")
VOTE = "vote:"  # a record's field per voter: `vote:<user>` -> JSON
JSON_FIELDS = ("memory", "shown", "cited", "tools", "usage")
ASKER, VOTER = "asker", "voter"  # the per-person indexes (memory/keys.py `turns_by_key`)
WITHDRAW_ROUNDS = 10  # reads of a person's voter index while votes keep landing during erasure
Reject = Callable[[str, bool, str], Awaitable[object]]  # WorkflowStore.reject: key, flag, turn

# KEYS: record, tenant's turns, thread's turns, usage tenant, usage day, usage thread, top,
#       asker's turns, message index
# ARGV: id, created_at, thread, tokens_in, tokens_out, model_calls, tool_calls, asker,
#       question_id, answer_id, field, value...
_SAVE_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], 'id') == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
local names = {'tokens_in', 'tokens_out', 'model_calls', 'tool_calls'}
for k = 4, 6 do
  for i, name in ipairs(names) do redis.call('HINCRBY', KEYS[k], name, ARGV[3 + i]) end
  redis.call('HINCRBY', KEYS[k], 'turns', 1)
end
redis.call('ZINCRBY', KEYS[7], tonumber(ARGV[4]) + tonumber(ARGV[5]), ARGV[3])
if ARGV[8] ~= '' then redis.call('SADD', KEYS[8], ARGV[1]) end
for i = 9, 10 do
  if ARGV[i] ~= '' then redis.call('HSET', KEYS[9], ARGV[i], ARGV[1]) end
end
return 1
"""

# KEYS: record, feedback index, voter's turns. ARGV: field, vote JSON or "" (withdraw), time, id
_VOTE_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return -1 end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[4])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[4])
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
local downs = 0
local row = redis.call('HGETALL', KEYS[1])
for i = 1, #row, 2 do
  if string.sub(row[i], 1, 5) == 'vote:' and cjson.decode(row[i + 1])['rating'] < 0 then
    downs = downs + 1
  end
end
return downs
"""


class UnknownTurn(KeyError):
    """No turn record with this id in this tenant."""

    def __str__(self) -> str:
        return f"No answered turn {self.args[0]!r} in this workspace's memory."


def new_turn_id() -> str:
    """An id for a turn that came without one (the terminal's `ask` and chat)."""
    return f"turn_{uuid.uuid4().hex[:16]}"


def day_of(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(timestamp))


def counts(row: dict | None = None) -> dict[str, int]:
    """Usage counters from a usage hash, zero where nothing was counted."""
    found = {decode(k): int(decode(v)) for k, v in (row or {}).items()}
    return {name: found.get(name, 0) for name in (*USAGE_FIELDS, "turns")}


@dataclass
class TurnUsage:
    """What a turn (or a background job) cost: tokens in and out, model and tool calls."""

    tokens_in: int = 0
    tokens_out: int = 0
    model_calls: int = 0
    tool_calls: int = 0

    def add(self, tokens_in: int = 0, tokens_out: int = 0, model_calls: int = 1) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.model_calls += model_calls

    @classmethod
    def of(cls, row: dict[str, Any]) -> TurnUsage:
        return cls(**{name: int(float(decode(row.get(name)) or 0)) for name in USAGE_FIELDS})


@dataclass
class Vote:
    user: str
    rating: int  # +1 or -1
    name: str = ""
    comment: str = ""
    reasons: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)


@dataclass
class TurnRecord:
    id: str
    tenant: str
    thread: str
    question: str
    answer: str
    audience: str = ""
    channel: str = ""
    asker: str = ""
    asker_name: str = ""
    # the turn's scope was walled (memory/scope.py): re-learning it (an edit) stays walled;
    # None in a record stored before this was kept (`scope_of` reads it)
    walled: bool | None = None
    created_at: float = field(default_factory=time.time)
    stop_reason: str = "final"
    question_id: str = ""  # the stored messages (forgetting one drops the record)
    answer_id: str = ""
    memory: dict[str, list[str]] = field(default_factory=dict)  # kind -> ids the context used
    # every passage shown (context and tools) and those the answer cited: {"number", "id"},
    # id `<arxiv_id>#<chunk>`; a paper named but not cited by number has number None, its id
    shown: list[dict[str, Any]] = field(default_factory=list)
    cited: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, str]] = field(default_factory=list)  # name, status, log_id
    usage: TurnUsage = field(default_factory=TurnUsage)
    citations_removed: int = 0
    workflow: str = ""  # the key of the workflow learned from this turn, once written
    feedback: dict[str, Vote] = field(default_factory=dict)  # by user

    @property
    def rating(self) -> int:
        """The votes summed (+1 each 👍, -1 each 👎)."""
        return sum(v.rating for v in self.feedback.values())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["feedback"] = list(data["feedback"].values())
        return data


class TurnRecords:
    """The tenant's turn records, their feedback and the usage counters."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._save = redis.register_script(_SAVE_SCRIPT)
        self._vote = redis.register_script(_VOTE_SCRIPT)
        self._set_field = redis.register_script(
            "if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 0 end "
            "return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) + 1"
        )

    # -- writes ---------------------------------------------------------------------------------

    async def save(self, record: TurnRecord) -> bool:
        """Store a turn's record and count its usage; False (and nothing changes) when a record
        of this id exists already (a re-run of the same job)."""
        tenant, thread = record.tenant, record.thread
        fields: list[Any] = []
        for name, value in asdict(record).items():
            if name == "feedback" or value is None:  # None: not known (`walled`), not stored
                continue
            if name in JSON_FIELDS:
                value = json.dumps(value, ensure_ascii=False)
            fields += [name, repr(value) if isinstance(value, float) else str(value)]
        usage = record.usage
        keys = [
            turn_record_key(tenant, record.id), turn_records_key(tenant),
            turn_records_key(tenant, thread), usage_key(tenant),
            usage_key(tenant, day=day_of(record.created_at)), usage_key(tenant, thread),
            usage_threads_key(tenant), turns_by_key(tenant, ASKER, record.asker),
            turn_messages_key(tenant),
        ]  # fmt: skip
        args = [record.id, repr(record.created_at), thread, usage.tokens_in, usage.tokens_out,
                usage.model_calls, usage.tool_calls, record.asker, record.question_id,
                record.answer_id, *fields]  # fmt: skip
        return bool(await self._save(keys=keys, args=args))

    async def restore(self, record: TurnRecord) -> bool:
        """Write an exported record (an import, memory/portability_write.py): as `save`, and
        its votes with their own times; False when the id exists already."""
        if not await self.save(record):
            return False
        for vote in record.feedback.values():
            keys = [
                turn_record_key(record.tenant, record.id), feedback_key(record.tenant),
                turns_by_key(record.tenant, VOTER, vote.user),
            ]  # fmt: skip
            value = json.dumps(asdict(vote), ensure_ascii=False)
            await self._vote(keys=keys, args=[VOTE + vote.user, value, repr(vote.at), record.id])
        return True

    async def add_usage(self, scope: Scope, usage: TurnUsage) -> None:
        """Count background model calls of a thread (summaries, entity extraction) to it, the
        tenant and the day; in one MULTI (one slot)."""
        if not any(getattr(usage, name) for name in USAGE_FIELDS):
            return
        tenant = scope.tenant
        targets = [usage_key(tenant), usage_key(tenant, day=day_of(time.time()))]
        if scope.thread:
            targets.append(usage_key(tenant, scope.thread))
        pipe = self.redis.pipeline(transaction=True)
        for key in targets:
            for name in USAGE_FIELDS:
                if value := getattr(usage, name):
                    pipe.hincrby(key, name, value)
        if scope.thread:
            pipe.zincrby(
                usage_threads_key(tenant), usage.tokens_in + usage.tokens_out, scope.thread
            )
        await pipe.execute()

    async def vote(self, tenant: str, turn_id: str, vote: Vote | None, user: str = "") -> int:
        """Record `vote` (replacing the voter's earlier one), or withdraw `user`'s vote with
        None; returns how many 👎 the turn has now. `UnknownTurn` for no such record."""
        voter = vote.user if vote else user
        value = json.dumps(asdict(vote), ensure_ascii=False) if vote else ""
        keys = [
            turn_record_key(tenant, turn_id), feedback_key(tenant),
            turns_by_key(tenant, VOTER, voter),
        ]  # fmt: skip
        field_name = VOTE + voter
        downs = await self._vote(keys=keys, args=[field_name, value, repr(time.time()), turn_id])
        if int(downs) < 0:
            raise UnknownTurn(turn_id)
        return int(downs)

    async def comment(self, tenant: str, turn_id: str, user: str, comment: str,
                      reasons: Iterable[str] = (), name: str = "") -> int:  # fmt: skip
        """Add a comment (and reasons) to `user`'s vote, a 👎 if they had none; 👎 count."""
        record = await self.get(tenant, turn_id)
        vote = record.feedback.get(user) or Vote(user, -1, name)
        vote.comment, vote.reasons, vote.at = comment.strip(), list(reasons), time.time()
        return await self.vote(tenant, turn_id, vote)

    async def set_workflow(self, tenant: str, turn_id: str, workflow_key: str) -> bool:
        """Note the workflow learned from the turn; False when there is no such record."""
        key = turn_record_key(tenant, turn_id)
        return bool(await self._set_field(keys=[key], args=["workflow", workflow_key]))

    async def edit_question(self, tenant: str, message_id: str, text: str) -> bool:
        """The stored question `message_id` was edited on the platform: its turn's record
        quotes the new text (the answer stays the one given). False when no record asks it."""
        turn_id = decode(await self.redis.hget(turn_messages_key(tenant), message_id))
        if not turn_id:
            return False
        key = turn_record_key(tenant, turn_id)
        if decode(await self.redis.hget(key, "question_id")) != message_id:
            return False  # the answer's id: its text is the bot's
        return bool(await self._set_field(keys=[key], args=["question", text]))

    # -- reads ----------------------------------------------------------------------------------

    async def get(self, tenant: str, turn_id: str) -> TurnRecord:
        found = await self.get_many(tenant, [turn_id])
        if turn_id not in found:
            raise UnknownTurn(turn_id)
        return found[turn_id]

    async def get_many(self, tenant: str, ids: Iterable[str]) -> dict[str, TurnRecord]:
        ids = list(dict.fromkeys(ids))
        pipe = self.redis.pipeline(transaction=False)
        for turn_id in ids:
            pipe.hgetall(turn_record_key(tenant, turn_id))
        rows = await pipe.execute() if ids else []
        return {i: _decode(row) for i, row in zip(ids, rows, strict=True) if row}

    async def asking(self, tenant: str, message_ids: Iterable[str]) -> list[TurnRecord]:
        """The records of the turns that asked these stored messages (not those that answered
        them with one)."""
        asked = list(dict.fromkeys(message_ids))
        turns = await self.redis.hmget(turn_messages_key(tenant), asked) if asked else []
        found = await self.get_many(tenant, {decode(t) for t in turns if t is not None})
        wanted = set(asked)
        return [r for r in found.values() if r.question_id in wanted]

    async def ids(self, tenant: str, thread: str | None = None, limit: int = 0) -> list[str]:
        """Newest first: the tenant's (or a thread's) turn records."""
        rows = await self.redis.zrevrange(turn_records_key(tenant, thread), 0, limit - 1)
        return [decode(r) for r in rows]

    async def of_thread(self, tenant: str, thread: str, limit: int = 0) -> list[TurnRecord]:
        """A thread's turn records, newest first (`limit` 0: all)."""
        ids = await self.ids(tenant, thread, limit)
        found = await self.get_many(tenant, ids)
        return [found[i] for i in ids if i in found]

    async def with_feedback(self, tenant: str, limit: int = 0) -> list[TurnRecord]:
        """Turns that got feedback, latest vote first."""
        ids = [decode(i) for i in await self.redis.zrevrange(feedback_key(tenant), 0, limit - 1)]
        found = await self.get_many(tenant, ids)
        return [found[i] for i in ids if i in found and found[i].feedback]

    async def usage(self, tenant: str, thread: str | None = None, day: str | None = None
                    ) -> dict[str, int]:  # fmt: skip
        """Counters of the tenant, a thread or a day: tokens_in, tokens_out, model_calls,
        tool_calls, turns (0 when nothing was counted)."""
        return counts(await self.redis.hgetall(usage_key(tenant, thread, day)))

    async def top_threads(self, tenant: str, limit: int = 10) -> list[tuple[str, dict[str, int]]]:
        """The threads that used the most tokens, with their counters."""
        rows = await self.redis.zrevrange(usage_threads_key(tenant), 0, limit - 1)
        threads = [decode(t) for t in rows]
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.hgetall(usage_key(tenant, thread))
        found = await pipe.execute() if threads else []
        return [(t, counts(row)) for t, row in zip(threads, found, strict=True)]

    # -- forgetting -----------------------------------------------------------------------------

    async def forget(self, tenant: str, ids: Iterable[str]) -> int:
        """Delete turn records (their feedback, their index entries); how many existed."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for turn_id in ids:
            key = turn_record_key(tenant, turn_id)
            pipe.hmget(key, ["id", "thread", "asker", "question_id", "answer_id"])
            pipe.hkeys(key)
        rows = await pipe.execute()
        pipe = self.redis.pipeline(transaction=True)
        found = 0
        for turn_id, (row, names) in zip(ids, zip(rows[::2], rows[1::2], strict=True), strict=True):
            if row[0] is None:
                continue
            found += 1
            thread, asker, *messages = (decode(v) or "" for v in row[1:])
            pipe.delete(turn_record_key(tenant, turn_id))
            pipe.zrem(turn_records_key(tenant), turn_id)
            pipe.zrem(turn_records_key(tenant, thread), turn_id)
            pipe.zrem(feedback_key(tenant), turn_id)
            if asker:
                pipe.srem(turns_by_key(tenant, ASKER, asker), turn_id)
            if messages := [m for m in messages if m]:
                pipe.hdel(turn_messages_key(tenant), *messages)
            for name in map(decode, names):
                if name.startswith(VOTE):
                    pipe.srem(turns_by_key(tenant, VOTER, name[len(VOTE) :]), turn_id)
        if found:
            await pipe.execute()
        return found

    async def forget_where(self, tenant: str, threads: Iterable[str] = (), asker: str = "",
                           message_ids: Iterable[str] = (), before: float | None = None,
                           reject: Reject | None = None) -> int:  # fmt: skip
        """Drop the records of these threads (and the threads' usage), of this asker (and
        their votes on others' turns: `withdraw_votes`), that hold one of these messages, or
        answered before `before`; found through the indexes, not by reading every record."""
        threads, messages = list(dict.fromkeys(threads)), list(dict.fromkeys(message_ids))
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.zrange(turn_records_key(tenant, thread), 0, -1)
        if asker:
            pipe.smembers(turns_by_key(tenant, ASKER, asker))
        if messages:
            pipe.hmget(turn_messages_key(tenant), messages)
        if before is not None:
            pipe.zrangebyscore(turn_records_key(tenant), "-inf", f"({before!r}")
        rows = list(await pipe.execute())
        gone: set[str] = set()
        for _ in threads:
            gone |= {decode(i) for i in rows.pop(0)}
        if asker:
            gone |= {decode(i) for i in rows.pop(0)}
        if messages:
            gone |= {decode(i) for i in rows.pop(0) if i is not None}
        if before is not None:
            gone |= {decode(i) for i in rows.pop(0)}
        forgotten = await self.forget(tenant, gone)
        if asker:
            await self.withdraw_votes(tenant, asker, reject)
        await self.drop_threads(tenant, threads)
        return forgotten

    async def withdraw_votes(self, tenant: str, user: str, reject: Reject | None = None) -> int:
        """Withdraw every vote of `user` (their erasure); how many. Their voter index is read
        again until empty and only the ids read leave it, so a vote landing meanwhile is
        withdrawn too, never left in its record unindexed. Each turn's workflow then follows
        its 👎 left (`follow`), with `reject` (WorkflowStore.reject)."""
        key, withdrawn = turns_by_key(tenant, VOTER, user), 0
        for _ in range(WITHDRAW_ROUNDS):
            ids = sorted(decode(i) or "" for i in await self.redis.smembers(key))
            if not ids:
                break
            for turn_id in ids:
                with contextlib.suppress(UnknownTurn):  # forgotten meanwhile: no vote left
                    downs = await self.vote(tenant, turn_id, None, user=user)
                    withdrawn += 1
                    if reject is not None:
                        await self.follow(tenant, turn_id, downs, reject)
            await self.redis.srem(key, *ids)  # those whose record was gone
        return withdrawn

    async def follow(self, tenant: str, turn_id: str, downs: int, reject: Reject) -> None:
        """The turn's workflow rejected while it has a 👎 (`downs`), offered again once it has
        none: after a vote (bot/feedback.py) and after a withdrawal (`withdraw_votes`)."""
        record = await self.get(tenant, turn_id)
        if record.workflow:
            await reject(record.workflow, downs > 0, turn_id)

    async def drop_threads(self, tenant: str, threads: Iterable[str]) -> None:
        """A thread erased whole (memory/governance_threads.py): its usage counters and its
        place among the top threads go with it (usage is per thread, not per person; the
        tenant's and the days' totals stay). Its records go by `forget_where` (its index
        empties as they do)."""
        threads = list(threads)
        if not threads:
            return
        pipe = self.redis.pipeline(transaction=True)
        for thread in threads:
            pipe.delete(usage_key(tenant, thread))
        pipe.zrem(usage_threads_key(tenant), *threads)
        await pipe.execute()


def record_of(data: dict[str, Any], tenant: str, thread: str) -> TurnRecord:
    """A record from its JSON (`TurnRecord.to_json`, as exported), in `tenant` and `thread`."""
    known = {k: v for k, v in data.items() if k in TurnRecord.__dataclass_fields__}
    known.update(tenant=tenant, thread=thread)
    usage = known.pop("usage", None) or {}
    votes = [Vote(**v) for v in known.pop("feedback", None) or []]
    return TurnRecord(
        **known,
        usage=TurnUsage(**{n: int(usage.get(n, 0)) for n in USAGE_FIELDS}),
        feedback={v.user: v for v in votes},
    )


def _decode(row: dict) -> TurnRecord:
    data: dict[str, Any] = {}
    votes: dict[str, Vote] = {}
    for raw_name, raw_value in row.items():
        name, value = decode(raw_name), decode(raw_value)
        if name.startswith(VOTE):
            vote = json.loads(value)
            votes[vote["user"]] = Vote(**vote)
        elif name in JSON_FIELDS:
            data[name] = json.loads(value)
        elif name in ("created_at",):
            data[name] = float(value)
        elif name == "citations_removed":
            data[name] = int(float(value))
        elif name == "walled":
            data[name] = value == "True"
        elif name in TurnRecord.__dataclass_fields__:
            data[name] = value
    data["usage"] = TurnUsage(**data.get("usage", {}))
    return TurnRecord(**data, feedback=votes)
