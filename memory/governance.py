"""Governance: forget what a tenant's memory holds, erase a person, keep a retention period, and
correct entities and workflows.

Each `forget_*` returns an `Erasure` (how many items went, per store) and raises `NotFound` for
an id the tenant does not hold. What is forgotten is gone from the next turn's context.

- A forgotten message becomes a tombstone in its place (memory/stores/conversation.py): the
  positions of a thread, which scripts, the summarized-prefix counter and episodic entries rely
  on, never move. The embedding-cache entries of its texts are deleted. Its episodic entries
  (the message and its parts) are hidden from every read at once (the tenant's erasing hash,
  which `EpisodicStore._fetch` consults in the same round trip) and deleted in the background
  (`purge`): deleting a vector-index document repairs the HNSW graph around it, about half a
  millisecond each, too slow to wait for when a person's ten thousand messages go. What a
  stopped process left is purged by the tenant's next erasure; `settle` waits for this
  process's purges (`MemoryManager.close` does). A queued indexing task checks the message
  before and after it writes (bot/upkeep.py), so it cannot bring it back.
- A summary covering a forgotten message may quote it: it is rewritten from the remaining
  messages with the deterministic compaction (`compact_note`), and every summary it was merged
  into with `merged_note`. Tombstones keep their summary id, so every message stays in the
  recent window or under exactly one top-level summary.
- Erasures of a tenant run one at a time (a lock): two never rewrite a summary from different
  states. A roll running meanwhile cannot bring a forgotten text back: its marking compares each
  message with what it read, and a merge each child's text (memory/stores/summary.py).

Every key but the vector-index documents (episodes, entities, workflows, chunks) and the
embedding cache is the tenant's, in one hash slot: the reads and writes go out in pipelines, a
few round trips whatever the number of threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from redisvl.query import FilterQuery
from redisvl.query.filter import FilterExpression, Tag

from memory.keys import (
    busy_threads_key,
    embedding_cache_key,
    erasing_key,
    forgetting_key,
    joined_key,
    papers_key,
    summarized_count_key,
    tenant_key,
    thread_records_key,
    threads_key,
    turn_lock_key,
    turn_queue_key,
    turn_running_key,
)
from memory.locks import OwnedLocks
from memory.scope import Scope, legacy_audience
from memory.stores.base import VectorStore, decode, delete_keys
from memory.stores.conversation import Message
from memory.stores.entity import Entity
from memory.stores.episodic import Episode, indexed
from memory.stores.episodic_text import MAX_PARTS
from memory.stores.knowledge_base import base_arxiv_id
from memory.stores.summary import Summary, SummaryConflict, compact_note, merged_note
from memory.text import clean_text

LOCK_TTL_MS = 60_000  # renewed while an erasure runs; lapses a minute after a crash
LOCK_WAIT_SECONDS = 60.0
RETRIES = 5  # compare-and-set rounds against concurrent writers before giving up
THREAD_BATCH = 100  # threads read per pipeline
PAGE = 1000  # records found (and deleted) per search
SCAN_COUNT = 10_000
PURGE_BATCH = 500  # episodic documents deleted per round (a few hundred ms of Redis time)

log = logging.getLogger(__name__)


class NotFound(KeyError):
    """No such item in this tenant's memory (or it belongs to another tenant)."""

    def __init__(self, what: str, item_id: str) -> None:
        super().__init__(item_id)
        self.what = what

    def __str__(self) -> str:
        return f"No {self.what} {self.args[0]!r} in this workspace's memory."


class Busy(RuntimeError):
    """Another erasure of the same tenant held its memory for too long."""


@dataclass
class Erasure:
    """What was removed, per store (counts). `summaries` counts those deleted or rewritten
    without the forgotten text; `messages` those made tombstones or deleted with a thread."""

    messages: int = 0
    threads: int = 0
    summaries: int = 0
    tool_logs: int = 0
    episodes: int = 0
    entities: int = 0
    workflows: int = 0
    papers: int = 0
    chunks: int = 0
    cached_embeddings: int = 0

    def __add__(self, other: Erasure) -> Erasure:
        return Erasure(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                          for f in fields(self)})  # fmt: skip

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def message_texts(message: Message) -> list[str]:
    """Every text of a message that may have been embedded (and cached): the message as a
    question, and as episodic memory embeds it and its parts."""
    episode = indexed(Episode("", "", author=message.author, author_name=message.author_name,
                              role=message.role, text=message.content))  # fmt: skip
    return [message.content, episode.embedding_text, *episode.part_texts()]


def _audience(message: Message, thread: str) -> str:
    return message.audience or legacy_audience(thread)


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

    def put(self, thread: str, index: int, raw: str, message: Message) -> None:
        self.raw[thread][index] = raw
        if thread in self._messages:
            self._messages[thread][index] = message

    def update(self, raw: dict[str, list[str]]) -> None:
        self.raw.update(raw)
        for thread in raw:
            self._messages.pop(thread, None)


class Governance:
    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._locks = OwnedLocks(memory.redis)
        self._purging: dict[str, asyncio.Task] = {}
        self._dirty: set[str] = set()  # tenants with episodic documents to purge

    # -- the public operations ------------------------------------------------------------------

    async def forget_message(self, tenant: str, thread: str, message_id: str) -> Erasure:
        """Make one message a tombstone, delete its episodic entries and cached vectors, and
        rewrite the summaries that cover it. Forgetting it again redoes the clean-up."""
        async with self._exclusive(tenant):
            lists = Threads(await self.memory.conversation.raw_threads(tenant, [thread]))
            if not any(m.id == message_id for m in lists.messages(thread)):
                raise NotFound("message", message_id)
            return await self._forget_messages(tenant, lists, lambda m: m.id == message_id)

    async def forget_thread(self, tenant: str, thread: str) -> Erasure:
        """The whole thread: its messages, counters, summaries, tool logs, episodic entries,
        cached vectors, the bot's presence in it, its entry in the tenant's threads (and its
        queue keys when no job is queued or running there)."""
        async with self._exclusive(tenant):
            lists = Threads(await self.memory.conversation.raw_threads(tenant, [thread]))
            listed = await self.redis.zscore(threads_key(tenant), thread)
            if not lists.raw[thread] and listed is None:
                raise NotFound("thread", thread)
            return await self._erase_threads(tenant, lists)

    async def forget_summary(self, tenant: str, summary_id: str) -> Erasure:
        """The summary goes; a new one written by the deterministic compaction (over its
        remaining messages, or listing its children for a merged one) takes its place and its
        id, so every message stays in the window or under a summary. The summaries it was
        merged into are rewritten too (`merged_note`)."""
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
                note = compact_note(self._covered(lists, old))
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
                await self._relabel(tenant, old, new.id)
            for _ in range(RETRIES):
                try:
                    await summaries.replace(tenant, old, new)
                    break
                except SummaryConflict:  # merged meanwhile: put the new one where it is now
                    old = (await summaries.get_many(tenant, [summary_id])).get(summary_id, old)
            else:
                raise Busy("The summary kept moving while it was being forgotten; try again.")
            rewritten = await self._rewrite_ancestors(tenant, {new.parent} - {""})
            return Erasure(summaries=1 + rewritten)

    async def forget_tool_log(self, tenant: str, log_id: str) -> Erasure:
        store = self.memory.tool_logs
        thread = decode(await self.redis.hget(store.key(tenant, log_id), "thread_id"))
        if thread is None:
            raise NotFound("tool log", log_id)
        return Erasure(tool_logs=await store.remove(tenant, {thread: [log_id]}))

    async def forget_paper(self, tenant: str, arxiv_id: str) -> Erasure:
        """A paper's chunks (its passages) and its entry in the tenant's papers."""
        kb, arxiv_id = self.memory.knowledge_base, base_arxiv_id(arxiv_id)
        record = await self.redis.hget(papers_key(tenant), arxiv_id)
        where = Tag("arxiv_id") == arxiv_id
        chunks = await self._delete_matching(kb, tenant, where, ["arxiv_id"])
        if record is None and not chunks:
            raise NotFound("paper", arxiv_id)
        removed = await self.redis.hdel(papers_key(tenant), arxiv_id)
        return Erasure(papers=int(removed), chunks=len(chunks))

    async def forget_entity(self, tenant: str, entity_id: str) -> Erasure:
        store = self.memory.entities
        async with self._exclusive(tenant):
            key = store.key_of(tenant, entity_id)
            row = await self.redis.hmget(key, store.FIELDS)
            if not entity_id or row[0] is None:
                raise NotFound("entity", entity_id)
            await delete_keys(self.redis, [key])
            cached = await self._uncache([Entity(*(decode(v) or "" for v in row)).line()])
            return Erasure(entities=1, cached_embeddings=cached)

    async def forget_workflow(self, tenant: str, workflow_id: str) -> Erasure:
        store = self.memory.workflows
        async with self._exclusive(tenant):
            key = store.key_of(tenant, workflow_id)
            text = decode(await self.redis.hget(key, "text"))
            if not workflow_id or text is None:
                raise NotFound("workflow", workflow_id)
            await delete_keys(self.redis, [key])
            return Erasure(workflows=1, cached_embeddings=await self._uncache([text]))

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
                await self._uncache([old])

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
                await self._uncache([old])

    async def forget_person(self, tenant: str, user: str) -> Erasure:
        """Erase one person (a platform user id) from every store of the tenant: each message
        they wrote (a tombstone), their DM threads whole, the summaries over their messages
        (rewritten without them), the tool logs of their turns (by the log's author; a log from
        before authors were kept belongs to the turn of the latest question said before it),
        episodic entries, the entities and workflows whose authors include them or that were
        learned in their DMs (the whole record: a merged description cannot be taken apart),
        and the cached vectors of all those texts. Not what others said about them, nor the
        assistant's answers to them outside their DMs. `NotFound` when nothing is theirs."""
        if not user:
            raise NotFound("person", user)
        async with self._exclusive(tenant):
            threads = [t for t, _ in await self.memory.conversation.threads(tenant)]
            lists = await self._read(tenant, threads)

            def theirs(m: Message) -> bool:
                return m.role == "user" and m.author == user and not m.forgotten

            spoke = {t for t in lists if any(map(theirs, lists.messages(t)))}
            place = {t: _audience(lists.messages(t)[0], t) for t in spoke}
            dms = {t for t in spoke if place[t].startswith("dm:")}
            others = lists.only(spoke - dms)
            logs = await self._tool_logs_of(tenant, others, user)
            erasure = await self._erase_threads(tenant, lists.only(dms))
            erasure += await self._forget_messages(tenant, others, theirs)
            erasure += Erasure(tool_logs=await self.memory.tool_logs.remove(tenant, logs))
            erasure += await self._forget_learned(tenant, user, {place[t] for t in dms})
            await self._forget_last_threads(tenant, user)
            if not erasure.total and not spoke:
                raise NotFound("person", user)
            return erasure

    async def forget_older_than(self, tenant: str, cutoff: float) -> Erasure:
        """Retention: conversation memory said before `cutoff` (seconds since the epoch):
        messages (tombstones), summaries over them (rewritten), tool logs, episodic entries,
        cached vectors. A thread whose every message is older goes whole. Papers, entities and
        workflows are kept."""
        async with self._exclusive(tenant):
            listed = await self.redis.zrange(threads_key(tenant), 0, -1, withscores=True)
            lists = await self._read(tenant, [decode(t) for t, _ in listed])
            last = {decode(t): score for t, score in listed}

            def old(m: Message) -> bool:
                return m.timestamp < cutoff and not m.forgotten

            whole, rest = [], []
            for thread in lists:
                stamps = [m.timestamp for m in lists.messages(thread)]
                if max(stamps, default=last[thread]) < cutoff:
                    whole.append(thread)
                elif stamps and min(stamps) < cutoff:
                    rest.append(thread)
            erasure = await self._erase_threads(tenant, lists.only(whole))
            erasure += await self._forget_messages(tenant, lists.only(rest), old)
            store = self.memory.tool_logs
            logs = await store.listed(tenant, set(lists) - set(whole))
            expired = {t: [i for i, at in rows if at < cutoff] for t, rows in logs.items()}
            return erasure + Erasure(tool_logs=await store.remove(tenant, expired))

    async def purge(self, tenant: str) -> int:
        """Delete the episodic documents of forgotten messages (hidden from reads until then),
        a batch at a time so other commands run in between; returns how many messages' went.
        Also finishes what a stopped process left."""
        store, key, done = self.memory.episodes, erasing_key(tenant), 0
        while rows := await self.redis.hrandfield(key, PURGE_BATCH, withvalues=True):
            pairs = rows if isinstance(rows[0], list) else zip(rows[::2], rows[1::2], strict=True)
            parts = {decode(i): int(n) for i, n in pairs}  # RESP3 pairs, or RESP2 flat
            keys = [store.key(tenant, i) for i in parts]
            keys += [
                store.part_key(tenant, i, n) for i, count in parts.items() for n in range(count)
            ]
            await delete_keys(self.redis, keys)
            await self.redis.hdel(key, *parts)
            done += len(parts)
        return done

    async def settle(self) -> None:
        """Wait for this process's purges (before it exits; benchmarks; tests)."""
        while running := [t for t in self._purging.values() if not t.done()]:
            await asyncio.gather(*running, return_exceptions=True)

    def _schedule_purge(self, tenant: str) -> None:
        self._dirty.add(tenant)
        running = self._purging.get(tenant)
        if running is None or running.done():
            self._purging[tenant] = asyncio.create_task(self._purge_while_dirty(tenant))

    async def _purge_while_dirty(self, tenant: str) -> None:
        while tenant in self._dirty:
            self._dirty.discard(tenant)
            try:
                await self.purge(tenant)
            except Exception:  # hidden meanwhile; the tenant's next erasure purges them
                log.exception("purging the forgotten episodic entries of %s failed", tenant)
                return

    async def discard(self, keys: Iterable[str]) -> None:
        """Delete records learned from a question forgotten while they were written (the
        background's workflow and entity writes check their question afterwards)."""
        await delete_keys(self.redis, list(keys))

    # -- messages -------------------------------------------------------------------------------

    async def _read(self, tenant: str, threads: list[str]) -> Threads:
        lists: dict[str, list[str]] = {}
        for start in range(0, len(threads), THREAD_BATCH):
            batch = threads[start : start + THREAD_BATCH]
            lists.update(await self.memory.conversation.raw_threads(tenant, batch))
        return Threads(lists)

    async def _forget_messages(
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
            for thread in pending:
                for message in filter(pick, lists.messages(thread)):
                    chosen.setdefault(message.id, (thread, message))
                    if not message.forgotten:
                        grave = graves[(thread, message.seq)] = message.tombstone()
                        row = (message.seq, lists.raw[thread][message.seq], grave.to_json())
                        changes.setdefault(thread, []).append(row)
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
        episodes = await self._forget_episodes(tenant, list(chosen), said)
        level0 = {lists.messages(t)[m.seq].summary_id for t, m in chosen.values()}
        summaries = await self._rewrite(tenant, lists, level0 - {""})
        return Erasure(messages=tombstoned, summaries=summaries, episodes=episodes,
                       cached_embeddings=await self._uncache(texts))  # fmt: skip

    async def _relabel(self, tenant: str, old: Summary, new_id: str) -> None:
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

    @staticmethod
    def _covered(lists: Threads, summary: Summary) -> list[Message]:
        """The messages a (level-0) summary covers, as they are now, oldest first."""
        wanted = set(summary.message_ids)
        return [m for m in lists.messages(summary.thread_id) if m.id in wanted]

    async def _rewrite(self, tenant: str, lists: Threads, level0: set[str]) -> int:
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
        return len(notes) + await self._rewrite_ancestors(tenant, set(parents.values()) - {""})

    async def _rewrite_ancestors(self, tenant: str, pending: set[str]) -> int:
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

    async def _erase_threads(self, tenant: str, lists: Threads) -> Erasure:
        """Delete whole threads and everything of theirs, in a few pipelines."""
        if not lists:
            return Erasure()
        summaries, logs = self.memory.summaries, self.memory.tool_logs
        everything = [m for t in lists for m in lists.messages(t)]
        said = {m.id: message_texts(m) for m in everything if not m.forgotten}
        episodes = await self._forget_episodes(tenant, [m.id for m in everything], said)
        cached = await self._uncache([text for each in said.values() for text in each])
        tops = await summaries.listed(tenant, lists)
        ids = {i for rows in tops.values() for i, _ in rows}
        ids |= {m.summary_id for m in everything} - {""}
        found: dict[str, Summary] = {}
        while ids:  # the merged summaries' children, down to the messages
            fresh = await summaries.get_many(tenant, ids)
            found.update(fresh)
            ids = {c for s in fresh.values() for c in s.children} - found.keys()
        tool_logs = await logs.listed(tenant, lists)
        pipe = self.redis.pipeline(transaction=True)  # one slot: a tenant's keys
        for thread in lists:
            pipe.delete(
                thread_records_key(tenant, thread, summaries.PLURAL),
                thread_records_key(tenant, thread, logs.PLURAL),
                self.memory.conversation.key(Scope(tenant, thread)),
                summarized_count_key(tenant, thread), joined_key(tenant, thread),
                *(summaries.key(tenant, s.id) for s in found.values() if s.thread_id == thread),
                *(logs.key(tenant, i) for i, _ in tool_logs[thread]),
            )  # fmt: skip
            pipe.zrem(threads_key(tenant), thread)
        await pipe.execute()
        await self._drop_idle_queues(tenant, list(lists))
        return Erasure(
            messages=len(said), threads=len(lists), summaries=len(found),
            tool_logs=sum(map(len, tool_logs.values())), episodes=episodes,
            cached_embeddings=cached,
        )  # fmt: skip

    async def _drop_idle_queues(self, tenant: str, threads: list[str]) -> None:
        """Take threads with no job queued, running or leased out of the busy set."""
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            pipe.exists(turn_queue_key(tenant, thread), turn_running_key(tenant, thread),
                        turn_lock_key(tenant, thread))  # fmt: skip
        idle = [t for t, busy in zip(threads, await pipe.execute(), strict=True) if not busy]
        if idle:
            await self.redis.zrem(busy_threads_key(tenant), *idle)

    # -- a person's other traces -----------------------------------------------------------------

    async def _tool_logs_of(self, tenant: str, lists: Threads, user: str) -> dict[str, list[str]]:
        """The tool logs of `user`'s turns in these threads (read before their messages are
        forgotten: a log without an author goes by the question said before it)."""
        store = self.memory.tool_logs
        listed = await store.listed(tenant, lists)
        authors = await store.authors(tenant, [i for rows in listed.values() for i, _ in rows])
        out: dict[str, list[str]] = {}
        for thread, rows in listed.items():
            questions = [m for m in lists.messages(thread) if m.role == "user"]
            for log_id, created in rows:
                author = authors.get(log_id, "")
                if not author:
                    asked = [m for m in questions if m.timestamp <= created]
                    author = asked[-1].author if asked else ""
                if author == user:
                    out.setdefault(thread, []).append(log_id)
        return out

    async def _forget_learned(self, tenant: str, user: str, audiences: set[str]) -> Erasure:
        """Entities and workflows whose authors include `user` or learned in their DMs."""
        where: FilterExpression = Tag("authors") == user
        if audiences:
            where = where | (Tag("audience") == sorted(audiences))
        fields = ["name", "type", "description"]
        entities = await self._delete_matching(self.memory.entities, tenant, where, fields)
        workflows = await self._delete_matching(self.memory.workflows, tenant, where, ["text"])
        texts = [Entity(*(decode(r.get(f)) or "" for f in fields)).line() for r in entities]
        texts += [decode(r.get("text")) or "" for r in workflows]
        return Erasure(entities=len(entities), workflows=len(workflows),
                       cached_embeddings=await self._uncache(texts))  # fmt: skip

    async def _forget_last_threads(self, tenant: str, user: str) -> None:
        """Their latest thread per channel (what `/summarize` defaults to)."""
        pattern = tenant_key(tenant, "channel", "*", "last-thread")
        keys = [k async for k in self.redis.scan_iter(match=pattern, count=SCAN_COUNT)]
        if keys:
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.hdel(key, user)
            await pipe.execute()

    async def _delete_matching(
        self, store: VectorStore, tenant: str, where: FilterExpression, fields: list[str]
    ) -> list[dict[str, Any]]:
        """Delete a vector store's records that match `where`, a page at a time; the rows."""
        deleted: list[dict[str, Any]] = []
        while True:
            query = FilterQuery(filter_expression=where, return_fields=fields, num_results=PAGE)
            rows = await store._run(tenant, query)
            rows = [r for r in rows if r["id"].startswith(store.key_prefix(tenant))]
            if not rows or not await delete_keys(self.redis, [r["id"] for r in rows]):
                return deleted
            deleted += rows

    # -- episodic memory and the embedding cache --------------------------------------------------

    async def _forget_episodes(
        self, tenant: str, ids: list[str], said: dict[str, list[str]]
    ) -> int:
        """Hide messages' episodic entries from every read now, to be deleted by `purge`: each
        message's document and its parts, as many as its texts (`said`, see `message_texts`)
        have; every possible one for a message whose text is gone already. Returns how many
        messages were indexed."""
        if not ids:
            return 0
        store = self.memory.episodes
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.exists(store.key(tenant, i))
        found = sum(await pipe.execute())
        parts = {i: len(said[i]) - 2 if i in said else MAX_PARTS for i in ids}
        items = list(parts.items())
        for start in range(0, len(items), SCAN_COUNT):
            await self.redis.hset(
                erasing_key(tenant), mapping=dict(items[start : start + SCAN_COUNT])
            )
        return int(found)

    async def _uncache(self, texts: Iterable[str]) -> int:
        """Delete the cached vectors of `texts` (memory/embeddings.py `CachedEmbedder`: keyed
        by model and the SHA-1 of the cleaned text); how many there were."""
        model = self.memory.embedder.model_name
        keys = {
            embedding_cache_key(model, hashlib.sha1(clean_text(t).encode("utf-8")).hexdigest())
            for t in texts
            if t
        }
        return await delete_keys(self.redis, keys) if keys else 0

    # -- one erasure at a time ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self, tenant: str) -> AsyncIterator[None]:
        """Hold the tenant's erasure lock (waiting up to LOCK_WAIT_SECONDS), renewed while
        held, so a long erasure keeps it and a crashed one frees it within a minute."""
        key, token = forgetting_key(tenant), uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOCK_WAIT_SECONDS
        while not await self._locks.acquire(key, token, LOCK_TTL_MS):
            if loop.time() >= deadline:
                raise Busy("Another erasure of this workspace's memory is running; try again.")
            await asyncio.sleep(0.05)

        async def renew() -> None:
            while True:
                await asyncio.sleep(LOCK_TTL_MS / 3000)
                await self._locks.renew(key, token, LOCK_TTL_MS)

        renewing = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewing.cancel()
            await self._locks.release(key, token)
            self._schedule_purge(tenant)
