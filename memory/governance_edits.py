"""A person's edit of their message on Slack or Discord: memory then holds the new text only.

- The note (`note`, `latest`): the latest text of an edited message and when it was edited,
  kept a day by its source (its platform id), so a turn for it still queued runs with that
  text (adapters/spine.py), and a turn that stored the old text meanwhile, or saved its record
  after the edit was followed, queues the edit again (bot/turns.py). A note is written only
  for a message not deleted on the platform, and never over a newer edit's (one script).
- `follow`: each stored message of that source gets the new text in its place, by
  compare-and-set (same position, same id), as a tombstone is written, with the edit's time in
  its metadata: an older edit arriving late (a platform's retry) never rolls a newer one back.
  Then its old episodic documents are deleted at once (a message has at most 1 + MAX_PARTS:
  the erasing hash is not used, its background purge would delete the new text's documents,
  stored under the same id), the tool logs that showed it and the cached vectors of its old
  texts go, the summaries over it are rewritten from the messages as they now are
  (`compact_note`), as a forget does, its turn record's question takes the new text, the
  entity pieces its old text taught go and its workflow's QUERY line says the new text
  (memory/governance_learned.py). The caller indexes the returned messages with their new
  text; a queued indexing task still carrying the old text is skipped, or takes what it
  wrote out again (memory/stores/conversation.py `still_holds` compares texts).
- Before a message's text is replaced, its old text is kept in the note until the caller is
  `done`: a run again after a crash half-way finds it and finishes the clean-up. The note's
  latest text stays its day (a turn that ends later queues the edit again while it is there),
  unless the message is forgotten: erasures drop the notes of what they erase.
- Not followed: a message never stored (one read, no lock), a tombstone or a message deleted
  on the platform (forgotten stays forgotten), the same text, an empty or too long one (an
  edit to nothing is a deletion: the adapters queue it as one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from memory.governance_erasure import Busy
from memory.governance_learned import Learned
from memory.governance_purge import Purge, message_texts
from memory.governance_threads import RETRIES, ThreadEraser, Threads
from memory.keys import deleted_message_key, edited_message_key
from memory.scope import Scope
from memory.stores.base import decode
from memory.stores.conversation import MAX_MESSAGE_CHARS, Message
from memory.text import clean_text

EDITED_NOTE_SECONDS = 24 * 3600  # how long an edit waits for a queued turn of its message
LATEST, AT = "text", "at"  # the note's latest text and its edit time; the others: OLD + id…
OLD = "old:"
EDITED_AT = "edited_at"  # a followed message's metadata: the time of the edit it holds

# KEYS: the deletion note, the edit note; ARGV: text, edit time, seconds to keep. Keeps the
# text unless the message was deleted on the platform (0) or a newer edit is noted (1).
_NOTE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local at = redis.call('HGET', KEYS[2], 'at')
if at and tonumber(at) > tonumber(ARGV[2]) then return 1 end
redis.call('HSET', KEYS[2], 'text', ARGV[1], 'at', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Change:
    """What the platform said of one of its messages in the last day: deleted, or its latest
    edit (text, time) noted."""

    deleted: bool = False
    latest: tuple[str, float] | None = None

    def edited_from(self, text: str) -> str | None:
        """The latest text, when it is not `text` (both as stored: `clean_text`)."""
        if self.latest is None or clean_text(self.latest[0]) == clean_text(text):
            return None
        return clean_text(self.latest[0])


@dataclass
class Followed:
    """What following an edit did: the (thread, message) pairs that now hold the new text,
    to be indexed with it, and the note's fields of the old texts taken out (`Edits.done`)."""

    messages: list[tuple[str, Message]] = field(default_factory=list)
    old_fields: list[str] = field(default_factory=list)


class Edits:
    """Follows platform edits of stored messages. `exclusive` is the tenant's erasure lock
    (`Governance._exclusive`): an edit and an erasure never rewrite a summary at once."""

    def __init__(
        self,
        memory: Any,
        purge: Purge,
        threads: ThreadEraser,
        exclusive: Callable[[str], AbstractAsyncContextManager[None]],
        learned: Learned,
    ) -> None:
        self.memory = memory
        self.learned = learned
        self.redis = memory.redis
        self._purge = purge
        self._threads = threads
        self._exclusive = exclusive
        self._note = memory.redis.register_script(_NOTE_SCRIPT)

    async def note(self, tenant: str, source: str, text: str, at: float) -> bool:
        """Keep `text` for a day as the latest text of the platform's message `source`, edited
        at `at` (not over a newer edit's); False when that message was deleted on the
        platform: nothing to follow."""
        keys = [deleted_message_key(tenant, source), edited_message_key(tenant, source)]
        args = [clean_text(text), repr(float(at)), EDITED_NOTE_SECONDS]
        return bool(await self._note(keys=keys, args=args))

    async def latest(self, tenant: str, source: str) -> tuple[str, float] | None:
        """The latest text of `source` and its edit time, when it was edited on the platform
        in the last day."""
        return _latest(*await self.redis.hmget(edited_message_key(tenant, source), [LATEST, AT]))

    async def change(self, tenant: str, source: str) -> Change:
        """Whether `source` was deleted on the platform in the last day, and its latest edit:
        one round trip (a turn asks before and after it runs)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(deleted_message_key(tenant, source))
            pipe.hmget(edited_message_key(tenant, source), [LATEST, AT])
            deleted, (text, at) = await pipe.execute()
        return Change(bool(deleted), _latest(text, at))

    async def follow(
        self, tenant: str, threads: Iterable[str], source: str, text: str, at: float
    ) -> Followed:
        """Give the user messages stored from `source` in `threads` the text `text` of the
        edit made at `at`, unless they hold a newer edit's, and take their old text out of
        episodic memory, the embedding cache, the summaries over them and their turn record.
        Returns the messages that now hold `text`, to be indexed with it; call `done` once
        that is queued."""
        text = clean_text(text)
        if not text.strip() or len(text) > MAX_MESSAGE_CHARS:
            return Followed()
        threads, read = list(threads), self.memory.conversation.raw_threads
        found = Threads(await read(tenant, threads)).from_source(source)
        if not found:
            return Followed()  # most edits: a message the bot never stored (yet), or forgotten
        async with self._exclusive(tenant):
            # Deleted on the platform? Asked under the lock: a deletion noted before it is seen
            # here; one noted after waits for the lock (`Governance.forget_deleted`), and takes
            # out what this writes.
            if await self.redis.exists(deleted_message_key(tenant, source)):
                return Followed()  # its erasure is queued
            lists = Threads(await read(tenant, threads))  # as they are now, under the lock
            stored = lists.from_source(source)
            if not _stale(stored, text, at) and not await self._old(tenant, source):
                # the same text (an unfurl), a newer one, or followed already: a turn that
                # saved its record after the edit was followed (bot/turns.py queues the
                # edit again) gets the text its question holds
                for _, message in stored:
                    await self.memory.turn_records.edit_question(
                        tenant, message.id, message.content
                    )
                return Followed()
            await self._replace(tenant, lists, source, text, at)
            return await self._clean_up(tenant, lists, source, text)

    async def stored(self, tenant: str, threads: Iterable[str], source: str) -> bool:
        """Whether a person's message of `source` is stored in `threads` (Slack sends an
        edited mention again as a new event: not a new question)."""
        read = await self.memory.conversation.raw_threads(tenant, list(threads))
        return bool(Threads(read).from_source(source))

    async def uncache(self, texts: Iterable[str]) -> None:
        """Drop the cached vectors of texts an edit replaced before they were stored (a turn
        queued with its first text, an indexing task that embedded an old text)."""
        await self._purge.uncache(texts)

    async def done(self, tenant: str, source: str, followed: Followed) -> None:
        """The edited messages are queued for indexing: forget the old texts taken out (not
        those another run noted since, which that run takes out)."""
        if followed.old_fields:
            await self.redis.hdel(edited_message_key(tenant, source), *followed.old_fields)

    async def forget(self, tenant: str, source: str) -> None:
        """Drop the note (the message was deleted on the platform: its texts go)."""
        await self.redis.delete(edited_message_key(tenant, source))

    async def _replace(
        self, tenant: str, lists: Threads, source: str, text: str, at: float
    ) -> None:
        """Write `text` into each message of `source` that says something else (and holds no
        newer edit), in its place (compare-and-set, retried where a summarizer marked it
        meanwhile); each old text is noted first."""
        read = self.memory.conversation.raw_threads
        for _ in range(RETRIES):
            stale = _stale(lists.from_source(source), text, at)
            if not stale:
                return
            await self._keep(tenant, source, {_old_field(m): m.content for _, m in stale})
            changes: dict[str, list[tuple[int, str, str]]] = {}
            for thread, message in stale:
                edited = replace(
                    message, content=text, metadata={**message.metadata, EDITED_AT: at}
                )
                changes.setdefault(thread, []).append(
                    (message.seq, lists.raw[thread][message.seq], edited.to_json())
                )
            conflicts = await self.memory.conversation.replace(tenant, changes)
            lists.update(await read(tenant, list(changes)))  # as written, or as changed
            if not conflicts:
                return
        raise Busy("The message kept changing while its edit was followed; try again.")

    async def _clean_up(self, tenant: str, lists: Threads, source: str, text: str) -> Followed:
        """For the messages of `source` that now say `text` and whose old texts are noted:
        delete their episodic documents, the tool logs that showed them and the old texts'
        cached vectors, and rewrite the summaries over them."""
        now = {m.id: (t, m) for t, m in lists.from_source(source) if m.content == text}
        noted = {f: old for f, old in (await self._old(tenant, source)).items() if old[0] in now}
        old = list(noted.values())
        ids = sorted({i for i, _ in old})
        if not ids:
            return Followed()
        await self.memory.episodes.delete(Scope(tenant), ids)
        await self.memory.tool_logs.forget_showing(tenant, ids)  # the old text shown there
        texts = [t for i, said in old for t in message_texts(replace(now[i][1], content=said))]
        await self._purge.uncache(texts)
        level0 = {now[i][1].summary_id for i in ids} - {""}
        await self._threads.rewrite_summaries(tenant, lists, level0)
        for i in ids:
            await self.memory.turn_records.edit_question(tenant, i, text)
            await self.learned.edited(tenant, i, text)  # the caller queues learning it again
        return Followed([now[i] for i in ids], list(noted))

    async def _old(self, tenant: str, source: str) -> dict[str, tuple[str, str]]:
        """The old texts noted for `source`: {field: (message id, text)}."""
        note = await self.redis.hgetall(edited_message_key(tenant, source))
        olds = {decode(f) or "": decode(v) or "" for f, v in note.items()}
        return {
            f: (f[len(OLD) :].rsplit(":", 1)[0], v) for f, v in olds.items() if f.startswith(OLD)
        }

    async def _keep(self, tenant: str, source: str, fields: dict[str, str]) -> None:
        key = edited_message_key(tenant, source)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.expire(key, EDITED_NOTE_SECONDS)
            await pipe.execute()


def _latest(text: bytes | str | None, at: bytes | str | None) -> tuple[str, float] | None:
    """An edit note's latest text and edit time (None: no edit noted)."""
    return None if text is None else (decode(text) or "", float(decode(at) or 0))


def _old_field(message: Message) -> str:
    """The note's field for one old text of a message (each old text its own: two edits
    followed in one run leave both to be uncached)."""
    digest = hashlib.sha1(message.content.encode("utf-8")).hexdigest()[:12]
    return f"{OLD}{message.id}:{digest}"


def _stale(stored: list[tuple[str, Message]], text: str, at: float) -> list[tuple[str, Message]]:
    """Those of the stored messages that an edit to `text` made at `at` changes: another text,
    and no newer edit's."""
    return [
        (t, m) for t, m in stored
        if m.content != text and float(m.metadata.get(EDITED_AT) or 0) <= at
    ]  # fmt: skip
