"""Export and import of a tenant's memory (or one thread's) as JSON Lines.

One JSON object per line, each with a `kind`. The first line is the header:
`{"kind": "arxivscout-export", "version": 2, "tenant": ..., "thread": ... (null for a whole
tenant), "exported_at": ..., "embeddings": {"model": ..., "dims": ...}}`; the last (since
version 2) the end line, `{"kind": "end", "counts": {"threads": n, "messages": n, ...}}`: a file
without it was cut short, and is refused (a version 1 file, which has none, is read as before),
as is one whose lines are not those it counts (lines lost from the middle). Between them:

- `retention` (a whole tenant's own setting, if it has one): `days`, null for "kept for ever";
- `thread`: `thread`, `last_active` (its score in the thread list), `summarized` (the
  summarized-prefix counter; null or left out: counted again on the thread's first read),
  `channel` (where its messages were said, for episodic memory), a Discord thread's
  `parent` (its channel, noted again so the channel's deletion finds it; optional), and a DM
  thread's `dm_person` (whose DM its place is, memory/keys.py `dm_people_key`, so erasing
  them takes the thread even where their own messages are tombstones; optional: without it
  the import tells the place's person by its one writer, as before);
  then its `message`s (each as stored, tombstones included), `summary`s and `tool_log`s (each
  `listed` at its score in the thread's index, or null: a merged child), and its `turn`s (each
  answered turn's record with its feedback, `TurnRecord.to_json` without the tenant, its
  `workflow` key moved into the importing tenant; importing them counts their usage again to
  the thread, the tenant and their days; what background model calls cost, summaries and
  entity extraction, is not carried);
- `paper` (the papers-hash record), then its `chunk`s, then `entity` and `workflow`: `id` (the
  key after the tenant's prefix), `fields` as stored, `vector` (base64 of float32);
- `watch` (a whole tenant's topic watches): `watch`, every field of the stored watch but the
  tenant (topic, period, filters, place, creator, `since`, `next_due`, `paused`, failures),
  and `posted`, the arXiv ids its digests posted with when. An imported watch posts to the
  same place and keeps its schedule, but a `next_due` already past moves to the next period
  end (counted from its creation, as before): an import never posts at once, and the next
  digest covers everything since the last one. A paused watch stays paused; imported under
  another tenant's name, every watch is a paused copy (its channels are the original's, which
  may still post there, and whose slash commands look in the original tenant).

Exports are read store by store and page by page, so a large tenant is never held in memory
whole. An import checks every line first and writes only a file that is whole: a malformed line
is a `BadExportLine` naming it, and nothing is written. It refuses a tenant that holds anything
(`TenantNotEmpty`), writes the same keys the stores write (thread scores, summarized-prefix
counters, the thread indexes of summaries and tool logs, papers after their chunks, watches in
the due index), and indexes the messages for episodic recall. Vectors are reused when the
export's embedding model is the configured one, and embedded again otherwise. An import that
fails while it writes clears what it wrote (`ImportInterrupted` says what it left); one that crashed leaves a marker with its start time: the next
import into that tenant clears what it wrote and starts again, unless the tenant was used since
(then it is refused).

The entry point is `Portability`, here, with the errors an import raises; the parts:
memory/portability_export.py (reading a tenant out as records, `dumps`),
memory/portability_check.py (the format's kinds, each line checked, `BadExportLine`),
memory/portability_write.py (a checked export written through the stores' key layout).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from redis.exceptions import ResponseError

from memory.governance import LOCK_TTL_MS as ERASURE_LOCK_TTL_MS
from memory.keys import (
    erasing_key,
    forgetting_key,
    import_lock_key,
    import_partial_key,
    import_running_key,
    papers_key,
    retention_key,
    threads_key,
    validate_tenant,
    watches_key,
)
from memory.locks import OwnedLocks
from memory.portability_check import BadExportLine, Check
from memory.portability_export import Exporter, dumps
from memory.portability_write import Writer
from memory.stores.base import decode
from memory.stores.watches import WatchStore

__all__ = [
    "BadExportLine", "ErasureFinishing", "ErasureRunning", "ImportBusy", "ImportInterrupted", "ImportLost", "Left",
    "Portability", "TenantNotEmpty", "dumps",
]  # fmt: skip

LOCK_TTL_MS = 120_000
OWN_KEYS = "own keys"  # what `_holding` says for a tenant's keys of its own

log = logging.getLogger(__name__)


class TenantNotEmpty(ValueError):
    """An import into a tenant that already holds memory (it would mix two memories), or that
    holds what a crashed import wrote and was used since (importing again would erase that)."""

    def __init__(self, tenant: str, crashed_at: float | None = None) -> None:
        super().__init__(tenant)
        self.crashed_at = crashed_at

    @property
    def when_crashed(self) -> str:
        """When the crashed import started, as " on <date> UTC"; "" when that is not known (no
        crash, or a marker from before markers held a time). The page's wording uses it too."""
        if not self.crashed_at:
            return ""
        return time.strftime(" on %Y-%m-%d %H:%M UTC", time.gmtime(self.crashed_at))

    def __str__(self) -> str:
        if self.crashed_at is not None:
            return (
                f"The tenant {self.args[0]!r} holds part of an import that stopped"
                f"{self.when_crashed}, and it was used after that: importing "
                "again would erase what was added since. "
                "Import into another tenant (--tenant); this one is left as it is. Nothing was "
                "imported."
            )
        return (
            f"The tenant {self.args[0]!r} already holds memory: an export is imported into an "
            "empty tenant only. Choose another tenant (--tenant). Nothing was imported."
        )


class ImportBusy(ValueError):
    """Another import into the same tenant is running."""

    def __str__(self) -> str:
        return f"Another import into the tenant {self.args[0]!r} is running; try again later."


class ErasureRunning(ImportBusy):
    """An erasure of the tenant's memory (a person, a thread, the whole tenant) is running:
    an import written alongside it would put back what it erases."""

    def __str__(self) -> str:
        return (
            f"An erasure in the memory of the tenant {self.args[0]!r} is running; try again "
            "when it has ended. Nothing was imported."
        )


class ErasureFinishing(ErasureRunning):
    """The tenant holds nothing but what an erasure that has ended is still deleting (the
    forgotten messages' episodic documents, memory/keys.py `erasing_key`): not a memory to
    keep, so not "not empty", but the import waits until it is gone."""

    def __str__(self) -> str:
        return (
            f"An erasure in the memory of the tenant {self.args[0]!r} is still finishing; try "
            "again shortly. Nothing was imported."
        )


class ImportLost(ImportBusy):
    """The import's lock lapsed while it wrote (Redis out of reach, or the process stalled):
    another import (or an erasure) may have taken the tenant over, so this one stopped, and
    leaves what it wrote to the next import (which clears it, as a crashed one's)."""

    def __str__(self) -> str:
        return (
            f"The import into the tenant {self.args[0]!r} stopped: it lost its lock, and "
            "another import (or an erasure) may have taken over. Part of it may be there; the "
            "next import into this tenant clears it first (unless the tenant is used meanwhile)."
        )


class Left(enum.Enum):
    """What an import that failed while it wrote left in its tenant."""

    CLEARED = "cleared"  # nothing: the tenant is as it was
    PARTIAL = "partial"  # part of it, and its marker: the next import clears it first
    USED = "used"  # part of it, and the tenant was used meanwhile: the next import is refused
    UNKNOWN = "unknown"  # the memory cannot be reached to tell (nor to clear it)


class ImportInterrupted(Exception):
    """An import failed while it wrote (the memory store, the embedding model or the file
    failed): `left` says what the tenant holds now, its text what to do; the failure is its
    cause."""

    _SAID = {
        Left.CLEARED: "What it wrote was cleared: the tenant is as it was before. Try again.",
        Left.PARTIAL: "Part of it is still there: import again later; the next import into "
        "this tenant clears it first (unless the tenant is used meanwhile).",
        Left.USED: "Part of it is still there, and the tenant was used while it ran, so it was "
        "kept, and importing into this tenant is refused now: forget this tenant's memory "
        "(`arxivscout memory forget tenant`) or import into another tenant.",
        Left.UNKNOWN: "The memory store cannot be reached now, so part of it may still be "
        "there: import again later; the next import into this tenant clears it first (unless "
        "the tenant is used meanwhile).",
    }

    def __init__(self, tenant: str, left: Left, failure: BaseException) -> None:
        super().__init__(tenant, left)
        self.tenant, self.left = tenant, left
        self.failure = f"{type(failure).__name__}: {failure}"[:200]

    def __str__(self) -> str:
        return (
            f"The import into the tenant {self.tenant!r} failed while it wrote "
            f"({self.failure}). {self._SAID[self.left]}"
        )


class _Held:
    """An import's locks while it writes (its own and the tenant's erasure lock): renewed in
    the background, every third of their lifetime; `__call__` raises `ImportLost` once a
    renewal found one gone (`lose`). `started`: when its writes began (its marker's time),
    set once the tenant was found empty (or cleared)."""

    started: float

    def __init__(self, tenant: str) -> None:
        self.tenant, self.lost = tenant, False

    def lose(self) -> None:
        log.warning("the import lock of %s was lost: the import stops", self.tenant)
        self.lost = True

    def __call__(self) -> None:
        if self.lost:
            raise ImportLost(self.tenant)


class Portability:
    def __init__(self, memory: Any, lock_ttl_ms: int = LOCK_TTL_MS) -> None:
        self.memory = memory
        self.redis = memory.redis
        self.lock_ttl_ms = lock_ttl_ms  # an import's lock lapses this long after its holder dies
        self._locks = OwnedLocks(memory.redis)
        self._exporter = Exporter(memory)

    # -- export ---------------------------------------------------------------------------------

    def export_thread(self, tenant: str, thread: str) -> AsyncIterator[dict[str, Any]]:
        """One thread: its messages, summaries and tool logs. `NotFound` for an unknown one."""
        return self._exporter.export_thread(tenant, thread)

    def export_tenant(self, tenant: str) -> AsyncIterator[dict[str, Any]]:
        """Everything the tenant's memory holds but episodic entries (made again on import)."""
        return self._exporter.export_tenant(tenant)

    # -- import ---------------------------------------------------------------------------------

    async def import_records(
        self, tenant: str, records: AsyncIterable[dict] | Iterable[dict]
    ) -> dict[str, int]:
        """Import an export's records (in file order; record n is line n) into an empty tenant;
        returns how many of each kind were written. Records handed over whole need no end line
        (a file does: `import_lines`)."""
        many = isinstance(records, AsyncIterable)
        rows = [r async for r in records] if many else list(records)
        return await self._import(tenant, lambda: enumerate(rows, 1), whole=False)

    async def import_lines(self, tenant: str, lines: Callable[[], Iterable[str]]) -> dict[str, int]:
        """Import JSON Lines; `lines` opens them afresh for each of the two passes (a check,
        then the writes), so a large file is never held in memory."""

        def parsed() -> Iterable[tuple[int, Any]]:
            for number, line in enumerate(lines(), 1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except ValueError:
                    raise BadExportLine(number, "it is not JSON.") from None
                except RecursionError:  # arrays or objects nested thousands deep
                    raise BadExportLine(number, "it is nested too deeply.") from None

        return await self._import(tenant, parsed, whole=True)

    async def _import(
        self, tenant: str, source: Callable[[], Iterable[tuple[int, Any]]], whole: bool
    ) -> dict[str, int]:
        validate_tenant(tenant)
        check = Check(self.memory.embedder)
        for number, record in source():
            check.line(number, record)
        check.done(whole)
        async with self._importing(tenant) as held:
            writer = Writer(self.memory, tenant, check.reembed, held, held.started)
            for _, record in source():
                held()
                await writer.write(record)
            await writer.finish()
            held()
        return dict(writer.counts)

    @contextlib.asynccontextmanager
    async def _importing(self, tenant: str) -> AsyncIterator[_Held]:
        """One import per tenant at a time, into an empty tenant (or over what a crashed
        import left, unless the tenant was used since). An import that fails in this process
        clears what it wrote at once and its marker with it (`ImportInterrupted` says what is
        left); only a crash leaves the marker, which holds when that import started. The lock
        is renewed in the background all along (embedding may take long between two records);
        once it is lost (found by the keeper, or by a failed import before it clears), the
        import stops (`ImportLost`) and clears nothing: another may have taken the tenant over.

        It holds the tenant's erasure lock too (`forgetting_key`, memory/governance.py), as an
        erasure does: an erasure that ran alongside its writes would be undone by the rest of
        them. An erasure running refuses the import (`ErasureRunning`); one asked for while it
        writes waits, then answers Busy ("try again"), as it does behind another erasure.

        Right after it takes its lock, before it looks at the tenant, it sets the tenant's
        `import_running_key` (renewed and released with its locks): the bot's appends are
        refused from then on (memory/stores/conversation.py), and one stored before is in the
        thread index its emptiness check (or `used_since`) reads. A tenant plainly in use is
        refused before any of that (`_plainly_used`): its appends are never refused for an
        import that would not run."""
        lock, token = import_lock_key(tenant), uuid.uuid4().hex
        running, erasure = import_running_key(tenant), forgetting_key(tenant)
        if await self._plainly_used(tenant):
            raise TenantNotEmpty(tenant)
        if not await self._locks.acquire(lock, token, self.lock_ttl_ms):
            raise ImportBusy(tenant)
        try:
            await self.redis.set(running, token, px=self.lock_ttl_ms)
            erasing = await self._locks.acquire(erasure, token, ERASURE_LOCK_TTL_MS)
        except BaseException:  # the erasure lock too: its SET may have been applied
            await self._give_back(tenant, token, erasure, running, lock)
            raise
        if not erasing:
            await self._give_back(tenant, token, running, lock)
            raise ErasureRunning(tenant)
        held = _Held(tenant)
        ttl, lose = self.lock_ttl_ms, held.lose
        async with (
            self._locks.kept(lock, token, ttl, name=f"import-lock {tenant}", on_lost=lose),
            self._locks.kept(running, token, ttl, name=f"import-running {tenant}", on_lost=lose),
            self._locks.kept(erasure, token, ERASURE_LOCK_TTL_MS,
                             name=f"import-erasure-lock {tenant}", on_lost=lose),
        ):  # fmt: skip
            crashed = decode(await self.redis.get(import_partial_key(tenant)))
            if crashed is not None:
                started = _started(crashed)
                if await self.used_since(tenant, started):
                    raise TenantNotEmpty(tenant, crashed_at=started)
                await self.memory.drop_tenant(tenant)  # what the crashed import wrote
            elif holding := await self._holding(tenant):
                raise await self._not_empty(tenant, holding)
            started = held.started = time.time()
            await self.redis.set(import_partial_key(tenant), repr(started))
            try:
                yield held
            except ImportLost:
                raise
            except Exception as exc:
                if held.lost:
                    raise ImportLost(tenant) from exc
                try:
                    left = await self._undo(tenant, started, lock, token)
                except ImportLost as lost:
                    raise lost from exc
                raise ImportInterrupted(tenant, left, exc) from exc
            except BaseException:  # cancelled, interrupted: cleared all the same
                if not held.lost:
                    with contextlib.suppress(ImportLost):
                        await self._undo(tenant, started, lock, token)
                raise
            # only its own marker: one another import (that took over) set stays
            await self._locks.release(import_partial_key(tenant), repr(started))

    async def _plainly_used(self, tenant: str) -> bool:
        """The cheap check before anything is taken: the tenant holds keys of its own, no
        crashed import's marker and no erasure running (erase, then restore: the full path says
        to wait for the erasure, not that the memory is in use), so the import would be
        refused. Refused at once, it never sets the running key that refuses the bot's appends
        (nor takes a lock); the full check still follows the running key's SET."""
        if not await self.redis.exists(*_own_keys(tenant)):
            return False
        return not await self.redis.exists(import_partial_key(tenant), forgetting_key(tenant))

    async def _give_back(self, tenant: str, token: str, *keys: str) -> None:
        """Release what an import that does not start took (its lock last), each key only
        while it holds this import's token; a release that fails does not keep the others
        (logged: that key lapses with its time to live)."""
        for key in keys:
            try:
                await self._locks.release(key, token)
            except Exception:
                log.exception("an import into %s that did not start left %s", tenant, key)

    async def _undo(self, tenant: str, started: float, lock: str, token: str) -> Left:
        """Clear what a failed import wrote, unless the tenant was used meanwhile (then the
        marker stays, and the next import refuses it); what is left. A failure here leaves the
        marker: the next import clears it as a crashed one's. The locks are renewed first: the
        keeper only notices a lapse at its next beat, and if another import (or an erasure)
        took the tenant over meanwhile, what is there is partly its own, so nothing is cleared
        (`ImportLost`)."""
        try:
            if await self.used_since(tenant, started):
                return Left.USED
            ours = await self._locks.renew(lock, token, self.lock_ttl_ms)
            ours = ours and await self._locks.renew(
                import_running_key(tenant), token, self.lock_ttl_ms
            )
            ours = ours and await self._locks.renew(
                forgetting_key(tenant), token, ERASURE_LOCK_TTL_MS
            )
        except Exception:
            log.exception("could not tell what a failed import into %s left", tenant)
            return Left.UNKNOWN
        if not ours:
            log.warning("the import lock of %s was lost: what it wrote stays", tenant)
            raise ImportLost(tenant)
        try:
            await self.memory.drop_tenant(tenant)
        except Exception:
            log.exception("clearing what a failed import into %s wrote failed", tenant)
            return Left.PARTIAL
        try:
            await self._locks.release(import_partial_key(tenant), repr(started))
        except Exception:  # cleared; the next import finds nothing to clear behind the marker
            log.exception("the marker of a failed import into %s stays", tenant)
        return Left.CLEARED

    async def used_since(self, tenant: str, started: float) -> bool:
        """True when the tenant saw activity after `started` (seconds since the epoch): a
        thread active since (its score in the tenant's threads), a paper ingested since, or a
        watch made since.
        What an import writes keeps its export's times, but none later than the import's start
        (`Writer`): a file from a host whose clock ran ahead is not taken for use since."""
        if await self.redis.zrangebyscore(threads_key(tenant), f"({started!r}", "+inf", 0, 1):
            return True
        if any(w.created_at > started for w in await WatchStore(self.redis).all(tenant)):
            return True  # a watch made since
        for raw in await self.redis.hvals(papers_key(tenant)):
            try:
                if float(json.loads(raw).get("ingested_at") or 0) > started:
                    return True
            except (ValueError, TypeError, AttributeError):  # not a record: not activity
                continue
        return False

    async def _not_empty(self, tenant: str, holding: set[str]) -> ErasureFinishing | TenantNotEmpty:
        """Why a tenant that is not empty is refused (`holding`: what `_holding` found): when
        only the episodic index holds documents while an erasure's purge still deletes some
        (`erasing_key`: the admin forgot its last thread a moment ago), that erasure
        finishing, not a memory in the way. Learned records (entities, workflows) left are a
        memory: their erasure is done."""
        if holding == {self.memory.episodes.family()} and await self.redis.exists(
            erasing_key(tenant)
        ):
            return ErasureFinishing(tenant)
        return TenantNotEmpty(tenant)

    async def is_empty(self, tenant: str) -> bool:
        """True when the tenant holds no threads, papers, retention setting, watches or indexed
        records."""
        return not await self._holding(tenant)

    async def _holding(self, tenant: str) -> set[str]:
        """What the tenant holds: OWN_KEYS when it has keys of its own (threads, papers,
        retention, watches), else the families of the vector stores holding its documents
        (empty: nothing)."""
        if await self.redis.exists(*_own_keys(tenant)):
            return {OWN_KEYS}
        listed = {decode(n) for n in await self.redis.execute_command("FT._LIST")}
        holding: set[str] = set()
        for store in self.memory.vector_stores:
            name = store.index_name(tenant)
            if not store.TENANT_SCOPED or name not in listed:
                continue
            try:
                reply = await self.redis.execute_command("FT.SEARCH", name, "*", "LIMIT", 0, 0)
            except ResponseError:  # dropped meanwhile
                continue
            if isinstance(reply, dict):  # RESP3: its keys are bytes, as the client reads them
                total = {decode(k): v for k, v in reply.items()}.get("total_results", 0)
            else:
                total = reply[0]
            if int(total):
                holding.add(store.family())
        return holding


def _own_keys(tenant: str) -> tuple[str, ...]:
    """The tenant's keys that hold memory of its own (besides its indexed documents)."""
    return (threads_key(tenant), papers_key(tenant), retention_key(tenant), watches_key(tenant))


def _started(marker: str) -> float:
    """When the import that left `marker` started; 0 for a marker without a time (from before
    markers held one): then any activity counts as newer, and nothing is wiped."""
    try:
        return float(marker)
    except ValueError:
        return 0.0
