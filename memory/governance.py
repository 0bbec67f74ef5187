"""Governance: forget what a tenant's memory holds, erase a person, keep a retention period, and
correct entities and workflows. The entry point: other code calls `Governance` (and catches
`NotFound` and `Busy`) from here.

Each `forget_*` returns an `Erasure` (how many items went, per store) and raises `NotFound` for
an id the tenant does not hold. What is forgotten is gone from the next turn's context.

Where each part is:
- here: one kind of item at a time (a message, thread, summary, tool log, paper, entity,
  workflow), a message its author deleted on Slack or Discord (`forget_deleted`), the edits,
  and the tenant's erasure lock;
- memory/governance_threads.py: messages made tombstones, whole threads deleted, and the
  summaries over them rewritten;
- memory/governance_sweeps.py: a person erased from every store, and the retention cut;
- memory/governance_edits.py: a message its author edited on Slack or Discord (`edits`);
- memory/governance_places.py: a channel or thread deleted on Slack or Discord, its threads
  found and noted (`places`; erased whole by `forget_place`);
- memory/governance_purge.py: forgotten messages' episodic entries, hidden at once and deleted
  in the background, and forgotten texts' cached vectors;
- memory/governance_learned.py: the workflow and entity pieces a forgotten or edited question
  taught (`learned`);
- memory/governance_erasure.py: `Erasure`, `NotFound`, `Busy`.

Erasures of a tenant run one at a time (a lock): two never rewrite a summary from different
states. When one ends, the episodic documents it hid are purged in the background; what a
stopped process left, by any live process within the hour (`purge_leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from redisvl.query.filter import Tag

from memory.erased_people import ErasedPeople
from memory.errors import Deferred
from memory.governance_edits import Edits
from memory.governance_erasure import Busy, Erasure, NotFound
from memory.governance_learned import Learned
from memory.governance_places import DeletedPlace, Places
from memory.governance_purge import DELETED_NOTE, Purge, queue_deleted_note
from memory.governance_sweeps import Sweeps, delete_where
from memory.governance_threads import RETRIES, ThreadEraser, Threads, covered_by
from memory.keys import (
    busy_threads_key,
    deleted_message_key,
    erased_tenant_key,
    forgetting_key,
    import_lock_key,
    papers_key,
    threads_key,
    turn_queue_key,
    turn_running_key,
)
from memory.locks import OwnedLocks
from memory.scope import PUBLIC
from memory.stores.base import decode, delete_keys
from memory.stores.knowledge_base import base_arxiv_id, is_shared_pdf, shares_of
from memory.stores.summary import Summary, SummaryConflict, compact_note, merged_note
from memory.stores.tool_log import paper_shown
from memory.stores.watches import Watch, WatchStore

__all__ = ["Busy", "Erasure", "Governance", "ImportRunning", "NotFound"]

log = logging.getLogger(__name__)

LOCK_TTL_MS = 60_000  # renewed while an erasure runs; lapses a minute after a crash
LOCK_WAIT_SECONDS = 60.0
ERASURE_RUNNING = "Another erasure of this workspace's memory is running; try again in a minute."
IMPORT_RUNNING = "A memory import is running in this workspace; try again when it has finished."
MAX_PERSON_ID = 256  # longer is no platform's user id (Slack's, Discord's are short)
TOOL_LOG_ID_PREFIX = "log_"  # every tool log's id (memory/stores/tool_log.py `ToolLogEntry.id`)


class ImportRunning(Busy, Deferred):
    """An import holds the tenant's erasure lock (memory/portability.py), maybe for many
    minutes: an erasure fails at once instead of waiting a minute for it, and a background
    one (a message deleted on the platform) is put back, its delivery unspent (`Deferred`)."""

    def __init__(self, message: str = IMPORT_RUNNING) -> None:
        super().__init__(message)


async def import_running(redis: Any, tenant: str) -> bool:
    """Whether an import into the tenant holds its erasure lock: the lock's token is its own
    (memory/portability.py takes its lock, `import_lock_key`, and the erasure lock with one
    token). Not only its lock held: for a moment before it tries the erasure lock, that is
    held by an erasure. One round trip (two slots: no MGET)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(forgetting_key(tenant))
        pipe.get(import_lock_key(tenant))
        erasing, importing = await pipe.execute()
    return erasing is not None and erasing == importing


@dataclass
class PersonErasure(Erasure):
    """A person's erasure: also the topic watches that named them (those made in their DMs
    removed, their id taken off the others) and the votes they gave others' answers."""

    watches: int = 0
    votes: int = 0


class Governance:
    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._locks = OwnedLocks(memory.redis)
        self._purge = Purge(memory)
        self.places = Places(memory.redis)  # channels and threads deleted on the platform
        self._threads = ThreadEraser(memory, self._purge, self.places)
        self._sweeps = Sweeps(memory, self._threads, self._purge)
        self.learned = Learned(memory, self._purge)  # what each question taught
        self.edits = Edits(memory, self._purge, self._threads, self._exclusive, self.learned)

    # -- one item at a time ---------------------------------------------------------------------

    async def forget_message(self, tenant: str, thread: str, message_id: str) -> Erasure:
        """Make one message a tombstone, delete its episodic entries and cached vectors, and
        rewrite the summaries that cover it; its turn's record goes (a question's with its
        turn's tool logs: `_turns`). Forgetting it again redoes the clean-up."""
        async with self._exclusive(tenant):
            lists = Threads(await self.memory.conversation.raw_threads(tenant, [thread]))
            if not any(m.id == message_id for m in lists.messages(thread)):
                raise NotFound("message", message_id)
            # a question's lessons first: a failure leaves the message for a run again
            erasure = await self.learned.forget(tenant, [message_id])
            erasure += await self._threads.forget_messages(
                tenant, lists, lambda m: m.id == message_id
            )
            return erasure + await self._turns(tenant, message_ids=[message_id])

    async def forget_deleted(self, tenant: str, threads: Iterable[str], source: str) -> Erasure:
        """A message its author deleted on the platform: `source` is the platform's id of it
        (stored as the user message's `metadata["source"]`), `threads` where it may be. The
        deletion is noted (a day, `was_deleted`), then the message is forgotten as by
        `forget_message`: a turn that stores it after this read sees the note and queues this
        again; the turn records of the messages go too (a question's with its turn's tool logs).
        The ids found are kept in the note before the message becomes a tombstone (which keeps
        no source), so a run again after a failure half-way finds them and finishes the
        clean-up."""
        await self.note_deleted(tenant, source)
        await self.edits.forget(tenant, source)  # its texts noted by an edit go too
        threads, erasure = list(threads), Erasure()
        if gone := await self.places.deleted(tenant, threads):  # its channel went meanwhile
            erasure += await self._forget_threads(tenant, gone, set(gone).__contains__)
            threads = [t for t in threads if t not in gone]
        read = self.memory.conversation.raw_threads
        if not await self._deleted_ids(tenant, Threads(await read(tenant, threads)), source):
            return erasure  # most deletions: a message the bot never stored (no lock taken)
        async with self._exclusive(tenant):
            # again: an edit that held the lock may have noted its old text since
            await self.edits.forget(tenant, source)
            lists = Threads(await read(tenant, threads))  # as they are now, under the lock
            if ids := await self._deleted_ids(tenant, lists, source):
                erasure += await self.learned.forget(tenant, ids)  # first, as forget_message
                erasure += await self._threads.forget_messages(tenant, lists, lambda m: m.id in ids)
                erasure += await self._turns(tenant, message_ids=ids)
        return erasure

    async def note_deleted(self, tenant: str, source: str, ids: Iterable[str] = ()) -> None:
        """Note for a day that `source` was deleted on the platform (with the ids of the
        messages stored from it, when known): a queued turn for it is then not run."""
        async with self.redis.pipeline(transaction=True) as pipe:
            queue_deleted_note(pipe, tenant, source, ids)
            await pipe.execute()

    async def _deleted_ids(self, tenant: str, lists: Threads, source: str) -> set[str]:
        """The ids of the messages stored from `source` in these threads: found by their
        source, or noted by an earlier run (tombstones by now); kept in the note as found."""
        found = {m.id for _, m in lists.from_source(source)}
        noted = {decode(m) for m in await self.redis.smembers(deleted_message_key(tenant, source))}
        if found - noted:
            await self.note_deleted(tenant, source, found - noted)
        return (found | noted) - {DELETED_NOTE}

    async def was_deleted(self, tenant: str, source: str) -> bool:
        """True when the message of `source` was deleted on the platform in the last day."""
        return bool(await self.redis.exists(deleted_message_key(tenant, source)))

    async def forget_thread(self, tenant: str, thread: str) -> Erasure:
        """The whole thread: its messages, counters, summaries, tool logs, episodic entries,
        cached vectors, the bot's presence in it, its entry in the tenant's threads (and its
        queue keys when no job is queued or running there)."""
        return await self._forget_threads(tenant, [thread], thread.__eq__, strict=True)

    async def forget_place(
        self, place: DeletedPlace,
        removing: Callable[[list[Watch]], Awaitable[None]] | None = None,
    ) -> Erasure:  # fmt: skip
        """A channel or thread deleted on the platform: each of its threads whole, as
        `forget_thread`, and what the place kept (memory/governance_places.py; its watches are
        handed to `removing` before they go). The threads and the turns queued or running there
        are noted first: such a turn stores nothing, or its end forgets its thread again. Run
        again, it finds nothing left."""
        threads = await self.places.threads_of(place)
        sources = await self.places.note(place.tenant, threads)  # before a turn is looked for
        if await self.places.holds_nothing(place, threads) and not (
            await self.places.watches_in(place, threads)
        ):
            return Erasure()  # most Discord thread deletions, or done already: no lock taken
        if sources:  # one round trip (the tenant's slot)
            async with self.redis.pipeline(transaction=True) as pipe:
                for source in sources:
                    queue_deleted_note(pipe, place.tenant, source)
                await pipe.execute()
        erasure = await self._forget_threads(
            place.tenant, threads, lambda t: t in threads or place.holds(t)
        )
        # read once the threads went (a watch made meanwhile goes too), before the records go
        watches = await self.places.watches_in(place, threads)
        await self.places.clear(place, threads, watches, removing)
        return erasure

    async def _forget_threads(
        self, tenant: str, threads: list[str], holds: Callable[[str], bool], strict: bool = False
    ) -> Erasure:
        """Whole threads at once (those not held are skipped; `strict`: NotFound when none
        is), and the private PDFs shared in any thread that `holds` names."""
        async with self._exclusive(tenant):
            lists = await self._threads.read(tenant, threads)
            listed = await self.redis.zmscore(threads_key(tenant), threads) if threads else []
            held = [t for t, score in zip(threads, listed, strict=True)
                    if lists.raw[t] or score is not None]  # fmt: skip
            if strict and not held:
                raise NotFound("thread", ", ".join(threads))
            asked = [m.id for t in held for m in lists.messages(t) if m.role == "user"]
            # what their questions taught, before the threads go: a failure leaves them (and
            # their question ids) for a run again
            erasure = await self.learned.forget(tenant, asked)
            erasure += await self._threads.erase_threads(tenant, lists.only(held))
            erasure += await self._shared_pdfs(
                tenant, lambda share: holds(share.get("thread") or "")
            )
            return erasure + await self._turns(tenant, threads=threads)

    async def forget_summary(self, tenant: str, summary_id: str) -> Erasure:
        """The summary goes; a new one written by the deterministic compaction (over its
        remaining messages, or listing its children for a merged one) takes its place and its
        id, so every message stays in the window or under a summary. The summaries it was
        merged into are rewritten too (`merged_note`), and the tool logs of the calls that
        expanded it or them go (`forget_showing`)."""
        summaries = self.memory.summaries
        async with self._exclusive(tenant):
            old = (await summaries.get_many(tenant, [summary_id])).get(summary_id)
            if old is None:
                raise NotFound("summary", summary_id)
            if old.children:
                kids = await summaries.get_many(tenant, old.children)
                note = merged_note([kids[c] for c in old.children if c in kids])
            else:
                lists = Threads(await self.memory.conversation.raw_threads(tenant, [old.thread_id]))
                note = compact_note(covered_by(lists, old))
            new = Summary(old.thread_id, *note, message_ids=old.message_ids,
                          created_at=old.created_at, audience=old.audience, level=old.level,
                          children=old.children, parent=old.parent)  # fmt: skip
            await summaries.store(tenant, new)
            # What it covers points at the new one first: a crash before the swap leaves the
            # old one in place, and forgetting it again finishes the work.
            if old.children:
                pipe = self.redis.pipeline(transaction=False)
                for child in old.children:
                    pipe.hset(summaries.key(tenant, child), "parent", new.id)
                await pipe.execute()
            else:
                await self._threads.relabel(tenant, old, new.id)
            for _ in range(RETRIES):
                try:
                    await summaries.replace(tenant, old, new)
                    break
                except SummaryConflict:  # merged meanwhile: put the new one where it is now
                    old = (await summaries.get_many(tenant, [summary_id])).get(summary_id, old)
            else:
                raise Busy("The summary kept moving while it was being forgotten; try again.")
            rewritten = await self._threads.rewrite_ancestors(tenant, {new.parent} - {""})
            # the logs of the calls that expanded it or a summary it was merged into: the
            # old texts live on there
            expanded = [summary_id, *await self._ancestors(tenant, new.parent)]
            shown = await self.memory.tool_logs.forget_showing(tenant, expanded)
            return Erasure(summaries=1 + rewritten, tool_logs=shown)

    async def _ancestors(self, tenant: str, parent: str) -> list[str]:
        """The summaries a summary was merged into: `parent`, its parent, up to the top."""
        chain: list[str] = []
        while parent and parent not in chain:
            chain.append(parent)
            found = (await self.memory.summaries.get_many(tenant, [parent])).get(parent)
            parent = found.parent if found is not None else ""
        return chain

    async def forget_tool_log(self, tenant: str, log_id: str) -> Erasure:
        """The log, and the logs of the calls that read it back (`read_tool_log`), those
        first: a retry after a failure in between finds the log still there, and its copies.
        Only a tool log's id (`ToolLogEntry.id`, `log_...`): a message's or a summary's would
        take every log that showed it and tell of no log."""
        if not log_id.startswith(TOOL_LOG_ID_PREFIX):
            raise NotFound("tool log", log_id)
        erasure = await self._tool_logs(tenant, [log_id])
        if not erasure.tool_logs:  # neither it nor a copy (one gone before: its copies now)
            raise NotFound("tool log", log_id)
        return erasure

    async def forget_paper(self, tenant: str, arxiv_id: str) -> Erasure:
        """A paper's chunks (its passages), its entry in the tenant's papers, and the tool logs
        whose output showed its passages (`paper_shown`): read back, shown on the memory page
        and exported, they would keep them."""
        async with self._exclusive(tenant):
            return await self._forget_paper(tenant, arxiv_id)

    async def _forget_paper(self, tenant: str, arxiv_id: str) -> Erasure:
        """`forget_paper`, under the erasure lock, then the paper's save lock (as `_shared_pdfs`
        takes them): a share adding itself to a private PDF (memory/ingest/shared_pdf.py
        `_held_by`) read its record before, or after; written back in between, it would list
        a paper with no passages, which its file, shared again, would find "already saved"."""
        arxiv_id, given = base_arxiv_id(arxiv_id or ""), arxiv_id
        if not arxiv_id:  # "" or "v2": an empty tag filter is redisvl's `*`, every chunk
            raise NotFound("paper", given or "")
        async with self.memory.knowledge_base.holding(tenant, arxiv_id):
            return await self._forget_held_paper(tenant, arxiv_id)

    async def _forget_held_paper(self, tenant: str, arxiv_id: str) -> Erasure:
        """`_forget_paper`, under both locks. The logs go first: a failure after them leaves
        the paper, and forgetting it again finishes (its logs found go even once it went)."""
        kb = self.memory.knowledge_base
        logs = await self.memory.tool_logs.forget_showing(tenant, [paper_shown(arxiv_id)])
        record = await self.redis.hget(papers_key(tenant), arxiv_id)
        chunks = await delete_where(kb, tenant, Tag("arxiv_id") == arxiv_id, ["arxiv_id"])
        if record is None and not chunks and not logs:
            raise NotFound("paper", arxiv_id)
        removed = await self.redis.hdel(papers_key(tenant), arxiv_id)
        return Erasure(papers=int(removed), chunks=len(chunks), tool_logs=logs)

    async def forget_shares(self, tenant: str, origins: Iterable[str]) -> Erasure:
        """These shares (`SharedFile.origin`, memory/ingest/shared_pdf.py) leave the private PDFs
        they hold, and a PDF goes with its last: for a share read across an erasure
        (adapters/shared_files.py), which may have added itself to a copy another share holds."""
        origins = set(origins)
        async with self._exclusive(tenant):
            return await self._shared_pdfs(tenant, lambda share: share.get("origin") in origins)

    async def _shared_pdfs(
        self, tenant: str, leaves: Callable[[dict[str, Any]], bool], team_copies: bool = False
    ) -> Erasure:
        """PDFs shared in a private channel or a DM (memory/ingest/shared_pdf.py) whose shares
        `leaves` (shared in a thread that went, by a person who went): those shares leave the
        record, and a PDF goes with its last (one shared again in another thread, or by
        another person, stays for them). The team's copies stay, as papers from arXiv do;
        with `team_copies` (a person erased), without what their shares said of them
        (`_unname_shares`)."""
        erasure = Erasure()
        for arxiv_id, raw in (await self.redis.hgetall(papers_key(tenant))).items():
            paper_id, record = decode(arxiv_id) or "", json.loads(raw)
            if not is_shared_pdf(paper_id) or not any(map(leaves, shares_of(record))):
                continue
            if self._private_pdf(paper_id, record):
                erasure += await self._take_shares(tenant, paper_id, leaves)
            elif team_copies:
                erasure += await self._unname_shares(tenant, paper_id, leaves)
        return erasure

    async def _take_shares(
        self, tenant: str, paper_id: str, leaves: Callable[[dict[str, Any]], bool]
    ) -> Erasure:
        """`_shared_pdfs`, for one private PDF: the shares `leaves` leave its record, or it goes
        with the last."""
        erasure = Erasure()
        kb = self.memory.knowledge_base
        async with kb.holding(tenant, paper_id):  # a share adding itself waits
            record, shares = await self._held_shares(tenant, paper_id)
            kept = [share for share in shares if not leaves(share)]
            if kept and len(kept) < len(shares):  # the link, name: the first's that stays
                erasure += await self._put_shares(tenant, paper_id, record, kept)
                erasure += Erasure(shares=len(shares) - len(kept))
            elif not kept:
                with contextlib.suppress(NotFound):
                    erasure += await self._forget_held_paper(tenant, paper_id)
        return erasure

    async def _unname_shares(
        self, tenant: str, paper_id: str, leaves: Callable[[dict[str, Any]], bool]
    ) -> Erasure:
        """`_shared_pdfs`, for one of the team's copies: it stays, the team's knowledge, but the
        shares `leaves` (of a person erased) keep nothing of theirs: no sharer, no link (a Slack
        permalink holds their id). The thread (a public place's), origin (a message's, not
        theirs), time and file name (the paper's name, maybe its title) stay: a share read across
        the erasure finds by its origin the copy it saved, to take it back
        (adapters/shared_files.py `_forget_saved`). Answers that cited the link, stored in
        others' threads, keep it: the erasure does not rewrite them."""
        async with self.memory.knowledge_base.holding(tenant, paper_id):
            record, shares = await self._held_shares(tenant, paper_id)
            kept = [
                {**share, "sharer": "", "link": ""} if leaves(share) else share for share in shares
            ]
            changed = sum(old != new for old, new in zip(shares, kept, strict=True))
            if not changed:  # gone meanwhile, or unnamed already
                return Erasure()
            erasure = await self._put_shares(tenant, paper_id, record, kept)
            return erasure + Erasure(shares=changed)

    async def _held_shares(
        self, tenant: str, paper_id: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A shared PDF's record and its shares, read again under its save lock (a share may
        have added itself, or the PDF gone, since the pass read it); none when it went."""
        raw = await self.redis.hget(papers_key(tenant), paper_id)
        record = json.loads(raw) if raw else {}
        return record, shares_of(record) if raw else []

    async def _put_shares(
        self, tenant: str, paper_id: str, record: dict[str, Any], kept: list[dict[str, Any]]
    ) -> Erasure:
        """A shared PDF's record held by `kept` now (under its save lock, read under it). When
        its first share changes, so do the link and name it shows: the logs that quoted its
        passages (quoting the link) go."""
        erasure = Erasure()
        if kept[0] != shares_of(record)[0]:
            shown = [paper_shown(paper_id)]
            erasure.tool_logs = await self.memory.tool_logs.forget_showing(tenant, shown)
        await self.memory.knowledge_base.put_shares(tenant, record, kept)
        return erasure

    @staticmethod
    def _private_pdf(paper_id: str, record: dict[str, Any]) -> bool:
        """A PDF shared in a private channel or a DM (not the team's copy)."""
        return is_shared_pdf(paper_id) and record.get("audience", PUBLIC) != PUBLIC

    async def forget_entity(self, tenant: str, entity_id: str) -> Erasure:
        """The entity, and its text's cached vector. The questions that taught it are marked
        first (`Learned.deleting`): an edit of one, learning its turn again, leaves it deleted."""
        store = self.memory.entities
        async with self._exclusive(tenant):
            entity = await store.by_id(tenant, entity_id)
            if entity is None:
                raise NotFound("entity", entity_id)
            key = store.key_of(tenant, entity_id)
            await self.learned.deleting(tenant, key)  # an edited question does not relearn it
            await delete_keys(self.redis, [key])
            cached = await self._purge.uncache([entity.line()])
            return Erasure(entities=1, cached_embeddings=cached)

    async def forget_workflow(self, tenant: str, workflow_id: str) -> Erasure:
        store = self.memory.workflows
        async with self._exclusive(tenant):
            key = store.key_of(tenant, workflow_id)
            text = decode(await self.redis.hget(key, "text"))
            if not workflow_id or text is None:
                raise NotFound("workflow", workflow_id)
            await delete_keys(self.redis, [key])
            return Erasure(workflows=1, cached_embeddings=await self._purge.uncache([text]))

    async def edit_entity(self, tenant: str, entity_id: str, description: str) -> None:
        """Give an entity a new description, embedded again (its old text's cached vector goes)."""
        if not description.strip():
            raise ValueError("An entity's description must not be empty.")
        async with self._exclusive(tenant):
            try:
                old, new = await self.memory.entities.describe(tenant, entity_id, description)
            except KeyError:
                raise NotFound("entity", entity_id) from None
            if old != new:
                await self._purge.uncache([old])

    async def edit_workflow(self, tenant: str, workflow_id: str, text: str) -> None:
        """Give a workflow a new text, embedded again (its old text's cached vector goes)."""
        if not text.strip():
            raise ValueError("A workflow's text must not be empty.")
        async with self._exclusive(tenant):
            try:
                old = await self.memory.workflows.rewrite(tenant, workflow_id, text.strip())
            except KeyError:
                raise NotFound("workflow", workflow_id) from None
            if old != text.strip():
                await self._purge.uncache([old])

    # -- across the tenant ----------------------------------------------------------------------

    async def forget_person(self, tenant: str, user: str) -> PersonErasure:
        """Erase one person (a platform user id) from every store of the tenant; what goes and
        what stays: `Sweeps.person`. Their turns still queued or running are closed as a
        platform deletion is (`_close_queued`). Their turn records go after their messages: a
        turn that saves its record meanwhile has it taken here, or finds its question forgotten
        and drops it itself (bot/harness.py `after`). Their shares queued before and run after
        are not read (a note, memory/erased_people.py). `NotFound` when nothing is theirs
        (no watch either: one made before their messages expired counts), and at once for an
        id no platform gives (control characters, or past MAX_PERSON_ID): the stores' tag
        queries cannot quote it."""
        if not user or not user.isprintable() or len(user) > MAX_PERSON_ID:
            raise NotFound("person", user)  # no platform gives such an id: nothing to query
        async with self._exclusive(tenant):
            await ErasedPeople(self.redis).note(tenant, user)  # first: a share starting now stops
            # their id leaves the watches they made; those in their DMs go
            watches = await WatchStore(self.memory.redis).forget_creator(tenant, user)
            # what they shared privately goes; the team's copies they shared keep nothing of them
            erasure = await self._shared_pdfs(
                tenant, lambda share: share.get("sharer") == user, team_copies=True
            )
            try:
                erasure += await self._sweeps.person(tenant, user)
                spoke = True
            except NotFound:
                spoke = False
            await self._close_queued(tenant, user)
            records = self.memory.turn_records
            votes = await records.withdraw_votes(tenant, user, self.memory.workflows.reject)
            erasure += await self._turns(tenant, asker=user)  # their turns (and late votes)
            if not spoke and not erasure.total and not watches and not votes:
                raise NotFound("person", user)
            return PersonErasure(**asdict(erasure), watches=watches, votes=votes)

    async def _close_queued(self, tenant: str, user: str) -> None:
        """Note the messages of `user`'s turns queued or running in the tenant as deleted on
        the platform (a day), as a platform deletion is: a queued one is then not run
        (adapters/spine.py) and stores nothing of theirs, and one running queues the erasure
        of what it stored when it ends (bot/turns.py `changed_meanwhile`)."""
        threads = [decode(t) for t in await self.redis.zrange(busy_threads_key(tenant), 0, -1)]
        if not threads:
            return
        async with self.redis.pipeline(transaction=True) as pipe:  # the tenant's slot
            for thread in threads:
                pipe.lrange(turn_queue_key(tenant, thread), 0, -1)
                pipe.get(turn_running_key(tenant, thread))
            replies = await pipe.execute()
        jobs = [job for queued in replies[::2] for job in queued]
        jobs += [job for job in replies[1::2] if job is not None]
        sources: set[str] = set()
        for raw in jobs:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                job = json.loads(decode(raw) or "")
                if (job.get("scope") or {}).get("user") == user and job.get("source"):
                    sources.add(str(job["source"]))
        if sources:
            async with self.redis.pipeline(transaction=True) as pipe:
                for source in sorted(sources):
                    queue_deleted_note(pipe, tenant, source)
                await pipe.execute()

    async def sweep_retention(
        self, tenant: str, cutoff: float, queued_at: float = math.inf,
        record: Callable[[Erasure], Awaitable[None]] | None = None,
    ) -> Erasure | None:  # fmt: skip
        """Retention (memory/retention.py): conversation memory said before `cutoff` (seconds
        since the epoch), and the PDFs shared privately before it in the threads that went
        whole (as `forget_thread` does; a PDF shared alone adds no message, so a quiet thread
        can go with a new one); papers from arXiv and the team's PDFs, entities and workflows
        are kept (`Sweeps.expiry`, `Sweeps.expire`). Then `record` what went, under the same
        erasure lock. A queued sweep does nothing, writes nothing and returns None when the
        whole tenant was erased at or after `queued_at` (its note, on Redis's clock:
        memory/keys.py `erased_tenant_key`; not queued, it runs). A whole-tenant erasure takes
        the same lock, so none starts between the check and the record, which would outlive it
        in the erased tenant."""
        async with self._exclusive(tenant):
            erased = decode(await self.redis.get(erased_tenant_key(tenant)))
            if erased is not None and float(erased) >= queued_at:
                return None
            erasure = await self._older_than(tenant, cutoff)
            if record is not None:
                await record(erasure)
            return erasure

    async def _older_than(self, tenant: str, cutoff: float) -> Erasure:
        """`sweep_retention`'s erasure, under the lock."""
        expiry = await self._sweeps.expiry(tenant, cutoff)
        erasure = await self._sweeps.expire(tenant, expiry)
        dropped = set(expiry.dropped)
        if dropped:
            erasure += await self._shared_pdfs(
                tenant,
                lambda share: (
                    share.get("thread") in dropped and float(share.get("at") or 0) < cutoff
                ),
            )
        return erasure + await self._turns(tenant, before=cutoff)

    async def _turns(self, tenant: str, **which: Any) -> Erasure:
        """The turn records (question, answer, feedback) of what is forgotten: a thread's, a
        person's (and their votes), a message's, those older than a cutoff. A forgotten
        question's turn takes its own tool logs first (`_question_logs`: those written before
        they listed their question)."""
        records = self.memory.turn_records
        reject = self.memory.workflows.reject  # a person's votes withdrawn: `forget_person`
        erasure = await self._question_logs(tenant, which.get("message_ids", ()))
        forgotten = await records.forget_where(tenant, reject=reject, **which)
        return erasure + Erasure(turn_records=forgotten)

    async def _question_logs(self, tenant: str, message_ids: Iterable[str]) -> Erasure:
        """The tool logs of the turns that asked these messages (`TurnRecord.tools`), and the
        logs that read them back: their inputs quote the question (a search for its words).
        A log lists its turn's question now (bot/harness.py `run_tool`), and goes with what it
        showed, whatever became of the record (an answer forgotten first, a turn's re-run, an
        answer not saved); for the logs written before, the turn's record, about to go, is the
        only link. Read and deleted before the records: a failure in between leaves them for a
        run again. A thread's, a person's and an expired turn's logs go by their thread, author
        or age instead."""
        asked = await self.memory.turn_records.asking(tenant, message_ids)
        log_ids = sorted({
            str(tool.get("log_id") or "") for record in asked for tool in record.tools
        })  # fmt: skip
        return await self._tool_logs(
            tenant, [i for i in log_ids if i.startswith(TOOL_LOG_ID_PREFIX)]
        )

    async def _tool_logs(self, tenant: str, log_ids: list[str]) -> Erasure:
        """These tool logs, and the logs of the calls that read them back, those first: a
        run again after a failure in between finds the logs still there, and their copies.
        Those gone already count nothing."""
        if not log_ids:
            return Erasure()
        store = self.memory.tool_logs
        copies = await store.forget_showing(tenant, log_ids)
        async with self.redis.pipeline(transaction=False) as pipe:  # the tenant's slot
            for log_id in log_ids:
                pipe.hget(store.key(tenant, log_id), "thread_id")
            threads = await pipe.execute()
        by_thread: dict[str, list[str]] = {}
        for log_id, thread in zip(log_ids, threads, strict=True):
            if thread is not None:  # else gone already (with a copy it read back, or before)
                by_thread.setdefault(decode(thread) or "", []).append(log_id)
        return Erasure(tool_logs=copies + await store.remove(tenant, by_thread))

    # -- what erasures leave behind -------------------------------------------------------------

    async def purge(self, tenant: str) -> int:
        """Delete the episodic documents of forgotten messages now (`Purge.purge`)."""
        return await self._purge.purge(tenant)

    async def purge_leftovers(self) -> dict[str, int]:
        """Finish the purges stopped processes left (a crash, or a Redis error, mid-purge: the
        documents stay hidden, with their full text, until purged), for each tenant that no
        erasure holds (its lock, taken to check: one running purges when it ends) and no purge
        marked for PURGING_SECONDS (memory/governance_purge.py). Any live process runs this on
        its retention tick (memory/retention.py). Returns {tenant: messages purged}."""
        purged: dict[str, int] = {}
        for tenant in await self._purge.leftovers():
            key, token = forgetting_key(tenant), uuid.uuid4().hex
            if not await self._locks.acquire(key, token, LOCK_TTL_MS):
                continue
            try:
                claimed = await self._purge.claim(tenant)
            finally:
                await self._locks.release(key, token)
            if claimed:  # outside the lock, as an erasure's own purge runs
                try:
                    purged[tenant] = await self._purge.purge(tenant)
                except Exception:  # its mark lapses: the next tick tries again
                    log.exception("purging what an erasure of %s left failed", tenant)
        return purged

    async def settle(self) -> None:
        """Wait for this process's purges (before it exits; benchmarks; tests)."""
        await self._purge.settle()

    # -- one erasure at a time ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self, tenant: str) -> AsyncIterator[None]:
        """Hold the tenant's erasure lock (waiting up to LOCK_WAIT_SECONDS), renewed while
        held, so a long erasure keeps it and a crashed one frees it within a minute. Held by an
        import, which may write for many minutes: `ImportRunning` at once, no wait."""
        key, token = forgetting_key(tenant), uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOCK_WAIT_SECONDS
        while not await self._locks.acquire(key, token, LOCK_TTL_MS):
            if await import_running(self.redis, tenant):
                raise ImportRunning()
            if loop.time() >= deadline:
                raise Busy(ERASURE_RUNNING)
            await asyncio.sleep(0.05)
        try:
            async with (
                self._locks.kept(key, token, LOCK_TTL_MS),
                self._threads.dead_letters_once(tenant),  # one pass over them, at the end
            ):
                yield
        finally:
            self._purge.schedule(tenant)
