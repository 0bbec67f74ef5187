"""Import's writes: the records of a checked export (memory/portability_check.py) written
through the stores' key layout, in batches.

The same keys the stores write: thread scores, summarized-prefix counters, the thread indexes
of summaries and tool logs, papers after their chunks, watches (through their store, with
their due index), the per-question records of what each question taught (rebuilt from the
entities' piece owners and the workflows' questions), whose DM each DM place is (from its
messages' authors: `Writer._dm_people`). A watch comes in paused, whatever its
file said (or dropped when its platform cannot be the tenant's): its channel may be anyone's,
and is checked by its platform when it is resumed. Messages are indexed for episodic recall
as they are written; vectors are reused when the export's embedding model is the configured
one, and embedded again otherwise (`reembed`).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from memory.dm_people import DmAuthors
from memory.embeddings import background_embedding
from memory.keys import (
    InvalidName,
    dm_people_key,
    learned_key,
    messages_key,
    papers_key,
    shown_in_logs_key,
    summarized_count_key,
    threads_key,
)
from memory.portability_check import END, HEADER, PLURALS, SHAPES
from memory.portability_export import dumps
from memory.scope import Scope, TenantKind, legacy_audience, tenant_kind
from memory.stores.base import VectorStore, decode, stored_ids
from memory.stores.entity_pieces import PIECES, question_of
from memory.stores.episodic import Episode
from memory.stores.tool_log import ToolLogStore
from memory.stores.turn_records import record_of
from memory.stores.watches import Watch, WatchStore

log = logging.getLogger(__name__)

PIPELINE = 1000  # commands sent together
BATCH = 256  # records written (and embedded) together
VECTOR_KINDS = ("chunk", "entity", "workflow")
# what `_replace_stored` reads of a summary or tool log stored under an id the file writes
STORED = {"summary": ["thread_id", "parent", "children"], "tool_log": ["thread_id", "message_ids"]}
# an import's counts of watches it paused, or dropped (said by the memory page's summary)
PAUSED_WATCHES = "paused_watch_imports"  # the page: "2 watches imported paused"
DROPPED_WATCHES = "dropped_watch_imports"


def impossible_place(tenant: str, platform: str, channel: str) -> str:
    """Why a watch's place cannot be of `tenant`, by their shapes alone, or "": a Discord
    tenant is a server (digits) or a person's DMs (`dm-<id>`), a Slack one a workspace (neither),
    and a Discord channel is a snowflake. The platform says the rest when it is resumed."""
    kind = tenant_kind(tenant)
    discord_tenant = kind in (TenantKind.DISCORD_SERVER, TenantKind.DISCORD_DM)
    if platform == "discord" and not (discord_tenant and channel.isdigit()):
        return f"Discord channel {channel!r} cannot be of tenant {tenant}"
    if platform == "slack" and kind is not TenantKind.SLACK:
        return f"a Slack channel cannot be of tenant {tenant}: not a Slack workspace's"
    return ""


def _later(value: Any, started: float) -> bool:
    """Whether a record's time (a number, or a number's text) is after `started`."""
    try:
        return float(value) > started
    except (TypeError, ValueError):  # none, or not a time: left as it is
        return False


def _record_in(record: dict[str, Any], json_fields: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: json.dumps(value, ensure_ascii=False)
        if name in json_fields or not isinstance(value, str | int | float) or value is True
        or value is False else value
        for name, value in record.items()
    }  # fmt: skip


@dataclass
class _ThreadState:
    channel: str
    dm_person: str = ""  # whose DM the thread's place is, as the export recorded it
    count: int = 0  # messages written: the next one's position
    last_ts: float | None = None  # the previous message's timestamp (tombstones' too)
    episodes: list[Episode] = field(default_factory=list)


class Writer:
    """Writes checked records through the stores' key layout, in batches; `counts` says how
    many of each kind were written. A thread's `last_active` and a paper's `ingested_at` are
    written no later than `started`, the import's start: a later one (the exporting host's
    clock ran ahead) would be taken for use of the tenant since (`Portability.used_since`),
    and an import that failed would then be kept rather than cleared."""

    def __init__(
        self,
        memory: Any,
        tenant: str,
        reembed: bool,
        held: Callable[[], None] = lambda: None,
        started: float | None = None,
    ) -> None:
        self.memory, self.redis, self.tenant, self.reembed = memory, memory.redis, tenant, reembed
        self.held = held  # raises once the import's lock is lost: called before each batch
        self.started = time.time() if started is None else started
        self.counts: Counter[str] = Counter()
        self.source = tenant  # the exported tenant, from the header
        self.pipe = self.redis.pipeline(transaction=False)
        self.tool_logs: dict[str, set[str]] = {}  # queued in `pipe`: what each log showed
        # every summary and tool log queued in `pipe` (replacing a stored one or not): the
        # thread index the file lists it in (None: a merged child, listed nowhere)
        self.listed_in: dict[str, dict[str, str | None]] = {"summary": {}, "tool_log": {}}
        # summaries queued in `pipe`: the parent and children the file gives each
        self.trees: dict[str, tuple[str, set[str]]] = {}
        self.summaries: set[str] = set()  # every summary this import wrote (or queued)
        self.threads: dict[str, _ThreadState] = {}
        self.dm_people = DmAuthors()  # each DM place's writers (`_dm_people`)
        self.papers: dict[str, str] = {}
        self.vectors: dict[str, list[dict]] = {kind: [] for kind in VECTOR_KINDS}
        self.stores: dict[str, Any] = {
            "chunk": memory.knowledge_base, "entity": memory.entities,
            "workflow": memory.workflows, "summary": memory.summaries,
            "tool_log": memory.tool_logs,
        }  # fmt: skip

    async def write(self, record: dict) -> None:
        kind = record["kind"]
        if kind == HEADER:
            self.source = str(record.get("tenant") or self.tenant)
            return
        if kind == END:
            return
        self.counts[PLURALS[kind]] += 1
        if kind == "retention":
            await self.memory.retention.set(self.tenant, record.get("days"))
        elif kind == "thread":
            await self._thread(record)
        elif kind == "message":
            await self._message(record["thread"], record["message"])
        elif kind in ("summary", "tool_log"):
            store, shape = self.stores[kind], SHAPES[kind]
            item = {k: v for k, v in record[kind].items() if k in shape}  # as its store reads it
            key = store.key(self.tenant, item["id"])
            self.pipe.delete(key)  # replaces a record stored under its id whole (`_replace_stored`)
            self.pipe.hset(key, mapping=_record_in(item, store.JSON_FIELDS))
            index = None
            if record.get("listed") is not None:
                index = store.thread_index(Scope(self.tenant, record["thread"]))
                self.pipe.zadd(index, {item["id"]: record["listed"]})
            self.listed_in[kind][item["id"]] = index
            if kind == "summary":
                self.trees[item["id"]] = (item.get("parent") or "", set(item.get("children") or []))
                self.summaries.add(item["id"])
            if kind == "tool_log":  # found again when a message it showed is forgotten
                self.tool_logs[item["id"]] = set(item.get("message_ids") or [])
                for message_id in self.tool_logs[item["id"]]:
                    self.pipe.sadd(shown_in_logs_key(self.tenant, message_id), item["id"])
        elif kind == "turn":  # written at once: indexes and usage through the store
            turn = record_of(record["turn"], self.tenant, record["thread"])
            turn.workflow = self._own_key(self.memory.workflows, turn.workflow)
            await self.memory.turn_records.restore(turn)
        elif kind == "watch":  # written at once, through the store (its due index too)
            await self._watch(record)
        elif kind == "paper":
            paper = record["paper"]
            if _later(paper.get("ingested_at"), self.started):
                paper = {**paper, "ingested_at": self.started}
            self.papers[paper["arxiv_id"]] = json.dumps(paper)
        else:
            self.vectors[kind].append(record)
            if len(self.vectors[kind]) >= BATCH:
                await self._vectors(kind)
        if len(self.pipe) >= PIPELINE:
            await self._send()

    async def _send(self) -> None:
        """Send the queued writes, once the import's lock is known held, after what replacing
        the stored versions of the queued summaries and tool logs takes (`_replace_stored`)."""
        self.held()
        if any(self.listed_in.values()):
            await self._replace_stored()
        await self.pipe.execute()

    async def _replace_stored(self) -> None:
        """Read what is stored under the ids of the queued summaries and tool logs (one
        pipeline), before `pipe` overwrites it, and queue what replacing it takes besides:
        leaving the thread index it is listed in (`_unlist`), the shown-in-logs sets of what a
        stored log showed and the new one does not (`ToolLogStore.unindex_in`: else they keep
        pointing at a log that no longer showed them), a stored summary's place in the summary
        tree (`_untree`). Ids are unique in a checked file: none of them is queued twice."""
        queued = [(kind, i) for kind, ids in self.listed_in.items() for i in ids]
        read = self.redis.pipeline(transaction=False)
        for kind, record_id in queued:
            read.hmget(self.stores[kind].key(self.tenant, record_id), STORED[kind])
        stored = {
            (kind, record_id): dict(zip(STORED[kind], row, strict=True))
            for (kind, record_id), row in zip(queued, await read.execute(), strict=True)
        }
        self._unlist(stored)
        left = {
            i: set(stored_ids(stored["tool_log", i]["message_ids"])) - showed
            for i, showed in self.tool_logs.items()
        }
        ToolLogStore.unindex_in(self.pipe, self.tenant, left)
        await self._untree({i: stored["summary", i] for i in self.trees})
        self.listed_in = {kind: {} for kind in self.listed_in}
        self.tool_logs, self.trees = {}, {}

    def _unlist(self, stored: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Queue the ZREMs that take each queued summary or tool log out of the thread index
        its stored version is listed in (its stored `thread_id`'s), unless the imported one is
        listed in that same index (its ZADD is queued before: a ZREM would undo it): else a
        thread the file does not put it in (another one, or none for a merged child) keeps
        listing it. The file's `thread_id` is its record's thread (`Check`)."""
        for (kind, record_id), values in stored.items():
            index = self._stored_index(kind, values["thread_id"])
            if index is not None and index != self.listed_in[kind][record_id]:
                self.pipe.zrem(index, record_id)

    def _stored_index(self, kind: str, thread: Any) -> str | None:
        """The thread index a stored record's `thread_id` names; None when none is stored (or
        no thread a store lists under)."""
        try:
            return self.stores[kind].thread_index(Scope(self.tenant, decode(thread) or ""))
        except InvalidName:
            return None

    async def _untree(self, stored: dict[str, dict[str, Any]]) -> None:
        """Take the stored versions of the queued summaries out of the summary tree where the
        file does not put them. A stored parent the file does not give one stops naming it
        among its `children`: forgetting that parent would else rewrite its thread's summary
        from the imported text and make the imported one its child (another thread's, maybe
        another audience's). A stored child the file does not name, whose `parent` is the id,
        is deleted (hash and index entry): it summarized the replaced version, which went
        whole, is listed nowhere, and forgetting it would rewrite the imported summary from
        children it does not have. Its own children are left (their parent is gone: a forget
        of one rewrites nothing). A summary this import wrote is left as the file gives it.
        A second read, only when there is such a parent or child."""
        leaving: dict[str, set[str]] = {}  # a stored parent: the ids leaving its children
        orphans: dict[str, str] = {}  # a stored child: the id it was merged into
        for summary_id, (parent, children) in self.trees.items():
            old_parent = decode(stored[summary_id]["parent"]) or ""
            if old_parent and old_parent != parent and old_parent not in self.summaries:
                leaving.setdefault(old_parent, set()).add(summary_id)
            for child in (
                set(stored_ids(stored[summary_id]["children"])) - children - self.summaries
            ):
                orphans[child] = summary_id
        if not leaving and not orphans:
            return
        store = self.stores["summary"]
        read = self.redis.pipeline(transaction=False)
        for parent in leaving:
            read.hget(store.key(self.tenant, parent), "children")
        for child in orphans:
            read.hmget(store.key(self.tenant, child), ["parent", "thread_id"])
        replies = await read.execute()
        gone: set[str] = set()
        for (child, merged_into), (parent, thread) in zip(
            orphans.items(), replies[len(leaving) :], strict=True
        ):
            if decode(parent) != merged_into:  # not the replaced version's child (any more)
                continue
            gone.add(child)
            self.pipe.delete(store.key(self.tenant, child))
            if (index := self._stored_index("summary", thread)) is not None:
                self.pipe.zrem(index, child)
        for (parent, ids), raw in zip(leaving.items(), replies[: len(leaving)], strict=True):
            children = stored_ids(raw)
            kept = [c for c in children if c not in ids]
            if raw is not None and parent not in gone and kept != children:
                self.pipe.hset(
                    store.key(self.tenant, parent), "children", json.dumps(kept, ensure_ascii=False)
                )

    def _own_key(self, store: VectorStore, key: str) -> str:
        """A record's key in the exported tenant as the same record's key in this one, or ""
        (no record) for a key elsewhere: a key left pointing out of this tenant would have
        this tenant's feedback change a record there."""
        try:
            source = store.key_prefix(self.source)
        except InvalidName:  # a header's tenant no store could have had: no key of its
            return ""
        return store.key_prefix(self.tenant) + key[len(source) :] if key.startswith(source) else ""

    async def _watch(self, record: dict) -> None:
        """Stored paused, always (but a terminal's, run by hand only): the file (its header's
        tenant too) is whoever uploaded it, and its channel may be anyone's; `/watch resume`
        asks the platform whether the channel is of this tenant before it posts again. A watch
        whose platform cannot be this tenant's (`impossible_place`) is dropped."""
        known = {f.name for f in fields(Watch)} - {"tenant"}
        values = {"query": "", **{k: v for k, v in record["watch"].items() if k in known}}
        watch = Watch(tenant=self.tenant, **values)
        if why := impossible_place(self.tenant, watch.platform, watch.channel):
            log.warning("import into %s: dropped watch %s: %s", self.tenant, watch.id, why)
            self.counts[PLURALS["watch"]] -= 1
            self.counts[DROPPED_WATCHES] += 1
            return
        if not watch.paused and watch.platform != "terminal":  # (a terminal's posts nowhere)
            # a copy under another name: its channels are the original's, which may still post
            # there (twice, then), and their slash commands look in the original tenant; under
            # its own name, the header may lie as well as the channel
            watch.paused = (
                f"copied from tenant {self.source[:60]} by an import"
                if self.source != self.tenant
                else f"imported: `/watch resume {watch.id}` where it posts"
            )
            self.counts[PAUSED_WATCHES] += 1
        # made no later than the import's start, as threads and papers: a creation time ahead
        # (the exporting host's clock) is not a watch made since (`Portability.used_since`)
        watch.created_at = min(watch.created_at, self.started)
        await WatchStore(self.redis).restore(watch, record.get("posted") or {}, time.time())

    async def _thread(self, record: dict) -> None:
        """The thread listed, its summarized-prefix counter (left out: counted again on its
        first read) and a Discord thread's channel noted, so the channel's deletion finds it
        (only under its own tenant: the places go by the thread id's tenant)."""
        thread = record["thread"]
        self.threads[thread] = _ThreadState(
            record.get("channel") or "", record.get("dm_person") or ""
        )
        last_active = min(record["last_active"], self.started)
        self.pipe.zadd(threads_key(self.tenant), {thread: last_active})
        if record.get("summarized") is not None:
            self.pipe.set(summarized_count_key(self.tenant, thread), record["summarized"])
        own = f"discord:{self.tenant}:"
        if record.get("parent") and thread.startswith(own):
            places = self.memory.governance.places
            await places.note_thread(self.tenant, record["parent"], thread[len(own) :])

    async def _message(self, thread: str, message: dict) -> None:
        state = self.threads[thread]
        seq, previous, state.last_ts = state.count, state.last_ts, float(message["timestamp"])
        # its position here (a member's export of a thread leaves out what they may not see)
        self.pipe.rpush(messages_key(self.tenant, thread), dumps({**message, "seq": seq}))
        if seq == 0 and state.dm_person:  # the thread's place is its first message's
            self.dm_people.declare(thread, state.dm_person, message.get("audience") or "")
        state.count += 1
        self.dm_people.add(
            thread, message["role"], message.get("author") or "", message.get("audience") or ""
        )
        if message.get("forgotten") or not message["content"].strip():
            return
        state.episodes.append(
            Episode(
                message["id"],
                thread,
                state.channel,
                audience=message.get("audience") or legacy_audience(thread),
                author=message.get("author") or "",
                author_name=message.get("author_name") or "",
                role=message["role"],
                text=message["content"],
                ts=state.last_ts,
                seq=seq,
                previous_ts=previous,
            )
        )
        if len(state.episodes) >= BATCH:
            await self._episodes(thread)

    async def _episodes(self, thread: str) -> None:
        state = self.threads[thread]
        if not state.episodes:
            return
        await self._send()  # the messages before their episodic entries
        scope = Scope(self.tenant, thread, channel=state.channel)
        with background_embedding():
            await self.memory.episodes.add(scope, state.episodes)
        self.counts["episodes"] += len(state.episodes)
        state.episodes = []

    async def _vectors(self, kind: str) -> None:
        records, self.vectors[kind] = self.vectors[kind], []
        if not records:
            return
        self.held()
        store: VectorStore = self.stores[kind]
        prefix = store.key_prefix(self.tenant)
        # an export made before a field existed (e.g. `audience`) gets its default
        values = [{**store.DEFAULTS, **r["fields"], "tenant": self.tenant} for r in records]
        if self.reembed:
            vectors = await store.record_embedder.embed([store.embedding_text(v) for v in values])
            self.counts["re-embedded"] += len(records)
        else:
            vectors = [
                np.frombuffer(base64.b64decode(r["vector"]), dtype=np.float32) for r in records
            ]
        await store._write(
            self.tenant,
            [
                (prefix + r["id"], v, vector)
                for r, v, vector in zip(records, values, vectors, strict=True)
            ],
        )
        for r, v in zip(records, values, strict=True):
            self._lessons(kind, prefix + r["id"], v)

    def _dm_people(self) -> None:
        """Record whose DM each imported DM place is (memory/keys.py `dm_people_key`), as
        appends do: erasing that person then takes the place's threads whole, those of
        tombstones and answers too. As the export recorded it (a DM thread line's
        `dm_person`); for a place it has no record of (a file from before it kept one), by its
        one writer (memory/dm_people.py, the rule a person's erasure back-fills by). A place
        already recorded in this tenant keeps its record: the file is whoever uploaded it."""
        for audience, person in self.dm_people.people().items():
            self.pipe.hsetnx(dm_people_key(self.tenant), audience, person)

    def _lessons(self, kind: str, key: str, values: dict[str, Any]) -> None:
        """Rebuild the per-question records (memory/governance_learned.py) from what the
        records keep: an entity's piece owners, a workflow's question; so forgetting a
        question in the imported tenant finds what it taught."""
        if kind == "entity":
            owners = [owner for owner, _ in json.loads(values.get(PIECES) or "[]")]
            questions = {question_of(owner) for owner in owners if owner}
        else:
            questions = {values.get("question") or ""} - {""} if kind == "workflow" else set()
        for question in questions:
            self.pipe.sadd(learned_key(self.tenant, question), key)

    async def finish(self) -> None:
        for thread in self.threads:
            await self._episodes(thread)
        for kind in VECTOR_KINDS:
            await self._vectors(kind)
        self._dm_people()
        if self.papers:  # last: a paper counts as present once its chunks are searchable
            self.pipe.hset(papers_key(self.tenant), mapping=self.papers)
        await self._send()
