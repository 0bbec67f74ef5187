"""A whole tenant erased: by an operator (`arxivscout memory forget tenant`), or some days after
its workspace or server removed the bot (Slack `app_uninstalled`, `tokens_revoked`; Discord
`on_guild_remove`). A removed team can no longer reach the memory page to see or erase what is
kept, so the erasure is scheduled in Redis (`uninstalled_key`, scored by when it is due) and
done by whichever process's tick comes first (bot/upkeep.py `erase_uninstalled`); the bot
coming back cancels it.

The erasure is `MemoryManager.drop_tenant` (every key, index and due watch of the tenant, but
its erasure lock) under the tenant's erasure lock (memory/governance.py), held to the end, plus
what process-wide keys say of it: the dead letters whose task names it, its entry in the busy
tenants, its scheduled erasure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from memory.dead_letters import dead_letter_streams, dead_letters
from memory.embeddings import cache_keys
from memory.governance import (
    ERASURE_RUNNING,
    LOCK_TTL_MS,
    LOCK_WAIT_SECONDS,
    ImportRunning,
    import_running,
)
from memory.governance_erasure import Busy, Erasure
from memory.governance_purge import message_texts
from memory.keys import (
    InvalidName,
    busy_tenants_key,
    erased_tenant_key,
    forgetting_key,
    messages_key,
    papers_key,
    threads_key,
    turn_records_key,
    uninstalled_key,
    validate_tenant,
    watches_key,
)
from memory.locks import OwnedLocks
from memory.scope import Scope, TenantKind, tenant_kind
from memory.stores.base import decode, delete_keys
from memory.tasks import payload_tenants

DAY = 86_400.0
DEFAULT_KEEP_DAYS = 30.0  # ARXIVSCOUT_UNINSTALLED_KEEP_DAYS
ERASED_NOTE_SECONDS = DAY  # how long work queued before an erasure is refused after it

log = logging.getLogger(__name__)

# Unschedule ARGV[1] from KEYS[1] only if its due time is still ARGV[2]: a removal again
# meanwhile (a new due time) stays scheduled.
_UNSCHEDULE_IF = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if due and tonumber(due) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""


@dataclass
class TenantErasure(Erasure):
    """What went with a whole tenant (counted before it went), and the process-wide entries."""

    watches: int = 0
    dead_letters: int = 0  # tasks given up on whose payload names the tenant


class TenantErasures:
    """Erase whole tenants, now or `keep_days` after the bot was removed."""

    def __init__(self, memory: Any, keep_days: float = DEFAULT_KEEP_DAYS) -> None:
        self.memory = memory
        self.redis = memory.redis
        self.keep_days = keep_days
        self._locks = OwnedLocks(memory.redis)
        self._unschedule_if = memory.redis.register_script(_UNSCHEDULE_IF)

    # -- scheduled by a removal, cancelled by a return ------------------------------------------

    async def schedule(self, tenant: str, now: float | None = None) -> float | None:
        """The bot was removed: erase the tenant `keep_days` from now (kept at the earlier time
        when already scheduled). None, and nothing scheduled, for a Discord person's DMs: they
        are theirs, not a server's; nor for a name no tenant has."""
        try:
            validate_tenant(tenant)
        except InvalidName:
            log.warning("bot removed from %r, which names no tenant: nothing scheduled", tenant)
            return None
        if tenant_kind(tenant) in (TenantKind.DISCORD_DM, TenantKind.UNKNOWN):
            return None
        due = (time.time() if now is None else now) + self.keep_days * DAY
        await self.redis.zadd(uninstalled_key(), {tenant: due}, lt=True)
        due = float(await self.redis.zscore(uninstalled_key(), tenant) or due)
        log.info("bot removed from tenant %s: its memory is erased at %s unless it returns",
                 tenant, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(due)))  # fmt: skip
        return due

    async def scheduled(self, tenant: str) -> float | None:
        """When the tenant's erasure is due, or None."""
        due = await self.redis.zscore(uninstalled_key(), tenant)
        return None if due is None else float(due)

    async def cancel(self, tenants: Iterable[str]) -> list[str]:
        """The bot is back (an event from the team, a server joined): their erasures are off.
        One read when none is scheduled, the usual case; returns the tenants cancelled."""
        tenants = list(dict.fromkeys(t for t in tenants if t))
        if not tenants:
            return []
        dues = await self.redis.zmscore(uninstalled_key(), tenants)
        back = [t for t, due in zip(tenants, dues, strict=True) if due is not None]
        if back:
            await self.redis.zrem(uninstalled_key(), *back)
            log.info("bot back in tenant %s: its scheduled erasure is cancelled", ", ".join(back))
        return back

    async def erase_due(self, now: float | None = None) -> list[str]:
        """The tick: erase every tenant whose erasure is due. One whose erasure lock another
        (an erasure, an import) holds, or whose erasure failed, is left for the next tick
        (each tenant stays scheduled until it is erased); one cancelled meanwhile is not
        erased."""
        now = time.time() if now is None else now
        erased = []
        for raw, due in await self.redis.zrangebyscore(uninstalled_key(), "-inf", now,
                                                       withscores=True):  # fmt: skip
            tenant = decode(raw) or ""
            try:
                if await self._erase_if_due(tenant, float(due)):
                    erased.append(tenant)
            except InvalidName:  # never written by `schedule`: nothing of it to erase
                await self.redis.zrem(uninstalled_key(), raw)
            except ImportRunning:
                log.info("erasure of tenant %s waits: an import is running", tenant)
            except Busy:
                log.info("erasure of tenant %s waits: another erasure holds it", tenant)
            except Exception:  # Redis away, a bug: still scheduled, tried again next tick
                log.exception("erasure of tenant %s failed; tried again at the next tick", tenant)
        return erased

    async def _erase_if_due(self, tenant: str, due: float) -> bool:
        async with self._exclusive(tenant, wait_seconds=0.0):
            if await self.scheduled(tenant) != due:  # cancelled, or removed again, meanwhile
                return False
            erasure = await self._erase(tenant)
        await self._unschedule_if(keys=[uninstalled_key()], args=[tenant, repr(due)])
        log.info("erased tenant %s, its bot removed: %d items", tenant, erasure.total)
        return True

    # -- now -------------------------------------------------------------------------------------

    async def erase(self, tenant: str) -> TenantErasure:
        """Erase everything the tenant's memory holds now, and cancel its scheduled erasure."""
        validate_tenant(tenant)
        async with self._exclusive(tenant, wait_seconds=LOCK_WAIT_SECONDS):
            erasure = await self._erase(tenant)
        await self.redis.zrem(uninstalled_key(), tenant)
        return erasure

    async def _erase(self, tenant: str) -> TenantErasure:
        """Under the erasure lock, which the drop leaves (every other key of the tenant goes):
        no other erasure of the tenant starts until this one ends."""
        erasure = await self._count(tenant)
        cached = await self._cache_keys(tenant)  # read while its texts are stored,
        # noted right before the drop (not before the reads above, which may fail with nothing
        # dropped), outside its keys: work queued before and run after takes nothing. On
        # Redis's clock: it is compared with stream ids (memory/tasks.py `erased_since`)
        seconds, micros = await self.redis.time()
        await self.redis.set(
            erased_tenant_key(tenant), repr(seconds + micros / 1e6), ex=int(ERASED_NOTE_SECONDS)
        )
        await self.memory.drop_tenant(tenant)
        # deleted after the drop: a task embedding one meanwhile cached it again
        erasure.cached_embeddings = await delete_keys(self.redis, cached) if cached else 0
        erasure.dead_letters = await self._drop_dead_letters(tenant)
        await self._forget_busy(tenant)
        return erasure

    async def _forget_busy(self, tenant: str) -> None:
        """Take the tenant out of the busy set, under each platform it was queued for
        (`<platform>:<tenant>`, memory/coordination.py `TurnQueue.push`), or every process
        would look for its lapsed leases every few seconds for ever."""
        members = [decode(m) or "" for m in await self.redis.smembers(busy_tenants_key())]
        gone = [m for m in members if m.rpartition(":")[2] == tenant]
        if gone:
            await self.redis.srem(busy_tenants_key(), *gone)

    async def _count(self, tenant: str) -> TenantErasure:
        """What the tenant holds, per store, read before it goes (for the operator's report)."""
        threads = [decode(t) or "" for t in await self.redis.zrange(threads_key(tenant), 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            with contextlib.suppress(InvalidName):  # a name no thread has: no messages either
                pipe.llen(messages_key(tenant, thread))
        pipe.hlen(papers_key(tenant))
        pipe.zcard(turn_records_key(tenant))
        pipe.scard(watches_key(tenant))
        *messages, papers, turns, watches = await pipe.execute()
        memory = self.memory
        stores = {"chunks": memory.knowledge_base, "workflows": memory.workflows,
                  "entities": memory.entities, "episodes": memory.episodes}  # fmt: skip
        documents = {
            field: await self._keys_under(store.key_prefix(tenant))
            for field, store in stores.items()
        }
        return TenantErasure(
            threads=len(threads), messages=sum(messages), papers=papers, turn_records=turns,
            watches=watches, **documents,
        )  # fmt: skip

    async def _cache_keys(self, tenant: str) -> set[str]:
        """The cache keys of the vectors of the tenant's texts (its messages' and workflows',
        as thread and person erasures uncache them; entity lines are embedded uncached): the
        cache is keyed by model and text, not by tenant, so the drop leaves them. One thread's
        messages read at a time; only the keys are kept."""
        keys: set[str] = set()
        model = self.memory.embedder.model_name
        for thread, _ in await self.memory.conversation.threads(tenant):
            with contextlib.suppress(InvalidName):  # a name no thread has: no messages either
                messages = await self.memory.conversation.all(Scope(tenant, thread))
                keys |= cache_keys(model, (t for m in messages for t in message_texts(m)))
        prefix = self.memory.workflows.key_prefix(tenant)
        pipe = self.redis.pipeline(transaction=False)
        async for key in self.redis.scan_iter(match=f"{prefix}*", count=1000):
            pipe.hget(key, "text")
        return keys | cache_keys(model, (decode(text) or "" for text in await pipe.execute()))

    async def _keys_under(self, prefix: str) -> int:
        return sum([1 async for _ in self.redis.scan_iter(match=f"{prefix}*", count=1000)])

    async def _drop_dead_letters(self, tenant: str) -> int:
        """Delete the dead letters whose task's payload names the tenant (its `tenant`, or its
        scope's): a task given up on keeps what it was asked, a question's text among it."""
        dropped = 0
        for stream in await dead_letter_streams(self.redis):
            ids = [d.id for d in await dead_letters(stream) if names_tenant(d.payload, tenant)]
            if ids:
                dropped += await self.redis.xdel(stream.dead_stream, *ids)
        return dropped

    @contextlib.asynccontextmanager
    async def _exclusive(self, tenant: str, wait_seconds: float) -> AsyncIterator[None]:
        """The tenant's erasure lock, the one every erasure takes (memory/governance.py),
        renewed while held (waiting up to `wait_seconds` for it; held by an import,
        `ImportRunning` at once)."""
        key, token = forgetting_key(tenant), uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while not await self._locks.acquire(key, token, LOCK_TTL_MS):
            if await import_running(self.redis, tenant):  # may write for long: no wait
                raise ImportRunning()
            if loop.time() >= deadline:
                raise Busy(ERASURE_RUNNING)
            await asyncio.sleep(0.05)
        async with self._locks.kept(key, token, LOCK_TTL_MS):
            yield


def names_tenant(payload: Any, tenant: str) -> bool:
    """Whether a task's payload is the tenant's (memory/tasks.py `payload_tenants`)."""
    return tenant in payload_tenants(payload)


async def erased_at(redis: Any, tenant: str) -> float | None:
    """When the tenant's whole erasure began, if one did in the last day (`erased_tenant_key`):
    work queued before it (a share) is not done after it."""
    note = await redis.get(erased_tenant_key(tenant))
    return None if note is None else float(note)
