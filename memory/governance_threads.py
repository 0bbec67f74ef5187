"""Forgetting messages and whole threads: tombstones written by compare-and-set, the summaries
over them rewritten, a thread's keys deleted.

- A forgotten message becomes a tombstone in its place (memory/stores/conversation.py): the
  positions of a thread, which scripts, the summarized-prefix counter and episodic entries rely
  on, never move. Its cached vectors go and its episodic entries are hidden, then purged
  (memory/governance_purge.py). A queued indexing task checks the message before and after it
  writes (bot/upkeep.py), so it cannot bring it back.
- A summary covering a forgotten message may quote it: it is rewritten from the remaining
  messages with the deterministic compaction (`compact_note`), and every summary it was merged
  into with `merged_note`. Tombstones keep their summary id, so every message stays in the
  recent window or under exactly one top-level summary.
- A roll running meanwhile cannot bring a forgotten text back: its marking compares each
  message with what it read, and a merge each child's text (memory/stores/summary.py).
- A Discord thread that goes whole leaves its channel's record of threads too
  (memory/governance_places.py `unlist`), whichever erasure took it.
- The tool logs that showed a forgotten message go too, in any thread (memory/stores/tool_log.py
  `forget_showing`): another turn's search, an expanded summary, a log read back; and so do
  those that read back a deleted thread's log or expanded one of its summaries.
- The dead letters of tasks that carried what went (a thread's, a message's: its id, platform
  id or text) are deleted too (memory/dead_letters.py `forget_dead_letters`), once the
  messages are hidden from search: each pass reads every dead letter of the deployment, so an
  erasure under the lock collects what it took and makes one pass at its end
  (`dead_letters_once`).
- A thread goes whole only as it was read: an append takes no erasure lock, so one script
  checks the thread did not change, hides its messages' episodic entries and deletes its keys
  at once. A thread that changed is left whole: retention then forgets only its old messages,
  an explicit erasure reads it again and erases what was said meanwhile too.

Every key here is the tenant's, in one hash slot: the reads and writes go out in pipelines, a
few round trips whatever the number of threads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from memory.dead_letters import Forgotten, forget_dead_letters
from memory.governance_erasure import Busy, Erasure
from memory.governance_places import Places
from memory.governance_purge import Purge, erasing_parts, message_texts
from memory.keys import (
    busy_threads_key,
    erasing_key,
    joined_key,
    summarized_count_key,
    thread_records_key,
    threads_key,
    turn_lock_key,
    turn_queue_key,
    turn_running_key,
)
from memory.scope import Scope
from memory.stores.conversation import Message
from memory.stores.summary import Summary, compact_note, merged_note

log = logging.getLogger(__name__)

RETRIES = 5  # compare-and-set rounds against concurrent writers before giving up
THREAD_BATCH = 100  # threads read per pipeline

# Delete a thread only if it is as read. KEYS: its list, its indexes of summaries and of tool
# logs, the tenant's threads, the tenant's erasing hash, then its other keys; ARGV: the list's
# length, each index's members (newline-joined, in ZRANGE order), the thread, then pairs
# (message id, parts) to hide. An append (memory/stores/conversation.py) takes no erasure
# lock: a thread that grew meanwhile is left whole (0), and its new message with it.
_DELETE_UNCHANGED_SCRIPT = """
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return 0 end
for i = 2, 3 do
  if table.concat(redis.call('ZRANGE', KEYS[i], 0, -1), '\\n') ~= ARGV[i] then return 0 end
end
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1]) end
redis.call('ZREM', KEYS[4], ARGV[4])
for i = 1, #KEYS do
  if i ~= 4 and i ~= 5 then redis.call('DEL', KEYS[i]) end
end
return 1
"""


class Threads:
    """Threads' lists as read: each message's raw JSON (what a compare-and-set compares) and
    the message, decoded once, by position."""

    def __init__(self, raw: dict[str, list[str]]) -> None:
        self.raw = raw
        self._messages: dict[str, list[Message]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def only(self, threads: Iterable[str]) -> Threads:
        part = Threads({t: self.raw[t] for t in threads})
        part._messages = {t: self._messages[t] for t in part.raw if t in self._messages}
        return part

    def messages(self, thread: str) -> list[Message]:
        if thread not in self._messages:
            decoded = [Message.from_json(r) for r in self.raw.get(thread, [])]
            for i, message in enumerate(decoded):
                message.seq = i
            self._messages[thread] = decoded
        return self._messages[thread]

    def from_source(self, source: str) -> list[tuple[str, Message]]:
        """(thread, message) of the user messages stored from the platform's message `source`
        (tombstones keep no source)."""
        return [
            (thread, m) for thread in self for m in self.messages(thread)
            if m.role == "user" and not m.forgotten and m.metadata.get("source") == source
        ]  # fmt: skip

    def put(self, thread: str, index: int, raw: str, message: Message) -> None:
        self.raw[thread][index] = raw
        if thread in self._messages:
            self._messages[thread][index] = message

    def update(self, raw: dict[str, list[str]]) -> None:
        self.raw.update(raw)
        for thread in raw:
            self._messages.pop(thread, None)


def covered_by(lists: Threads, summary: Summary) -> list[Message]:
    """The messages a (level-0) summary covers, as they are now, oldest first."""
    wanted = set(summary.message_ids)
    return [m for m in lists.messages(summary.thread_id) if m.id in wanted]


class ThreadEraser:
    """Tombstones messages, deletes threads, and rewrites the summaries over what went. The
    caller holds the tenant's erasure lock (`Governance._exclusive`)."""

    def __init__(self, memory: Any, purge: Purge, places: Places | None = None) -> None:
        self.memory = memory
        self.redis = memory.redis
        self.purge = purge
        # a Discord thread's channel's record of it (the governance's own, when given)
        self.places = places or Places(memory.redis)
        self._delete = memory.redis.register_script(_DELETE_UNCHANGED_SCRIPT)
        self._collecting: dict[str, Forgotten] = {}  # per tenant, its erasure's (one at a time)

    # -- dead letters ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def dead_letters_once(self, tenant: str) -> AsyncIterator[None]:
        """Collect what the erasure in the body takes, and drop the dead letters carrying any
        of it in one pass at its end (however it ends: what went is gone)."""
        if tenant in self._collecting:  # an outer erasure of the tenant makes the pass
            yield
            return
        self._collecting[tenant] = Forgotten(tenant)
        try:
            yield
        finally:
            forgotten = self._collecting.pop(tenant, None)
            if forgotten is not None:
                await forget_dead_letters(self.redis, forgotten)

    async def drop_dead_letters(self, forgotten: Forgotten) -> None:
        """The dead letters carrying what `forgotten` names: at the end of the erasure that
        collects them (`dead_letters_once`), else now."""
        if forgotten.tenant in self._collecting:
            self._collecting[forgotten.tenant] |= forgotten
        else:
            await forget_dead_letters(self.redis, forgotten)

    async def read(self, tenant: str, threads: list[str]) -> Threads:
        lists: dict[str, list[str]] = {}
        for start in range(0, len(threads), THREAD_BATCH):
            batch = threads[start : start + THREAD_BATCH]
            lists.update(await self.memory.conversation.raw_threads(tenant, batch))
        return Threads(lists)

    # -- messages -------------------------------------------------------------------------------

    async def forget_messages(
        self, tenant: str, lists: Threads, pick: Callable[[Message], bool]
    ) -> Erasure:
        """Tombstone the picked messages of these threads (compare-and-set, retried where a
        summarizer marked one meanwhile), then delete their episodic entries and cached
        vectors and rewrite the summaries over them."""
        chosen: dict[str, tuple[str, Message]] = {}  # id -> (thread, the message as it was)
        pending, tombstoned = list(lists), 0
        for _ in range(RETRIES):
            changes: dict[str, list[tuple[int, str, str]]] = {}
            graves: dict[tuple[str, int], Message] = {}
            living: list[Message] = []  # this round's, whose sources are closed first
            for thread in pending:
                for message in filter(pick, lists.messages(thread)):
                    chosen.setdefault(message.id, (thread, message))
                    if not message.forgotten:
                        living.append(message)
                        grave = graves[(thread, message.seq)] = message.tombstone()
                        row = (message.seq, lists.raw[thread][message.seq], grave.to_json())
                        changes.setdefault(thread, []).append(row)
            await self.purge.close_sources(tenant, living)  # a tombstone keeps no source
            changed = await self.memory.conversation.replace(tenant, changes)
            for thread, rows in changes.items():
                missed = set(changed.get(thread, ()))
                for i, _, raw in rows:
                    if i not in missed:
                        lists.put(thread, i, raw, graves[(thread, i)])
                        tombstoned += 1
            if not changed:
                break
            lists.update(await self.memory.conversation.raw_threads(tenant, changed))
            pending = list(changed)
        else:
            raise Busy("Messages kept changing while they were being forgotten; try again.")
        said = {m.id: message_texts(m) for _, m in chosen.values() if not m.forgotten}
        texts = [text for each in said.values() for text in each]
        episodes = await self.purge.hide(tenant, list(chosen), said)
        shown = await self.memory.tool_logs.forget_showing(tenant, chosen)  # logs that showed them
        await self.drop_dead_letters(_forgotten_messages(tenant, chosen.values()))
        level0 = {lists.messages(t)[m.seq].summary_id for t, m in chosen.values()}
        summaries = await self.rewrite_summaries(tenant, lists, level0 - {""})
        return Erasure(messages=tombstoned, summaries=summaries, episodes=episodes,
                       tool_logs=shown,
                       cached_embeddings=await self.purge.uncache(texts))  # fmt: skip

    async def relabel(self, tenant: str, old: Summary, new_id: str) -> None:
        """Point the messages of summary `old` at `new_id` (compare-and-set, retried)."""
        covered = set(old.message_ids)
        for _ in range(RETRIES):
            lists = await self.memory.conversation.raw_threads(tenant, [old.thread_id])
            changes = []
            for i, row in enumerate(lists[old.thread_id]):
                message = Message.from_json(row)
                if message.id in covered and message.summary_id != new_id:
                    changes.append((i, row, replace(message, summary_id=new_id).to_json()))
            if not await self.memory.conversation.replace(tenant, {old.thread_id: changes}):
                return
        raise Busy("Messages kept changing while a summary was being forgotten; try again.")

    # -- summaries ------------------------------------------------------------------------------

    async def rewrite_summaries(self, tenant: str, lists: Threads, level0: set[str]) -> int:
        """Rewrite summaries over messages (compact notes of what remains), then every summary
        they were merged into; returns how many were rewritten."""
        if not level0:
            return 0
        found = await self.memory.summaries.get_many(tenant, level0)
        by_thread: dict[str, list[Summary]] = {}
        for summary in found.values():
            by_thread.setdefault(summary.thread_id, []).append(summary)
        notes = {}
        for thread, summaries in by_thread.items():  # one pass over each thread's messages
            of = {i: s.id for s in summaries for i in s.message_ids}
            covered: dict[str, list[Message]] = {s.id: [] for s in summaries}
            for message in lists.messages(thread):
                if message.id in of:
                    covered[of[message.id]].append(message)
            notes.update({i: compact_note(ms) for i, ms in covered.items()})
        parents = await self.memory.summaries.rewrite(tenant, notes)
        return len(notes) + await self.rewrite_ancestors(tenant, set(parents.values()) - {""})

    async def rewrite_ancestors(self, tenant: str, pending: set[str]) -> int:
        """Rewrite merged summaries from their children's descriptions, then their parents,
        up to the top. A parent is read after its child is written, so a merge that took the
        child meanwhile is rewritten too."""
        store, done = self.memory.summaries, set()
        while pending:
            parents = await store.get_many(tenant, pending)
            kids = await store.get_many(tenant, {c for p in parents.values() for c in p.children})
            notes = {i: merged_note([kids[c] for c in p.children if c in kids])
                     for i, p in parents.items()}  # fmt: skip
            done |= notes.keys()
            pending = set((await store.rewrite(tenant, notes)).values()) - {""}
        return len(done)

    # -- threads --------------------------------------------------------------------------------

    async def erase_threads(self, tenant: str, lists: Threads) -> Erasure:
        """Delete whole threads and everything of theirs. A thread that changed since it was
        read (a message appended, a summary or tool log written) is read again and erased as
        it is then: an explicit erasure takes what was said meanwhile too."""
        erasure = Erasure()
        for _ in range(RETRIES):
            done, changed = await self.erase_unchanged(tenant, lists)
            erasure += done
            if not changed:
                return erasure
            lists = await self.read(tenant, changed)
        raise Busy("Threads kept changing while they were being erased; try again.")

    async def erase_unchanged(self, tenant: str, lists: Threads) -> tuple[Erasure, list[str]]:
        """Delete whole threads and everything of theirs, each only if it is still as read:
        one script per thread checks that its list is as long and its indexes list the same
        summaries and tool logs, then hides its messages' episodic entries and deletes its
        keys, at once. Returns what went and the threads that changed meanwhile, untouched:
        a thread is never left half deleted, and a message appended meanwhile is not lost."""
        if not lists:
            return Erasure(), []
        summaries, logs = self.memory.summaries, self.memory.tool_logs
        everything = [m for t in lists for m in lists.messages(t)]
        said = {m.id: message_texts(m) for m in everything if not m.forgotten}
        indexed = await self.purge.indexed(tenant, [m.id for m in everything])
        tops = await summaries.listed(tenant, lists)
        ids = {i for rows in tops.values() for i, _ in rows}
        ids |= {m.summary_id for m in everything} - {""}
        found: dict[str, Summary] = {}
        while ids:  # the merged summaries' children, down to the messages
            fresh = await summaries.get_many(tenant, ids)
            found.update(fresh)
            ids = {c for s in fresh.values() for c in s.children} - found.keys()
        # the logs anywhere that showed their messages, expanded their summaries or read their
        # logs back, before the threads go: a failure here leaves the threads for a retry,
        # which finds the copies again (after the deletion nothing would name them)
        copied = [m.id for m in everything] + list(found)
        copied += [i for rows in (await logs.listed(tenant, lists)).values() for i, _ in rows]
        shown = await logs.forget_showing(tenant, copied)
        tool_logs = await logs.listed(tenant, lists)  # as the script compares: without those
        # what their logs showed, read before they go: their shown-in-logs entries go at the end
        showed = await logs.shown(tenant, (i for rows in tool_logs.values() for i, _ in rows))
        threads = list(lists)
        await self.purge.close_sources(tenant, everything)  # first: the keys go with the lists
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            hidden = erasing_parts((m.id for m in lists.messages(thread)), said)
            keys = [
                self.memory.conversation.key(Scope(tenant, thread)),
                thread_records_key(tenant, thread, summaries.PLURAL),
                thread_records_key(tenant, thread, logs.PLURAL),
                threads_key(tenant), erasing_key(tenant),
                summarized_count_key(tenant, thread), joined_key(tenant, thread),
                *(summaries.key(tenant, s.id) for s in found.values() if s.thread_id == thread),
                *(logs.key(tenant, i) for i, _ in tool_logs[thread]),
            ]  # fmt: skip
            args = [len(lists.raw[thread]), "\n".join(i for i, _ in tops[thread]),
                    "\n".join(i for i, _ in tool_logs[thread]), thread,
                    *(x for pair in hidden.items() for x in pair)]  # fmt: skip
            await self._delete(keys=keys, args=args, client=pipe)
        deleted = [t for t, ok in zip(threads, await pipe.execute(), strict=True) if int(ok)]
        changed = [t for t in threads if t not in set(deleted)]
        gone = lists.only(deleted)
        went = [m for t in gone for m in gone.messages(t)]
        texts = [text for m in went if m.id in said for text in said[m.id]]
        await self._drop_idle_queues(tenant, deleted)
        await self.drop_dead_letters(Forgotten(tenant, threads=frozenset(deleted)))
        await self.memory.turn_records.drop_threads(tenant, deleted)  # their usage counters
        erasure = Erasure(
            messages=sum(m.id in said for m in went), threads=len(deleted),
            summaries=sum(s.thread_id in set(deleted) for s in found.values()),
            tool_logs=sum(len(tool_logs[t]) for t in deleted) + shown,
            episodes=sum(m.id in indexed for m in went),
            cached_embeddings=await self.purge.uncache(texts),
        )  # fmt: skip
        try:  # not needed: a thread left listed is an id only, which erases nothing
            await self.places.unlist(tenant, deleted)
        except Exception:
            log.exception("forgotten threads could not leave their channels' records")
        # last, and only tidying (a failure is logged there): an entry of no log is skipped
        await logs.unindex(
            tenant, {i: showed[i] for t in deleted for i, _ in tool_logs[t] if i in showed}
        )
        return erasure, changed

    async def _drop_idle_queues(self, tenant: str, threads: list[str]) -> None:
        """Take threads with no job queued, running or leased out of the busy set."""
        if not threads:
            return
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.exists(turn_queue_key(tenant, thread), turn_running_key(tenant, thread),
                        turn_lock_key(tenant, thread))  # fmt: skip
        idle = [t for t, busy in zip(threads, await pipe.execute(), strict=True) if not busy]
        if idle:
            await self.redis.zrem(busy_threads_key(tenant), *idle)


def _forgotten_messages(tenant: str, chosen: Iterable[tuple[str, Message]]) -> Forgotten:
    """The messages as they were before their tombstones: ids, platform ids and texts, by
    which a dead letter carrying one is found."""
    messages = [m for _, m in chosen]
    sources = {str(m.metadata.get("source") or "") for m in messages} - {""}
    texts = {m.content for m in messages if not m.forgotten}
    return Forgotten(
        tenant, messages=frozenset(m.id for m in messages), sources=frozenset(sources),
        texts=frozenset(texts - {""}),
    )  # fmt: skip
