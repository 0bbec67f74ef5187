"""The memory page's reads: what a tenant's memory holds, each item with the audience it was
learned for (memory/scope.py), so the page shows each person only what they may see.

Every read takes the audiences its reader may see, or `None` for all of them (an admin's view),
and returns only items of those; nothing here decides who may see what beyond that. A thread's
audience is its first message's (a thread is one place, and every message of it is stored with
that place's audience); a thread stored before messages kept their audience gets
`legacy_audience`.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from redis.exceptions import ResponseError
from redisvl.utils.token_escaper import TokenEscaper

from memory.keys import InvalidName, messages_key, papers_key, threads_key, validate_thread
from memory.scope import PUBLIC, Scope, legacy_audience
from memory.stores.base import decode
from memory.stores.episodic import Episode
from memory.stores.episodic_text import MAX_PARTS, stems
from memory.stores.knowledge_base import base_arxiv_id
from memory.stores.records import ThreadRecordStore, UnknownRecord
from memory.stores.stopwords import STOPWORDS
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry

PAGE_SIZE = 100  # messages per page of a thread
TITLE_CHARS = 80
HEAD = 3  # messages read from a thread's start to find its audience and its title
# A search result without the query's words is listed only this similar to the query (cosine):
# nearest-neighbour search returns k results however unrelated. With MiniLM, unrelated messages
# stay under 0.35 and paraphrases ("when do we ship the search backend" of "deploy the new
# retrieval service on Friday") reach 0.45 to 0.55.
SIMILARITY_FLOOR = 0.4
NAMES_LOOKED_UP = 200  # distinct user ids whose display names one page looks up, at most
_WORD = re.compile(r"\w+")
_TAG = TokenEscaper(re.compile(TokenEscaper.TAG_ESCAPED_CHARS))

Audiences = Collection[str] | None  # what a reader may see; None: everything (an admin)


@dataclass(frozen=True, slots=True)
class Reader(Scope):
    """A tenant-wide place that sees exactly `seen` (with `everything`, whatever exists): the
    stores' reads take a `Scope`, and a reader of the page may see many places at once."""

    seen: tuple[str, ...] = (PUBLIC,)
    everything: bool = False

    @property
    def audiences(self) -> tuple[str, ...]:
        return self.seen

    def can_see(self, audience: str | None) -> bool:
        return self.everything or (audience or PUBLIC) in self.seen


def sees(audiences: Audiences, audience: str) -> bool:
    return audiences is None or audience in audiences


@dataclass(frozen=True)
class Relevance:
    """Whether a text holds the query's words: a word of the text begins with one of them (or
    with a stem of one, `benchmark` for `benchmarking`); a two-letter word must match whole.
    Stopwords do not count: "the paper" is not a match for every message with "the"."""

    words: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, query: str) -> Relevance:
        words = sorted({w for w in _WORD.findall(query.lower()) if w not in STOPWORDS})
        prefixes = [w for w in words if len(w) > 2] + stems(words)
        return cls(frozenset(words), tuple(dict.fromkeys(prefixes)))

    def mentioned_in(self, text: str) -> bool:
        found = set(_WORD.findall(text.lower()))
        return bool(found & self.words) or any(w.startswith(self.prefixes) for w in found)


def channel_of(thread: str) -> str:
    """The channel a thread id names (`slack:<team>:<channel>:<ts>`, `discord:<guild>:<channel>`,
    `discord:dm:<channel>`), or "" (a terminal's thread)."""
    parts = thread.split(":")
    if parts[0] == "slack" and len(parts) >= 4:
        return parts[2]
    if parts[0] == "discord" and len(parts) >= 3:
        return parts[2]
    return ""


def _split_ids(value: Any) -> list[str]:
    """A provenance field: comma-separated ids (a tag field), or a JSON list."""
    text = (decode(value) or "").strip()
    if text.startswith("["):
        try:
            return [str(v) for v in json.loads(text)]
        except ValueError:
            pass
    return [v.strip() for v in text.split(",") if v.strip()]


@dataclass
class MessageView:
    """A stored message as the page shows it; a forgotten one keeps its place, emptied."""

    seq: int
    id: str
    role: str
    author: str
    author_name: str
    content: str
    timestamp: float
    summary_id: str
    audience: str
    forgotten: bool = False

    @property
    def speaker(self) -> str:
        if self.role == "user":
            return self.author_name or self.author or "user"
        return self.role

    @classmethod
    def parse(cls, raw: Any, seq: int, thread: str) -> MessageView:
        data = json.loads(raw)
        content = data.get("content") or ""
        forgotten = bool(data.get("forgotten")) or not content.strip()  # a tombstone
        return cls(
            seq=seq, id=str(data.get("id", "")), role=str(data.get("role", "user")),
            author=str(data.get("author") or ""), author_name=str(data.get("author_name") or ""),
            content="" if forgotten else content, timestamp=float(data.get("timestamp") or 0.0),
            summary_id=str(data.get("summary_id") or ""),
            audience=data.get("audience") or legacy_audience(thread), forgotten=forgotten,
        )  # fmt: skip


@dataclass
class ThreadInfo:
    id: str
    audience: str
    channel: str
    last_active: float
    messages: int
    title: str
    started: float = 0.0


@dataclass
class ThreadPage:
    thread: ThreadInfo
    messages: list[MessageView]  # this page's, oldest first
    page: int  # 1-based; page 1 holds the oldest messages
    pages: int
    summaries: list[Summary]  # every summary of the thread, top-level ones first
    tool_logs: list[ToolLogEntry]  # the calls made while this page's messages were said


@dataclass
class PaperInfo:
    arxiv_id: str
    title: str
    authors: list[str]
    published: str
    categories: list[str]
    abstract: str
    url: str
    source: str
    chunks: int
    ingested_at: float
    audience: str = PUBLIC  # a tenant's knowledge base is shared by the whole team

    @classmethod
    def of(cls, record: dict[str, Any]) -> PaperInfo:
        arxiv_id = str(record.get("arxiv_id", ""))
        return cls(
            arxiv_id=arxiv_id, title=str(record.get("title", "")),
            authors=list(record.get("authors") or []), published=str(record.get("published", "")),
            categories=list(record.get("categories") or []),
            abstract=str(record.get("abstract", "")),
            url=str(record.get("url") or f"https://arxiv.org/abs/{arxiv_id}"),
            source=str(record.get("source", "")), chunks=int(record.get("chunks") or 0),
            ingested_at=float(record.get("ingested_at") or 0.0),
        )  # fmt: skip


@dataclass
class PassageView:
    arxiv_id: str
    title: str
    section: str
    chunk_index: int
    content: str
    url: str = ""
    audience: str = PUBLIC


@dataclass
class EntityInfo:
    id: str  # the key after the tenant's index prefix
    name: str
    type: str
    description: str
    updated_at: float
    audience: str
    threads: list[str] = field(default_factory=list)  # where it was learned
    authors: list[str] = field(default_factory=list)  # from whose messages


@dataclass
class WorkflowInfo:
    id: str  # the key after the tenant's index prefix (its digest)
    text: str
    created_at: float
    audience: str
    thread: str = ""
    authors: list[str] = field(default_factory=list)


@dataclass
class SearchResults:
    messages: list[Episode]  # each with its thread, channel, author, date and audience
    passages: list[PassageView]


class Browse:
    """Reads for the memory page, over the stores of one `MemoryManager`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis

    @staticmethod
    def reader(tenant: str, audiences: Audiences, thread: str = "") -> Reader:
        if audiences is None:
            return Reader(tenant, thread, everything=True)
        return Reader(tenant, thread, seen=tuple(sorted(set(audiences))))

    # -- threads -------------------------------------------------------------------------------

    async def threads(self, tenant: str, audiences: Audiences) -> list[ThreadInfo]:
        """The tenant's threads that `audiences` may see, latest activity first."""
        listed = await self.memory.conversation.threads(tenant)
        keys = []
        for thread, _ in listed:
            try:
                keys.append(messages_key(tenant, thread))
            except InvalidName:
                keys.append("")
        pipe = self.redis.pipeline(transaction=False)
        for key in filter(None, keys):
            pipe.llen(key)
            pipe.lrange(key, 0, HEAD - 1)
        replies = iter(await pipe.execute())
        out = []
        for (thread, score), key in zip(listed, keys, strict=True):
            if not key:
                continue
            count, head = next(replies), next(replies)
            info = self._info(thread, int(count), head, score)
            if info is not None and sees(audiences, info.audience):
                out.append(info)
        return out

    async def thread_audience(self, tenant: str, thread: str) -> str | None:
        """Who may see a thread, or None when it holds no messages (or cannot exist)."""
        try:
            head = await self.redis.lrange(messages_key(tenant, thread), 0, HEAD - 1)
        except InvalidName:
            return None
        info = self._info(thread, len(head), head, 0.0)
        return info.audience if info else None

    async def thread_info(self, tenant: str, thread: str) -> ThreadInfo | None:
        """A thread as the overview lists it (title, audience, size), or None when it holds no
        messages (or cannot exist)."""
        try:
            key = messages_key(tenant, thread)
        except InvalidName:
            return None
        count, head, score = await asyncio.gather(
            self.redis.llen(key),
            self.redis.lrange(key, 0, HEAD - 1),
            self.redis.zscore(threads_key(tenant), thread),
        )
        return self._info(thread, int(count), head, float(score or 0.0))

    def _info(self, thread: str, count: int, head: list[Any], score: float) -> ThreadInfo | None:
        if not count or not head:
            return None
        messages = [MessageView.parse(raw, i, thread) for i, raw in enumerate(head)]
        first = next((m for m in messages if m.role == "user" and not m.forgotten), None)
        title = " ".join(first.content.split()) if first else "(forgotten)"
        if len(title) > TITLE_CHARS:
            title = title[: TITLE_CHARS - 1].rstrip() + "…"
        return ThreadInfo(
            id=thread, audience=messages[0].audience, channel=channel_of(thread),
            last_active=score or messages[-1].timestamp, messages=count,
            title=title, started=messages[0].timestamp,
        )  # fmt: skip

    async def thread(
        self, tenant: str, thread: str, audiences: Audiences, page: int | None = None
    ) -> ThreadPage | None:
        """One page of a thread (the last, its newest messages, by default), with its summaries
        and the tool calls of that page; None when it is empty, unknown or not to be seen."""
        try:
            key = messages_key(tenant, validate_thread(thread))
        except InvalidName:
            return None
        count, head, score = await asyncio.gather(
            self.redis.llen(key),
            self.redis.lrange(key, 0, HEAD - 1),
            self.redis.zscore(threads_key(tenant), thread),
        )
        info = self._info(thread, int(count), head, float(score or 0.0))
        if info is None or not sees(audiences, info.audience):
            return None
        pages = max(1, math.ceil(info.messages / PAGE_SIZE))
        page = pages if page is None else min(max(1, page), pages)
        start = (page - 1) * PAGE_SIZE
        rows, after = await asyncio.gather(
            self.redis.lrange(key, start, start + PAGE_SIZE - 1),
            self.redis.lindex(key, start + PAGE_SIZE),
        )
        messages = [MessageView.parse(raw, start + i, thread) for i, raw in enumerate(rows)]
        since = messages[0].timestamp if messages and page > 1 else float("-inf")
        until = MessageView.parse(after, 0, thread).timestamp if after else float("inf")
        scope = self.reader(tenant, audiences, thread)
        summaries, logs = await asyncio.gather(
            self._summaries(scope), self._tool_logs(scope, since, until)
        )
        return ThreadPage(info, messages, page, pages, summaries, logs)

    async def message(
        self, tenant: str, thread: str, message_id: str, audiences: Audiences
    ) -> MessageView | None:
        """A message of a thread `audiences` may see, found by its id."""
        try:
            rows = await self.redis.lrange(messages_key(tenant, thread), 0, -1)
        except InvalidName:
            return None
        needle = f'"id":{json.dumps(message_id)}'
        for seq, raw in enumerate(rows):
            if needle in decode(raw):
                message = MessageView.parse(raw, seq, thread)
                if message.id == message_id:
                    return message if sees(audiences, message.audience) else None
        return None

    async def _summaries(self, scope: Reader) -> list[Summary]:
        """The thread's summaries: the top-level ones, then those merged into them."""
        store = self.memory.summaries
        found = [s for s in await self._get(store, scope, await store.ids(scope)) if s]
        known = {s.id for s in found}
        level = [c for s in found for c in s.children if c not in known]
        while level:
            children = [s for s in await self._get(store, scope, level) if s]
            known |= {c.id for c in children}
            found += children
            level = [c for s in children for c in s.children if c not in known]
        return found

    async def _tool_logs(self, scope: Reader, since: float, until: float) -> list[ToolLogEntry]:
        """The thread's tool calls made from `since` until before `until`, oldest first."""
        store = self.memory.tool_logs
        high = "+inf" if until == float("inf") else f"({until!r}"
        low = "-inf" if since == float("-inf") else repr(since)
        ids = [
            decode(i) for i in await self.redis.zrangebyscore(store.thread_index(scope), low, high)
        ]
        return [entry for entry in await self._get(store, scope, ids) if entry]

    async def _get(self, store: ThreadRecordStore, scope: Reader, ids: list[str]) -> list[Any]:
        """The records of these ids that `scope` may see (None for the others), read at once,
        each with its audience filled in (a legacy record has none)."""
        return list(await asyncio.gather(*(self._one(store, scope, i) for i in ids)))

    @staticmethod
    async def _one(store: ThreadRecordStore, scope: Reader, record_id: str) -> Any:
        try:
            record = await store.get(scope, record_id)
        except UnknownRecord:
            return None
        record.audience = record.audience or legacy_audience(record.thread_id)
        return record

    async def summary(self, tenant: str, summary_id: str, audiences: Audiences) -> Summary | None:
        return await self._record(self.memory.summaries, tenant, summary_id, audiences)

    async def tool_log(self, tenant: str, log_id: str, audiences: Audiences) -> ToolLogEntry | None:
        return await self._record(self.memory.tool_logs, tenant, log_id, audiences)

    async def _record(
        self, store: ThreadRecordStore, tenant: str, record_id: str, audiences: Audiences
    ) -> Any:
        return await self._one(store, self.reader(tenant, audiences), record_id)

    # -- papers --------------------------------------------------------------------------------

    async def papers(self, tenant: str) -> list[PaperInfo]:
        """The tenant's papers, latest saved first (the whole team's)."""
        records = await self.memory.knowledge_base.papers(Scope(tenant))
        return [PaperInfo.of(r) for r in reversed(records)]

    async def paper_info(self, tenant: str, arxiv_id: str) -> PaperInfo | None:
        """A paper's entry, without its passages."""
        raw = await self.redis.hget(papers_key(tenant), base_arxiv_id(arxiv_id))
        return PaperInfo.of(json.loads(raw)) if raw else None

    async def paper(self, tenant: str, arxiv_id: str) -> tuple[PaperInfo, list[PassageView]] | None:
        """A paper and its passages, in order."""
        paper = await self.paper_info(tenant, arxiv_id)
        if paper is None:
            return None
        kb, fields = self.memory.knowledge_base, ["section", "chunk_index", "content"]
        pipe = self.redis.pipeline(transaction=False)
        for i in range(paper.chunks):
            pipe.hmget(kb.chunk_key(tenant, paper.arxiv_id, i), fields)
        passages = [
            PassageView(paper.arxiv_id, paper.title, decode(section) or "",
                        int(float(decode(index) or i)), decode(content) or "", paper.url)
            for i, (section, index, content) in enumerate(await pipe.execute())
            if content is not None
        ]  # fmt: skip
        return paper, passages

    # -- workflows and entities ------------------------------------------------------------------

    async def entities(
        self, tenant: str, audiences: Audiences, limit: int = 500
    ) -> list[EntityInfo]:
        """The entities `audiences` may see, latest updated first."""
        store = self.memory.entities
        fields = ["name", "type", "description", "updated_at", "audience", "threads", "authors"]
        rows = await self._rows(store, tenant, audiences, fields, limit, "updated_at")
        prefix = store.key_prefix(tenant)
        return [
            EntityInfo(
                id=r["id"][len(prefix) :], name=decode(r.get("name")) or "",
                type=decode(r.get("type")) or "", description=decode(r.get("description")) or "",
                updated_at=float(decode(r.get("updated_at")) or 0.0),
                audience=decode(r.get("audience")) or PUBLIC,
                threads=_split_ids(r.get("threads")), authors=_split_ids(r.get("authors")),
            )
            for r in rows
            if r["id"].startswith(prefix)
        ]  # fmt: skip

    async def workflows(
        self, tenant: str, audiences: Audiences, limit: int = 500
    ) -> list[WorkflowInfo]:
        """The workflows `audiences` may see, latest first."""
        store = self.memory.workflows
        fields = ["text", "created_at", "audience", "thread", "authors"]
        rows = await self._rows(store, tenant, audiences, fields, limit, "created_at")
        prefix = store.key_prefix(tenant)
        return [
            WorkflowInfo(
                id=r["id"][len(prefix) :], text=decode(r.get("text")) or "",
                created_at=float(decode(r.get("created_at")) or 0.0),
                audience=decode(r.get("audience")) or PUBLIC,
                thread=decode(r.get("thread")) or "", authors=_split_ids(r.get("authors")),
            )
            for r in rows
            if r["id"].startswith(prefix)
        ]  # fmt: skip

    async def entity(self, tenant: str, entity_id: str, audiences: Audiences) -> EntityInfo | None:
        """One entity by its id, when `audiences` may see it."""
        fields = ["name", "type", "description", "updated_at", "audience", "threads", "authors"]
        row = await self._hash(self.memory.entities.key_of(tenant, entity_id), fields)
        if row is None or not sees(audiences, decode(row["audience"]) or PUBLIC):
            return None
        return EntityInfo(
            id=entity_id, name=decode(row["name"]) or "", type=decode(row["type"]) or "",
            description=decode(row["description"]) or "",
            updated_at=float(decode(row["updated_at"]) or 0.0),
            audience=decode(row["audience"]) or PUBLIC, threads=_split_ids(row["threads"]),
            authors=_split_ids(row["authors"]),
        )  # fmt: skip

    async def workflow(
        self, tenant: str, workflow_id: str, audiences: Audiences
    ) -> WorkflowInfo | None:
        """One workflow by its id, when `audiences` may see it."""
        fields = ["text", "created_at", "audience", "thread", "authors"]
        row = await self._hash(self.memory.workflows.key_of(tenant, workflow_id), fields)
        if row is None or not sees(audiences, decode(row["audience"]) or PUBLIC):
            return None
        return WorkflowInfo(
            id=workflow_id, text=decode(row["text"]) or "",
            created_at=float(decode(row["created_at"]) or 0.0),
            audience=decode(row["audience"]) or PUBLIC, thread=decode(row["thread"]) or "",
            authors=_split_ids(row["authors"]),
        )  # fmt: skip

    async def _hash(self, key: str, fields: list[str]) -> dict[str, Any] | None:
        values = await self.redis.hmget(key, fields)
        if all(v is None for v in values):
            return None
        return dict(zip(fields, values, strict=True))

    async def _rows(
        self, store: Any, tenant: str, audiences: Audiences, fields: list[str], limit: int, by: str
    ) -> list[dict[str, Any]]:
        if audiences is not None and not audiences:
            return []  # an empty tag filter would match everything
        scope = self.reader(tenant, audiences)
        where = None if audiences is None else store.audience_filter(scope)
        rows = await store._list(tenant, fields, limit, where, sort_by=(by, "DESC"))
        return [r for r in rows if scope.can_see(decode(r.get("audience")) or PUBLIC)]

    # -- search --------------------------------------------------------------------------------

    async def search(
        self, tenant: str, query: str, audiences: Audiences, k: int = 10
    ) -> SearchResults:
        """Messages (episodic memory, as `search_conversations` finds them, over everything
        `audiences` may see) and passages of the knowledge base that bear on `query`: each
        holds one of its words (`Relevance`) or is at least SIMILARITY_FLOOR similar to it."""
        query = query.strip()
        if not query:
            return SearchResults([], [])
        if audiences is None:
            scope = Reader(tenant, seen=await self._episode_audiences(tenant), everything=True)
        elif not audiences:
            scope = None
        else:
            scope = self.reader(tenant, audiences)
        vector = (await self.memory.embedder.embed([query]))[0]
        episodes = self.memory.episodes.search(scope, query, vector, k=k) if scope else _none()
        found, passages = await asyncio.gather(
            episodes, self.memory.knowledge_base.search(Scope(tenant), query, vector, k=k)
        )
        relevance, store, kb = Relevance.of(query), self.memory.episodes, self.memory.knowledge_base
        messages = [e for e in found if sees(audiences, e.audience)]
        unmatched = [e for e in messages if not relevance.mentioned_in(f"{e.author_name} {e.text}")]
        similar = await self._similarities(
            store.VECTOR_FIELD, vector,
            [[store.key(tenant, e.id), *(store.part_key(tenant, e.id, n) for n in range(MAX_PARTS))]
             for e in unmatched],
        )  # fmt: skip
        far = {e.id for e, s in zip(unmatched, similar, strict=True) if s < SIMILARITY_FLOOR}
        views = [
            PassageView(p.arxiv_id, p.title, p.section, p.chunk_index, p.content, p.url)
            for p in passages
        ]
        unmatched_passages = [
            p for p in views if not relevance.mentioned_in(f"{p.title} {p.section} {p.content}")
        ]
        similar = await self._similarities(
            kb.VECTOR_FIELD, vector,
            [[kb.chunk_key(tenant, p.arxiv_id, p.chunk_index)] for p in unmatched_passages],
        )  # fmt: skip
        far |= {
            f"{p.arxiv_id}#{p.chunk_index}"
            for p, s in zip(unmatched_passages, similar, strict=True)
            if s < SIMILARITY_FLOOR
        }
        return SearchResults(
            [e for e in messages if e.id not in far],
            [p for p in views if f"{p.arxiv_id}#{p.chunk_index}" not in far],
        )

    async def _similarities(
        self, field_name: str, vector: np.ndarray, groups: list[list[str]]
    ) -> list[float]:
        """For each group of keys (a message and its parts), the best cosine of their stored
        vectors to `vector` (-1 when none is stored, or of another model's size)."""
        if not groups:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for keys in groups:
            for key in keys:
                pipe.hget(key, field_name)
        replies = iter(await pipe.execute())
        out = []
        for keys in groups:
            best = -1.0
            for raw in (next(replies) for _ in keys):
                if raw is None or len(raw) != vector.size * 4:  # float32
                    continue
                best = max(best, float(np.frombuffer(raw, dtype=np.float32) @ vector))
            out.append(best)
        return out

    # -- people --------------------------------------------------------------------------------

    async def names(self, tenant: str, users: Iterable[str]) -> dict[str, str]:
        """The display names of these user ids, as their messages in episodic memory carry
        them (one tag lookup each, at once); an id without a message there is left out."""
        wanted = sorted({u for u in users if u})[:NAMES_LOOKED_UP]
        if not wanted:
            return {}
        index = self.memory.episodes.index_name(tenant)
        try:
            replies = await asyncio.gather(*(
                self.redis.execute_command(
                    "FT.SEARCH", index, f"@author:{{{_TAG.escape(user)}}}",
                    "RETURN", 1, "author_name", "LIMIT", 0, 1, "DIALECT", 2,
                ) for user in wanted
            ))  # fmt: skip
        except ResponseError:  # no message indexed yet: the index does not exist
            return {}
        out = {}
        for user, reply in zip(wanted, replies, strict=True):
            name = _first_field(reply, "author_name")
            if name:
                out[user] = name
        return out

    async def _episode_audiences(self, tenant: str) -> tuple[str, ...]:
        """Every audience episodic memory holds messages of (what an admin's search covers)."""
        index = self.memory.episodes.index_name(tenant)
        try:
            reply = await self.redis.execute_command("FT.TAGVALS", index, "audience")
        except ResponseError:  # no message indexed yet: the index does not exist
            return (PUBLIC,)
        return tuple(sorted({PUBLIC, *(decode(v) for v in reply)}))


async def _none() -> list[Episode]:
    return []


def _first_field(reply: Any, name: str) -> str:
    """A field of FT.SEARCH's first row (RESP2 or RESP3), decoded; "" when there is none."""
    if isinstance(reply, dict):
        rows = reply.get(b"results") or reply.get("results") or [{}]
        fields = rows[0].get(b"extra_attributes") or rows[0].get("extra_attributes") or {}
        values = {decode(k): v for k, v in fields.items()}
    else:
        if not reply or len(reply) < 3 or not isinstance(reply[2], list):
            return ""
        row = reply[2]
        values = {decode(k): v for k, v in zip(row[::2], row[1::2], strict=True)}
    return (decode(values.get(name)) or "").strip()
