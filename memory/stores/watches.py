"""Topic watches: a saved arXiv query that posts a digest of new papers to a place, every period.

A watch is a hash of its own (fields written apart, so the scheduler's `next_due` and a digest's
`since` never overwrite each other), listed in its tenant's set. One process-wide sorted set
scores every watch by its next due time: each bot process looks at it every minute.

Exactly one digest per period, across processes: `claim` is a Lua compare-and-set on the watch's
`next_due` that also takes the period's digest record for one claim token, both in the tenant's
slot. The digest task is queued first (its stream is in another slot) and carries the token;
the task claims again (the same token: idempotent) and runs only if its token holds the
period, so a crash between queueing and claiming loses no period and a duplicate task does
nothing. Periods are counted from the watch's creation (its phase), so a period missed while
no process ran is not posted on its own: the claim moves `next_due` to the first period end
after now, and the one digest covers everything since the last one (`since` moves only when a
digest is finished). The digest record says whether the period's message is being posted or was
posted (and its platform reference), so a digest task run again after a crash does not post
twice (bot/watch_digest.py). A watch whose place refused a digest is paused (off the due index) until
resumed; a digest arXiv did not answer is retried later (`retry`), with its failures counted.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from memory.ingest.arxiv_source import searchable
from memory.keys import (
    digest_key,
    digest_lock_key,
    watch_key,
    watch_posted_key,
    watch_seen_key,
    watches_due_key,
    watches_key,
)
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.base import decode

DAY = 86_400
MIN_PERIOD = 3600  # a watch's shortest period, in seconds
DIGEST_TTL = 90 * DAY  # a digest record outlives any retry of its task
POSTED_KEPT = 180 * DAY  # a paper posted this long ago may be posted again (it will not be new)
LOCK_SECONDS = 60  # a digest's lock, renewed while it runs; a dead holder's lapses this soon

# KEYS: a digest's lock. ARGV: the holder's token, seconds (0: release). Only its holder may.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then return redis.call('DEL', KEYS[1]) end
return redis.call('EXPIRE', KEYS[1], ARGV[2])
"""

# KEYS: the watch, the period's digest. ARGV: due, next due, now, the digest's TTL, the claim's
# token. Claiming again with the holder's token answers 2 (the task re-checks its claim).
_CLAIM = """
local holder = redis.call('HGET', KEYS[2], 'token')
if holder then if holder == ARGV[5] then return 2 end return 0 end
if redis.call('HGET', KEYS[1], 'next_due') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'paused') then return 0 end
redis.call('HSET', KEYS[2], 'claimed', ARGV[3], 'token', ARGV[5], 'next', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], 'next_due', ARGV[2])
return 1
"""

# KEYS: the watch, the tenant's set of watches. ARGV: the watch's fields as name, value pairs.
# A watch made again with the same id (a job run again) is left as it is.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

# KEYS: the watch. ARGV: the next due its period's claim set, the retry time, now. arXiv did not
# answer: the watch is due again at the retry time (unless a later period was claimed since).
_RETRY = """
if redis.call('HGET', KEYS[1], 'next_due') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'next_due', ARGV[2])
redis.call('HSETNX', KEYS[1], 'failing_since', ARGV[3])
return redis.call('HINCRBY', KEYS[1], 'failures', 1)
"""

# KEYS: the watch, the digest, the posted set. ARGV: state, until, now, ref, posted-kept, TTL,
# then the posted arXiv ids. `since` never moves back (a late catch-up of an older period).
_FINISH = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 0 end
redis.call('HSET', KEYS[2], 'state', ARGV[1], 'ref', ARGV[4], 'finished', ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[6])
local since = tonumber(redis.call('HGET', KEYS[1], 'since') or '0')
if since < tonumber(ARGV[2]) then redis.call('HSET', KEYS[1], 'since', ARGV[2]) end
if ARGV[1] == 'posted' then
  redis.call('HSET', KEYS[1], 'last_posted', ARGV[3])
  for i = 7, #ARGV do redis.call('ZADD', KEYS[3], ARGV[3], ARGV[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[5]))
end
redis.call('HDEL', KEYS[1], 'failures', 'failing_since')
return 1
"""


# KEYS: the watch, the period's digest. ARGV: now, the papers (JSON). About to post: "posting"
# only while the watch is there and running (a `/watch remove` or `pause` during the build wins).
_POSTING = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 'gone' end
if redis.call('HGET', KEYS[1], 'paused') then return 'paused' end
redis.call('HSET', KEYS[2], 'state', 'posting', 'posting_since', ARGV[1], 'papers', ARGV[2])
return 'ok'
"""

# KEYS: the watch. ARGV: why. Paused only if it is there: a removed watch is not made again as a
# hash of `paused` alone.
_PAUSE = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'paused', ARGV[1])
return 1
"""

# KEYS: the watch. ARGV: now. Resumed only if it is there (see _PAUSE).
_RESUME = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 0 end
redis.call('HDEL', KEYS[1], 'paused', 'failures', 'failing_since')
redis.call('HSET', KEYS[1], 'next_due', ARGV[1])
return 1
"""

# KEYS: the watch, its seen set. ARGV: until, kept after, then the arXiv ids. Kept only while
# the watch is there: a digest built across `/watch remove` does not make its set again.
_GIVEN = """
if redis.call('HEXISTS', KEYS[1], 'id') == 0 then return 0 end
for i = 3, #ARGV do redis.call('ZADD', KEYS[2], 'LT', ARGV[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
return 1
"""


class InvalidWatch(ValueError):
    """A watch that cannot be made (empty topic, bad period, a place that cannot be posted to)."""


REMAKE = "make it again in English words, or with a category or an author"


def unsearchable(query: str) -> str:
    """Why a watch whose topic has no word arXiv can search, and no category nor author, is
    refused (`create`) or paused (`restore`, and a digest of one saved before it was refused):
    its arXiv query would be every paper submitted in the period."""
    return (
        f"I cannot search arXiv for “{query[:80]}”: its search reads only Latin letters and digits"
    )


def remake(query: str) -> str:
    """Why a watch on `query` cannot run, and what to do instead."""
    return f"{unsearchable(query)}; {REMAKE}"


def remove_advice(watch_id: str) -> str:
    """What to do with a watch arXiv cannot search: make it anew, and remove this one."""
    return f"{REMAKE}, and `/watch remove {watch_id}` this one"


@dataclass
class Watch:
    """A topic watch. Times are Unix seconds; `next_due` whole seconds (the claim compares it)."""

    id: str
    tenant: str
    query: str
    period: int  # seconds
    platform: str  # "slack", "discord", "terminal"
    channel: str
    thread: str = ""  # a thread to post in; "" for the channel itself
    audience: str = PUBLIC  # of the place it posts to: who may list and remove it
    categories: list[str] = field(default_factory=list)
    authors: list[str] = field(default_factory=list)
    created_by: str = ""
    created_at: float = 0.0
    since: float = 0.0  # papers submitted after this are new to the next digest
    last_posted: float = 0.0
    next_due: int = 0
    paused: str = ""  # why its place refused a digest; "" while it runs
    failures: int = 0  # digests in a row arXiv did not answer (retried later)
    failing_since: float = 0.0

    def fields(self) -> dict[str, str]:
        data = asdict(self)
        for name in ("paused", "failures", "failing_since"):  # set only while they apply
            data.pop(name)
        data["categories"] = json.dumps(self.categories)
        data["authors"] = json.dumps(self.authors)
        return {k: str(v) if not isinstance(v, str) else v for k, v in data.items()}

    @classmethod
    def from_fields(cls, row: dict[Any, Any]) -> Watch:
        data = {decode(k): decode(v) for k, v in row.items()}
        return cls(
            id=data["id"], tenant=data["tenant"], query=data["query"], period=int(data["period"]),
            platform=data["platform"], channel=data["channel"], thread=data.get("thread", ""),
            audience=data.get("audience") or PUBLIC,
            categories=json.loads(data.get("categories") or "[]"),
            authors=json.loads(data.get("authors") or "[]"),
            created_by=data.get("created_by", ""), created_at=float(data.get("created_at") or 0),
            since=float(data.get("since") or 0), last_posted=float(data.get("last_posted") or 0),
            next_due=int(float(data.get("next_due") or 0)), paused=data.get("paused", ""),
            failures=int(data.get("failures") or 0),
            failing_since=float(data.get("failing_since") or 0),
        )  # fmt: skip

    @property
    def period_name(self) -> str:
        if self.period == DAY:
            return "daily"
        if self.period == 7 * DAY:
            return "weekly"
        days = self.period / DAY
        return f"every {days:g} days" if days >= 1 else f"every {self.period} s"

    @property
    def searchable(self) -> bool:
        """Whether its arXiv query asks for more than the period (memory/ingest/arxiv_source.py)."""
        return searchable(self.query, self.categories, self.authors)

    def next_after(self, now: float) -> int:
        """The first period end after `now`, counted from the watch's creation (its phase)."""
        anchor = int(self.created_at)
        return anchor + (int((now - anchor) // self.period) + 1) * self.period


@dataclass
class DigestRecord:
    """What is known of one period's digest: claimed, being posted, posted (with the platform's
    reference of the message) or empty (nothing new)."""

    claimed: float = 0.0
    token: str = ""  # the claim's: only the task carrying it runs the period
    next: int = 0  # the `next_due` the claim set
    state: str = ""  # "", "posting", "posted", "empty", "failed", "folded", "retry", "gone",
    # "paused" (the last two: removed or paused while its digest was built, nothing posted)
    ref: str = ""
    posting_since: float = 0.0
    papers: list[str] = field(default_factory=list)  # the arXiv ids being (or) posted

    @property
    def finished(self) -> bool:
        return self.state in ("posted", "empty", "failed", "folded", "retry", "gone", "paused")


class WatchStore:
    def __init__(self, redis) -> None:
        self.redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._create = redis.register_script(_CREATE)
        self._retry = redis.register_script(_RETRY)
        self._finish = redis.register_script(_FINISH)
        self._renew = redis.register_script(_RENEW)
        self._posting = redis.register_script(_POSTING)
        self._pause = redis.register_script(_PAUSE)
        self._resume = redis.register_script(_RESUME)
        self._given = redis.register_script(_GIVEN)

    # -- the watches -------------------------------------------------------------------------

    async def create(
        self, scope: Scope, query: str, period: int, *, platform: str, channel: str,
        thread: str = "", categories: list[str] | None = None, authors: list[str] | None = None,
        now: float | None = None, watch_id: str = "",
    ) -> Watch:  # fmt: skip
        """A new watch for the place `scope` is in. Its first digest is due at once and covers
        the period before it: a new watch shows what it will bring. `watch_id` (derived from
        the job that asked): made again, the same watch is returned unchanged."""
        query = " ".join((query or "").split())
        if not query and not categories and not authors:
            raise InvalidWatch("A watch needs a topic, a category or an author.")
        if not searchable(query, categories, authors):
            raise InvalidWatch(
                f"{unsearchable(query)}. Say the topic in English words, or add a category "
                "(cat:cs.CL) or an author (author:Name)."
            )
        if period < MIN_PERIOD:
            raise InvalidWatch("A watch's period is at least an hour.")
        now = time.time() if now is None else now
        watch = Watch(
            id=watch_id or uuid.uuid4().hex[:8], tenant=scope.tenant, query=query[:300], period=int(period),
            platform=platform, channel=channel, thread=thread, audience=scope.audience,
            categories=list(categories or []), authors=list(authors or []),
            created_by=scope.user, created_at=now, since=now - period, next_due=int(now),
        )  # fmt: skip
        pairs = [item for pair in watch.fields().items() for item in pair]  # "id" first
        made = await self._create(
            keys=[watch_key(scope.tenant, watch.id), watches_key(scope.tenant)], args=pairs
        )
        if not made:  # made before, perhaps by a run that crashed before indexing it
            existing = await self.get(scope.tenant, watch.id)
            if existing is not None and not existing.paused:  # NX: a claim's index stands
                await self.redis.zadd(
                    watches_due_key(), {_member(existing): existing.next_due}, nx=True
                )
            return existing or watch
        await self.redis.zadd(watches_due_key(), {_member(watch): watch.next_due})
        return watch

    async def get(self, tenant: str, watch_id: str) -> Watch | None:
        if not watch_id or any(c in watch_id for c in ":{}| \n"):
            return None
        row = await self.redis.hgetall(watch_key(tenant, watch_id))
        return Watch.from_fields(row) if _whole(row) else None

    async def all(self, tenant: str) -> list[Watch]:
        ids = sorted(decode(i) for i in await self.redis.smembers(watches_key(tenant)))
        pipe = self.redis.pipeline(transaction=False)
        for watch_id in ids:
            pipe.hgetall(watch_key(tenant, watch_id))
        rows = await pipe.execute() if ids else []
        watches = [Watch.from_fields(row) for row in rows if _whole(row)]
        return sorted(watches, key=lambda w: w.created_at)

    async def visible(self, scope: Scope, channel: str | None = None) -> list[Watch]:
        """The watches `scope` may see (their place's audience), of one channel if given."""
        return [
            w
            for w in await self.all(scope.tenant)
            if scope.can_see(w.audience) and (channel is None or w.channel == channel)
        ]

    async def remove(self, tenant: str, watch_id: str) -> bool:
        watch = await self.get(tenant, watch_id)
        if watch is None:
            return False
        await self.redis.zrem(watches_due_key(), _member(watch))
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(
            watch_key(tenant, watch_id),
            watch_posted_key(tenant, watch_id),
            watch_seen_key(tenant, watch_id),
        )
        pipe.srem(watches_key(tenant), watch_id)
        await pipe.execute()
        return True

    async def pause(self, watch: Watch, why: str) -> bool:
        """Its place refused a digest (or someone paused it): no period is claimed until it is
        resumed. False when the watch is gone (removed meanwhile): nothing is written."""
        if not await self._pause(keys=[watch_key(watch.tenant, watch.id)],
                                 args=[why[:300] or "refused"]):  # fmt: skip
            return False
        await self.redis.zrem(watches_due_key(), _member(watch))
        watch.paused = why
        return True

    async def resume(self, watch: Watch, now: float) -> bool:
        """Due again at once; its next digest covers everything since the last one. False when
        the watch is gone (removed meanwhile)."""
        if not await self._resume(keys=[watch_key(watch.tenant, watch.id)], args=[str(int(now))]):
            return False
        watch.paused, watch.next_due = "", int(now)
        await self.redis.zadd(watches_due_key(), {_member(watch): watch.next_due})
        return True

    async def restore(self, watch: Watch, posted: dict[str, float], now: float) -> Watch:
        """A watch read from an export (memory/portability.py), written into `watch.tenant` with
        the papers its digests posted. Its schedule is kept, but a period end that passed
        before `now` moves to the first one after it, as after any missed period: an import
        posts nothing at once, and the next digest covers everything since the last one
        (`since` is kept). A paused watch stays paused, off the due index. A creation time
        after `now` (the exporting machine's clock ran ahead) is taken as `now`: the import
        must not look like a watch made since it began (`Portability.used_since`). A watch
        `create` would refuse now, its topic unsearchable (saved before that was refused), is
        kept but paused with that reason: `/watch list` says why, and it never asks arXiv for
        every paper of a period."""
        watch.created_at = min(watch.created_at, now)
        if not watch.searchable:
            watch.paused = remake(watch.query)
        if not watch.paused and watch.next_due <= now:
            watch.next_due = watch.next_after(now)
        data = watch.fields()
        kept = {"paused": watch.paused, "failures": watch.failures,
                "failing_since": watch.failing_since}  # fmt: skip
        data.update({name: str(value) for name, value in kept.items() if value})
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(watch_key(watch.tenant, watch.id), mapping=data)
        pipe.sadd(watches_key(watch.tenant), watch.id)
        if posted:
            pipe.zadd(watch_posted_key(watch.tenant, watch.id), posted)
        await pipe.execute()
        if not watch.paused:
            await self.redis.zadd(watches_due_key(), {_member(watch): watch.next_due})
        return watch

    async def unschedule_all(self, tenant: str) -> None:
        """Take every watch of the tenant off the due index (the tenant is being dropped)."""
        ids = [decode(i) for i in await self.redis.smembers(watches_key(tenant))]
        if ids:
            await self.redis.zrem(watches_due_key(), *(_member_of(tenant, i) for i in ids))

    async def forget_creator(self, tenant: str, user: str) -> int:
        """A person is erased: their id leaves the watches they made (the watches stay, they
        belong to their places), and those made in a DM go (`remove_in`: the DM is theirs, its
        digests would keep their query and keep posting to them); a pause they made no longer
        names them. Returns how many they made."""
        watches = await self.all(tenant)
        mine = [w for w in watches if user and w.created_by == user]
        removed = await self.remove_in(tenant, {w.audience for w in mine if _in_dm(w)})
        for watch in mine:
            if watch.audience not in removed:
                await self.redis.hset(watch_key(tenant, watch.id), "created_by", "")
        named = re.compile(rf"\b{re.escape(user)}\b") if user else None
        for watch in watches:  # "paused by <their id>" (bot/watch_commands.py) names them too
            if named and named.search(watch.paused) and watch.audience not in removed:
                unnamed = named.sub("someone", watch.paused)
                await self.redis.hset(watch_key(tenant, watch.id), "paused", unnamed)
        return len(mine)

    async def remove_in(self, tenant: str, audiences: set[str]) -> set[str]:
        """Remove every watch posting to one of these audiences (a person's DMs, erased), off
        the schedule too (`remove`). Returns the audiences that had one."""
        removed = set()
        for watch in await self.all(tenant) if audiences else []:
            if watch.audience in audiences and await self.remove(tenant, watch.id):
                removed.add(watch.audience)
        return removed

    # -- the schedule ----------------------------------------------------------------------

    async def due(self, now: float, limit: int = 200, offset: int = 0) -> list[tuple[str, str]]:
        """(tenant, watch id) of the watches due at `now`, most overdue first, from the
        `offset`th (past those a scheduler left for another platform's processes)."""
        members = await self.redis.zrangebyscore(watches_due_key(), "-inf", now, offset, limit)
        return [tuple(decode(m).split("|", 1)) for m in members]  # type: ignore[misc]

    async def reindex(self, watch: Watch | None, tenant: str, watch_id: str) -> None:
        """Put the due index right: a removed watch out, another at its `next_due`."""
        member = _member_of(tenant, watch_id)
        if watch is None:
            await self.redis.zrem(watches_due_key(), member)
        else:
            await self.redis.zadd(watches_due_key(), {member: watch.next_due})

    async def claim(
        self, watch: Watch, now: float, token: str = "", due: int | None = None,
        next_due: int | None = None,
    ) -> int | None:  # fmt: skip
        """Take the watch's due period for `token`, if no other token has it: returns the
        period's `due` (the key of its digest) and moves `next_due` to the first period end
        after `now` (missed periods are covered by this one digest); None when another token
        has it. Claiming again with the same token (and `due`, `next_due`) answers the same."""
        due = watch.next_due if due is None else due
        next_due = watch.next_after(now) if next_due is None else next_due
        took = await self._claim(
            keys=[watch_key(watch.tenant, watch.id), digest_key(watch.tenant, watch.id, str(due))],
            args=[str(due), str(next_due), repr(now), DIGEST_TTL, token or uuid.uuid4().hex],
        )
        if not took:
            return None
        if took == 1:  # moved now (2: it was, by this token, and may have moved on since)
            watch.next_due = next_due
            await self.redis.zadd(watches_due_key(), {_member(watch): next_due})
        return due

    async def retry(self, watch: Watch, claimed_next: int, retry_at: float, now: float) -> int:
        """arXiv did not answer this period's digest: due again at `retry_at` (if no later
        period was claimed since); returns the failures in a row (0: a later period has it)."""
        failures = await self._retry(
            keys=[watch_key(watch.tenant, watch.id)],
            args=[str(claimed_next), str(int(retry_at)), repr(now)],
        )
        if int(failures) < 0:
            return 0
        watch.next_due = int(retry_at)
        await self.redis.zadd(watches_due_key(), {_member(watch): watch.next_due})
        return int(failures)

    # -- a period's digest -----------------------------------------------------------------

    async def digest(self, tenant: str, watch_id: str, due: str) -> DigestRecord:
        row = {
            decode(k): decode(v)
            for k, v in (await self.redis.hgetall(digest_key(tenant, watch_id, due))).items()
        }
        return DigestRecord(
            claimed=float(row.get("claimed") or 0), token=row.get("token", ""),
            next=int(float(row.get("next") or 0)), state=row.get("state", ""),
            ref=row.get("ref", ""), posting_since=float(row.get("posting_since") or 0),
            papers=json.loads(row.get("papers") or "[]"),
        )  # fmt: skip

    async def lock(self, tenant: str, watch_id: str, due: str, token: str) -> bool:
        """Run this period's digest alone (a task can be handed to a second process while the
        first still runs it); the lock lapses after LOCK_SECONDS if its holder dies."""
        key = digest_lock_key(tenant, watch_id, due)
        return bool(await self.redis.set(key, token, nx=True, ex=LOCK_SECONDS))

    async def renew(self, tenant: str, watch_id: str, due: str, token: str) -> bool:
        """Keep holding the lock (False: it lapsed and is someone else's)."""
        return bool(await self._renew(
            keys=[digest_lock_key(tenant, watch_id, due)], args=[token, LOCK_SECONDS]
        ))  # fmt: skip

    async def unlock(self, tenant: str, watch_id: str, due: str, token: str) -> None:
        await self._renew(keys=[digest_lock_key(tenant, watch_id, due)], args=[token, 0])

    async def posting(
        self, tenant: str, watch_id: str, due: str, now: float, arxiv_ids: list[str]
    ) -> str:
        """About to post these papers: a re-run that finds this looks for the message first.
        Recorded only if the watch is still there and running, checked with the write (its
        digest took a while to build): "ok", else "gone" or "paused" (nothing recorded)."""
        said = await self._posting(
            keys=[watch_key(tenant, watch_id), digest_key(tenant, watch_id, due)],
            args=[repr(now), json.dumps(arxiv_ids)],
        )
        return decode(said)

    async def settle(self, tenant: str, watch_id: str, due: str, state: str, why: str = "") -> None:
        """The period ends without a post, `since` where it was: "failed" (the platform
        refused it), "folded" (a later period covers it), "retry" (arXiv did not answer),
        "gone" or "paused" (removed or paused while its digest was built)."""
        key = digest_key(tenant, watch_id, due)
        pipe = self.redis.pipeline(transaction=True)  # a removed watch's record lapses too
        pipe.hset(key, mapping={"state": state, "error": why[:500]})
        pipe.expire(key, DIGEST_TTL)
        await pipe.execute()

    async def finish(
        self, watch: Watch, due: str, until: float, now: float, ref: str = "",
        posted: list[str] | None = None,
    ) -> None:  # fmt: skip
        """The period is done: posted (with the message's reference and the papers it showed)
        or empty; the watch's `since` moves to `until`."""
        await self._finish(
            keys=[
                watch_key(watch.tenant, watch.id),
                digest_key(watch.tenant, watch.id, due),
                watch_posted_key(watch.tenant, watch.id),
            ],
            args=["posted" if posted else "empty", repr(until), repr(now), ref, POSTED_KEPT,
                  DIGEST_TTL, *(posted or [])],
        )  # fmt: skip

    async def posted(self, watch: Watch, arxiv_ids: list[str]) -> set[str]:
        """Which of these papers the watch's earlier digests showed."""
        if not arxiv_ids:
            return set()
        scores = await self.redis.zmscore(watch_posted_key(watch.tenant, watch.id), arxiv_ids)
        return {a for a, s in zip(arxiv_ids, scores, strict=True) if s is not None}

    async def given(
        self, watch: Watch, arxiv_ids: list[str], until: float, kept_after: float
    ) -> None:
        """A digest up to `until` was given these papers by arXiv: each keeps its earliest
        digest's `until` (ZADD LT); those before `kept_after` go (no window reaches them).
        Nothing is kept for a watch removed meanwhile (its set is not made again)."""
        await self._given(
            keys=[watch_key(watch.tenant, watch.id), watch_seen_key(watch.tenant, watch.id)],
            args=[repr(until), repr(kept_after), *arxiv_ids],
        )

    async def seen(self, watch: Watch, arxiv_ids: list[str]) -> set[str]:
        """Which of these papers an earlier digest was given and finished (its `until` is at
        or before the watch's `since`): a digest that did not finish (refused, crashed) counts
        for nothing."""
        if not arxiv_ids:
            return set()
        scores = await self.redis.zmscore(watch_seen_key(watch.tenant, watch.id), arxiv_ids)
        return {
            a for a, s in zip(arxiv_ids, scores, strict=True) if s is not None and s <= watch.since
        }


def _whole(row: dict[Any, Any]) -> bool:
    """A watch's hash as `create` wrote it: one with no id (a field written after its removal)
    is no watch."""
    return any(decode(name) == "id" for name in row)


def _in_dm(watch: Watch) -> bool:
    return watch.audience.startswith(f"{Visibility.DM.value}:")


def _member(watch: Watch) -> str:
    return _member_of(watch.tenant, watch.id)


def _member_of(tenant: str, watch_id: str) -> str:
    """A watch in the due index, which every tenant shares."""
    return f"{tenant}|{watch_id}"
