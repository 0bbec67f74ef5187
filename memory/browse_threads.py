"""The memory page's reads of threads: the thread list, a page of a thread's messages with its
summaries and tool calls, one message, summary or tool log.

A thread's audience is its first message's (a thread is one place, and every message of it is
stored with that place's audience); a thread stored before messages kept their audience gets
`legacy_audience`. Its title is its first user message the reader may see (a later message of a
place turned private is not shown to those who saw it public), else "(forgotten)".
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

from memory.browse_reader import Audiences, Reader, Reads, sees
from memory.keys import InvalidName, messages_key, threads_key, validate_thread
from memory.scope import legacy_audience
from memory.shorten import shortened
from memory.stores.base import decode
from memory.stores.records import ThreadRecordStore, UnknownRecord
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry

PAGE_SIZE = 100  # messages per page of a thread
TITLE_CHARS = 80
HEAD = 3  # messages read from a thread's start to find its audience and its title


def channel_of(thread: str) -> str:
    """The channel a thread id names (`slack:<team>:<channel>:<ts>`, `discord:<guild>:<channel>`,
    `discord:dm:<channel>`), or "" (a terminal's thread)."""
    parts = thread.split(":")
    if parts[0] == "slack" and len(parts) >= 4:
        return parts[2]
    if parts[0] == "discord" and len(parts) >= 3:
        return parts[2]
    return ""


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


class ThreadReads(Reads):
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
            info = self._info(thread, int(count), head, score, audiences)
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

    async def thread_info(
        self, tenant: str, thread: str, audiences: Audiences = ()
    ) -> ThreadInfo | None:
        """A thread as the overview lists it (title, audience, size), or None when it holds no
        messages (or cannot exist). Its title is taken from messages of the thread's own
        audience or of `audiences` (by default, the thread's own only)."""
        try:
            key = messages_key(tenant, thread)
        except InvalidName:
            return None
        return await self._read_info(tenant, thread, key, audiences)

    async def _read_info(
        self, tenant: str, thread: str, key: str, audiences: Audiences
    ) -> ThreadInfo | None:
        count, head, score = await asyncio.gather(
            self.redis.llen(key),
            self.redis.lrange(key, 0, HEAD - 1),
            self.redis.zscore(threads_key(tenant), thread),
        )
        return self._info(thread, int(count), head, float(score or 0.0), audiences)

    def _info(
        self, thread: str, count: int, head: list[Any], score: float, audiences: Audiences = ()
    ) -> ThreadInfo | None:
        """`audiences`: who reads the title (None: everything); a message of another audience
        than the thread's own is its title only for a reader who may see it."""
        if not count or not head:
            return None
        messages = [MessageView.parse(raw, i, thread) for i, raw in enumerate(head)]
        audience = messages[0].audience

        def may_title(m: MessageView) -> bool:
            shown = m.audience == audience or sees(audiences, m.audience)
            return shown and m.role == "user" and not m.forgotten

        first = next(filter(may_title, messages), None)
        title = shortened(" ".join(first.content.split()), TITLE_CHARS) if first else "(forgotten)"
        return ThreadInfo(
            id=thread, audience=audience, channel=channel_of(thread),
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
        info = await self._read_info(tenant, thread, key, audiences)
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
        # each message is checked too: a place can turn private (a Discord thread made
        # private after its first message), and its later messages carry that audience
        messages = [m for m in messages if sees(audiences, m.audience)]
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

    async def summary(self, tenant: str, summary_id: str, audiences: Audiences) -> Summary | None:
        return await self._record(self.memory.summaries, tenant, summary_id, audiences)

    async def tool_log(self, tenant: str, log_id: str, audiences: Audiences) -> ToolLogEntry | None:
        return await self._record(self.memory.tool_logs, tenant, log_id, audiences)

    # -- a thread's summaries and tool logs -----------------------------------------------------

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

    async def _record(
        self, store: ThreadRecordStore, tenant: str, record_id: str, audiences: Audiences
    ) -> Any:
        return await self._one(store, self.reader(tenant, audiences), record_id)
