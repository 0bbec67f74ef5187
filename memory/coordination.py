"""What bot processes share to serve one workspace together: which events were taken, each
thread's queue of jobs and who drains it, and which threads the bot takes part in.

The adapters' pipeline (`adapters/spine.py`) decides what to do; this module only keeps the
state in Redis, so it holds across processes and restarts.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from memory.keys import (
    busy_tenants_key,
    busy_threads_key,
    discord_cursor_tenants_key,
    discord_cursors_key,
    discord_given_up_key,
    joined_key,
    last_thread_key,
    seen_event_key,
    turn_done_key,
    turn_lock_key,
    turn_queue_key,
    turn_running_key,
    upgrade_key,
)
from memory.locks import OwnedLocks
from memory.scope import Scope
from memory.stores.base import decode

log = logging.getLogger(__name__)

SEEN_TTL_SECONDS = 3600
JOINED_TTL_SECONDS = 90 * 24 * 3600
EARLY_JOIN = "early"  # a thread joined before its mention was queued
EARLY_JOIN_TTL_SECONDS = 60

# Delete KEYS[1] only while it holds ARGV[1]: a claim someone else took (or a step recorded
# done) stays.
_DELETE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class EventLog:
    """Platforms redeliver events (Slack retries what was not acknowledged in time; a gateway
    resumes): the first delivery of an id goes through, the others are recognised."""

    def __init__(self, redis: Redis, ttl: int = SEEN_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl
        self._let_go = redis.register_script(_DELETE_IF_HELD)

    async def first_time(self, tenant: str, event_id: str, taker: str = "1") -> bool:
        """True for the first delivery of `event_id`, and again for the same `taker` (a
        caller retrying its own delivery after a failure is not a redelivery)."""
        key = seen_event_key(tenant, event_id)
        if await self.redis.set(key, taker, nx=True, ex=self.ttl):
            return True
        return taker != "1" and decode(await self.redis.get(key)) == taker

    async def let_go(self, tenant: str, event_id: str, taker: str) -> bool:
        """Forget `event_id`'s claim if `taker` still holds it, so a later delivery takes the
        event again: for one its taker gave up without queueing (a delivery that claimed it
        meanwhile keeps its claim). True if it was let go."""
        key = seen_event_key(tenant, event_id)
        return bool(await self._let_go(keys=[key], args=[taker]))


# Queue a job unless its event was taken before (de-duplication and queueing are one step, so
# a crash between them cannot swallow a platform's retry), and mark its thread busy.
_PUSH = """
if ARGV[4] ~= '' and not redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[4]) then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# The lease holder's next job: the one it (or a dead holder) was running, else the queue's head.
_TAKE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local job = redis.call('GET', KEYS[2])
if job then return {1, job} end
job = redis.call('LPOP', KEYS[3])
if not job then return {0} end
redis.call('SET', KEYS[2], job)
return {2, job}
"""

# Save the running job's progress (what was posted, the answer), while the lease is held.
_SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

# Keep the lease ARGV[1] (renew it; with a job's progress, ARGV[3], save that too): 0 when
# another run holds it. A lease gone altogether is taken again, unless another run had the
# job meanwhile: the running slot no longer holds what this run wrote last (ARGV[8], sha1
# ARGV[4]), or the job (ARGV[5]) was delivered or is queued. 2: taken again (the thread is
# marked busy again, and an emptied running slot given the job back, so recovery finds it
# should this process die). A lease another run took, or a running slot holding another job,
# while the memory had forgotten this one gets it at the head of the queue, with this run's
# latest progress, rather than lose it: -1.
_KEEP = """
local function elsewhere()
  if redis.call('EXISTS', KEYS[3]) == 1 then return true end
  local running = redis.call('GET', KEYS[2])
  if running and cjson.decode(running)['id'] == ARGV[5] then return true end
  for _, queued in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
    if cjson.decode(queued)['id'] == ARGV[5] then return true end
  end
  return false
end
local latest = ARGV[3] ~= '' and ARGV[3] or ARGV[8]
local function queued_again()
  if latest == '' or ARGV[5] == '' or elsewhere() then return 0 end
  redis.call('LPUSH', KEYS[4], latest)
  redis.call('ZADD', KEYS[5], 'NX', ARGV[6], ARGV[7])
  return -1
end
local holder = redis.call('GET', KEYS[1])
local running = false
if holder ~= ARGV[1] then
  if holder then return queued_again() end
  running = redis.call('GET', KEYS[2])
  if running and redis.sha1hex(running) ~= ARGV[4] then
    if cjson.decode(running)['id'] ~= ARGV[5] then return queued_again() end
    return 0
  end
  if ARGV[5] ~= '' and not running and elsewhere() then return 0 end
  redis.call('ZADD', KEYS[5], 'NX', ARGV[6], ARGV[7])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
elseif not holder and not running and ARGV[8] ~= '' then
  redis.call('SET', KEYS[2], ARGV[8])
end
if holder then return 1 end
return 2
"""


# The job was delivered: remember it, and clear it from the running slot if it is still there.
_COMPLETE = """
redis.call('SET', KEYS[3], 1, 'EX', ARGV[3])
local running = redis.call('GET', KEYS[2])
if running and cjson.decode(running)['id'] == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
"""

# Give the running job back to the head of the queue and the lease up (shutdown).
_HAND_BACK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local job = redis.call('GET', KEYS[2])
if job then redis.call('LPUSH', KEYS[3], job) redis.call('DEL', KEYS[2]) end
redis.call('DEL', KEYS[1])
return 1
"""

# Release the lease; a thread with nothing left to do is no longer busy. Returns the queue's
# length, so a job pushed just before the release is not left waiting.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local queued = redis.call('LLEN', KEYS[2])
if queued == 0 and redis.call('EXISTS', KEYS[3]) == 0 then redis.call('ZREM', KEYS[4], ARGV[2]) end
return queued
"""

DONE_TTL_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Taken:
    """What `TurnQueue.take` found: a job (raw JSON), and whether it was already running
    (taken over from a process that died or gave it back)."""

    job: str
    resumed: bool


class TurnQueue:
    """Each thread's jobs in a Redis list, run one at a time in arrival order by whichever
    process holds the thread's lease.

    At least once: a job stays in the thread's running slot until it is delivered, so when its
    process dies (its lease lapses) the next holder runs it again from its saved progress.
    Exactly once: a delivered job is recorded, and a re-run checks the record first.
    """

    def __init__(self, redis: Redis, seen_ttl: int = SEEN_TTL_SECONDS) -> None:
        self.redis = redis
        self.seen_ttl = seen_ttl
        self._locks = OwnedLocks(redis)
        self._push = redis.register_script(_PUSH)
        self._take = redis.register_script(_TAKE)
        self._save = redis.register_script(_SAVE)
        self._keep = redis.register_script(_KEEP)
        self._complete = redis.register_script(_COMPLETE)
        self._hand_back = redis.register_script(_HAND_BACK)
        self._release = redis.register_script(_RELEASE)

    @staticmethod
    def _keys(scope: Scope) -> tuple[str, str, str]:
        t, th = scope.tenant, scope.thread
        return turn_lock_key(t, th), turn_running_key(t, th), turn_queue_key(t, th)

    async def push(self, scope: Scope, job: str, event_id: str = "", watch: str = "") -> bool:
        """Queue `job`; False if `event_id` was taken before. `watch` names the set of
        threads whose lapsed leases a process looks for (its platform)."""
        tenant = scope.tenant
        seen = seen_event_key(tenant, event_id or "-")
        busy = busy_threads_key(tenant)
        ttl = str(self.seen_ttl) if event_id else ""
        queued = await self._push(
            keys=[seen, turn_queue_key(tenant, scope.thread), busy],
            args=[job, time.time(), scope.thread, ttl],
        )
        if queued and watch:
            await self.redis.sadd(busy_tenants_key(), f"{watch}:{tenant}")
        return bool(queued)

    async def lease(self, scope: Scope, token: str, ttl_ms: int) -> bool:
        return await self._locks.acquire(turn_lock_key(scope.tenant, scope.thread), token, ttl_ms)

    async def keep(
        self, scope: Scope, token: str, ttl_ms: int, job_id: str = "", last: str = "",
        job: str = "", watch: str = "",
    ) -> bool:  # fmt: skip
        """Renew the lease `token`, and save `job` (the running job's progress) if given; False
        when another run holds the lease or had the job meanwhile. A lease the memory forgot
        (a Redis restarted without persistence, a failover to an empty replica) is taken again
        rather than drop an answer no other run knows of. `last` is what this run last wrote to
        the running slot (the job as taken, then as saved), `job_id` the job it runs; `watch`
        as for `push` (the thread is listed again for recovery when the memory forgot it)."""
        tenant, thread = scope.tenant, scope.thread
        keys = [
            turn_lock_key(tenant, thread),
            turn_running_key(tenant, thread),
            turn_done_key(tenant, job_id or "-"),
            turn_queue_key(tenant, thread),
            busy_threads_key(tenant),
        ]  # all in the tenant's slot
        digest = hashlib.sha1(last.encode()).hexdigest() if last else ""
        args = [token, ttl_ms, job, digest, job_id, time.time(), thread, last]
        kept = int(await self._keep(keys=keys, args=args))
        if kept == 2:
            log.warning("the lease on %s was gone (memory lost its data?): taken again", thread)
        elif kept == -1:
            log.warning("%s in %s was forgotten by the memory: queued again", job_id, thread)
        if kept in (2, -1) and watch:  # another slot than the tenant's: a command of its own
            await self.redis.sadd(busy_tenants_key(), f"{watch}:{tenant}")
        return kept > 0

    async def leased(self, scope: Scope) -> bool:
        return bool(await self.redis.exists(turn_lock_key(scope.tenant, scope.thread)))

    async def take(self, scope: Scope, token: str) -> Taken | None:
        """The next job to run under the lease `token`, or None (queue empty or lease lost)."""
        reply = await self._take(keys=list(self._keys(scope)), args=[token])
        if int(reply[0]) <= 0:
            return None
        return Taken(decode(reply[1]), resumed=int(reply[0]) == 1)

    async def save(self, scope: Scope, token: str, job: str) -> bool:
        """Keep the running job's progress; False if the lease was lost meanwhile."""
        lock, running, _ = self._keys(scope)
        return bool(await self._save(keys=[lock, running], args=[token, job]))

    async def complete(self, scope: Scope, job_id: str) -> None:
        lock, running, _ = self._keys(scope)
        done = turn_done_key(scope.tenant, job_id)
        await self._complete(keys=[lock, running, done], args=["", job_id, DONE_TTL_SECONDS])

    async def delivered(self, scope: Scope, job_id: str) -> bool:
        return bool(await self.redis.exists(turn_done_key(scope.tenant, job_id)))

    async def hand_back(self, scope: Scope, token: str) -> bool:
        """Put the running job back at the head of the queue and give up the lease."""
        return bool(await self._hand_back(keys=list(self._keys(scope)), args=[token]))

    async def release(self, scope: Scope, token: str) -> int:
        """Give up the lease; the number of jobs still queued."""
        lock, running, queue = self._keys(scope)
        busy = busy_threads_key(scope.tenant)
        return int(
            await self._release(keys=[lock, queue, running, busy], args=[token, scope.thread])
        )

    async def busy(self, watch: str) -> list[Scope]:
        """Threads with queued or running jobs, of the tenants pushed to under `watch`."""
        found: list[Scope] = []
        for member in await self.redis.smembers(busy_tenants_key()):
            prefix, _, tenant = decode(member).rpartition(":")
            if prefix != watch:
                continue
            threads = await self.redis.zrange(busy_threads_key(tenant), 0, -1)
            found += [Scope(tenant, decode(t)) for t in threads]
        return found


class ThreadPresence:
    """Threads the bot takes part in (answered there without a new mention), and each person's
    latest thread with the bot per channel (Slack's `/summarize` defaults to it)."""

    def __init__(self, redis: Redis, ttl: int = JOINED_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    async def join(self, scope: Scope, reference: str | None = None) -> None:
        """The bot is in `scope.thread`; `reference` is what the platform needs to find the
        thread again for this person (e.g. Slack's thread_ts)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(joined_key(scope.tenant, scope.thread), 1, ex=self.ttl)
        if reference is not None and scope.user and scope.channel:
            pipe.hset(last_thread_key(scope.tenant, scope.channel), scope.user, reference)
        await pipe.execute()

    async def join_early(self, scope: Scope) -> None:
        """Mark `scope.thread` joined before its mention is queued (Slack is asked about it
        first): a follow-up a moment later is taken, and waits for the mention (`joining`).
        Never over a join that stands; gone soon if the mention is never queued."""
        await self.redis.set(
            joined_key(scope.tenant, scope.thread), EARLY_JOIN, ex=EARLY_JOIN_TTL_SECONDS, nx=True
        )

    async def joined(self, scope: Scope) -> bool:
        return bool(await self.redis.exists(joined_key(scope.tenant, scope.thread)))

    async def joining(self, scope: Scope) -> bool | None:
        """Whether the bot is in `scope.thread`, in one read: None if not, True if joined only
        early (the mention that opened it is not queued yet), False if joined."""
        state = decode(await self.redis.get(joined_key(scope.tenant, scope.thread)))
        return None if state is None else state == EARLY_JOIN

    async def last_thread(self, scope: Scope) -> str | None:
        """The reference given with this person's latest thread in `scope.channel`."""
        return decode(
            await self.redis.hget(last_thread_key(scope.tenant, scope.channel), scope.user)
        )


# A place's cursor moves forward only (a slower process, or an older message caught up late,
# never moves it back). Ids compare as numbers without floats: longer is later, then by digits.
_ADVANCE = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
local later = not old or #ARGV[2] > #old or (#ARGV[2] == #old and ARGV[2] > old)
if later then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return later and 1 or 0
"""

CURSOR_TTL_SECONDS = 7 * 24 * 3600


class PlaceCursors:
    """The last message seen in each Discord place (channel, thread, DM) the bot answers in,
    per tenant: a new gateway session reads what was posted after it (Discord replays missed
    events only to a session that resumes)."""

    def __init__(self, redis: Redis, ttl: int = CURSOR_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl
        self._advance = redis.register_script(_ADVANCE)

    async def advance(self, tenant: str, place: str, message_id: str) -> None:
        """One round trip; the tenant listed each time (`places` may have just unlisted it)."""
        pipe = self.redis.pipeline(transaction=False)
        cursors = discord_cursors_key(tenant)
        await self._advance(keys=[cursors], args=[place, message_id, self.ttl], client=pipe)
        pipe.sadd(discord_cursor_tenants_key(), tenant)
        await pipe.execute()

    async def tenants(self) -> list[str]:
        return sorted(decode(t) for t in await self.redis.smembers(discord_cursor_tenants_key()))

    async def places(self, tenant: str) -> dict[str, str]:
        """Place -> its cursor; a tenant with none left, nor a message given up (expired,
        erased), is unlisted."""
        return (await self.places_of([tenant]))[tenant]

    async def places_of(self, tenants: list[str]) -> dict[str, dict[str, str]]:
        """`places` of each tenant, in one round trip (a READY reads every tenant's)."""
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hgetall(discord_cursors_key(tenant))
            pipe.exists(discord_given_up_key(tenant))
        replies = await pipe.execute() if tenants else []
        found = dict(zip(tenants, replies[::2], strict=True))
        given_up = dict(zip(tenants, replies[1::2], strict=True))
        if gone := [t for t, cursors in found.items() if not cursors and not given_up[t]]:
            await self.redis.srem(discord_cursor_tenants_key(), *gone)
        return {
            tenant: {decode(place): decode(cursor) for place, cursor in cursors.items()}
            for tenant, cursors in found.items()
        }

    async def drop(self, tenant: str, *places: str) -> None:
        """Places not to catch up again (gone, or not seen for longer than the TTL)."""
        if places:
            await self.redis.hdel(discord_cursors_key(tenant), *places)

    async def answered(self, tenant: str, job_ids: list[str]) -> set[str]:
        """Which of `job_ids` were delivered (`TurnQueue.complete`, kept DONE_TTL_SECONDS):
        a message read again after its de-duplication (SEEN_TTL_SECONDS) lapsed is not
        answered twice."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(turn_done_key(tenant, job_id))
        found = await pipe.execute() if job_ids else []
        return {job_id for job_id, done in zip(job_ids, found, strict=True) if done}


# Record a given-up message (KEYS[1] field ARGV[1], the hash kept ARGV[2] seconds) and, when
# ARGV[3] is a delivery, let go of its claim KEYS[2] if that delivery still holds it: one step.
_GIVE_UP_MESSAGE = """
redis.call('HSET', KEYS[1], ARGV[1], '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return 1
"""


class GivenUpMessages:
    """The Discord messages the adapter gave up before their work was queued, per tenant
    (`discord_given_up_key`): the next READY's catch-up fetches each by id and takes it again,
    whatever passed its place's cursor meanwhile. The tenant is listed with the cursors'
    tenants (`PlaceCursors.tenants`), so a place with no cursor is not missed."""

    def __init__(self, redis: Redis, ttl: int) -> None:
        self.redis = redis
        self.ttl = ttl  # the catch-up's window: older messages are not answered that late
        self._give_up = redis.register_script(_GIVE_UP_MESSAGE)

    async def add(
        self, tenant: str, place: str, message_id: str, claim: tuple[str, str] | None = None
    ) -> None:
        """Record the message; with `claim` (its event id, the delivery that took it), let go
        of that claim in the same step, if the delivery still holds it: a record never stands
        beside a claim left held, which would make the next catch-up take the message for a
        duplicate and drop its record unanswered."""
        await self.redis.sadd(discord_cursor_tenants_key(), tenant)  # alone, it lists nothing
        event_id, taker = claim or ("", "")
        seen = seen_event_key(tenant, event_id) if claim else discord_given_up_key(tenant)
        await self._give_up(
            keys=[discord_given_up_key(tenant), seen],
            args=[f"{place}:{message_id}", self.ttl, taker if claim else ""],
        )

    async def of(self, tenants: list[str]) -> list[tuple[str, int, int]]:
        """(tenant, place, message id) of every message recorded for `tenants`, oldest first."""
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hkeys(discord_given_up_key(tenant))
        found: list[tuple[str, int, int]] = []
        for tenant, fields in zip(tenants, await pipe.execute() if tenants else [], strict=True):
            for field in fields:
                place, _, message_id = decode(field).partition(":")
                found.append((tenant, int(place), int(message_id)))
        return sorted(found, key=lambda given_up: given_up[2])

    async def drop(self, tenant: str, place: int, message_id: int) -> None:
        """Taken again, gone, or refused: not fetched again."""
        await self.redis.hdel(discord_given_up_key(tenant), f"{place}:{message_id}")


class Upgrades:
    """One-time steps on upgrade (e.g. back-filling a new index): done once, by one process."""

    DONE = "done"
    RUNNING = "running"

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._give_up = redis.register_script(_DELETE_IF_HELD)

    async def claim(self, name: str, ttl_seconds: int = 3600) -> bool:
        """True for the one process that should run step `name` now (not done, not running)."""
        claimed = await self.redis.set(upgrade_key(name), self.RUNNING, nx=True, ex=ttl_seconds)
        return bool(claimed)

    async def done(self, name: str) -> bool:
        return decode(await self.redis.get(upgrade_key(name))) == self.DONE

    async def finish(self, name: str) -> None:
        await self.redis.set(upgrade_key(name), self.DONE)

    async def release(self, name: str) -> None:
        """Give up the claim on a step that failed: the next try need not wait for it to lapse.
        A step recorded done (its `finish` applied, the reply lost) stays done."""
        await self._give_up(keys=[upgrade_key(name)], args=[self.RUNNING])
