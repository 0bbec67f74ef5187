"""What a forgotten text leaves outside its own store: its episodic documents and its cached
vectors.

A forgotten message's episodic entries (the message and its parts) are hidden from every read
at once (`hide`: the tenant's erasing hash, which `EpisodicStore._fetch` consults in the same
round trip) and deleted in the background (`purge`): deleting a vector-index document repairs
the HNSW graph around it, about half a millisecond each, too slow to wait for when a person's
ten thousand messages go. A purge marks the tenant (`purging_key`, expiring in a few minutes);
what a stopped process (or a Redis error) left is purged by the tenant's next erasure, or by any
live process's leftover purge (memory/governance.py `purge_leftovers`, on the retention tick)
once no purge has marked it for PURGING_SECONDS; `settle` waits for this process's purges
(`MemoryManager.close` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from memory.embeddings import cache_keys
from memory.keys import (
    deleted_message_key,
    edited_message_key,
    erasing_key,
    erasing_pattern,
    purging_key,
    tenant_of_key,
)
from memory.stores.base import decode, delete_keys
from memory.stores.conversation import Message
from memory.stores.episodic import Episode, indexed
from memory.stores.episodic_text import MAX_PARTS

SCAN_COUNT = 10_000  # messages marked hidden per HSET
DELETED_NOTE_SECONDS = 24 * 3600  # how long a platform deletion waits for a queued turn
DELETED_NOTE = "deleted"  # the note's member that says so (the others: ids of messages found)
PURGE_BATCH = 500  # episodic documents deleted per round (a few hundred ms of Redis time)
PURGING_SECONDS = 300  # a purge's mark lives this long, renewed each round: then it stopped

log = logging.getLogger(__name__)


def message_texts(message: Message) -> list[str]:
    """Every text of a message that may have been embedded (and cached): the message as a
    question, and as episodic memory embeds it and its parts."""
    episode = indexed(Episode("", "", author=message.author, author_name=message.author_name,
                              role=message.role, text=message.content))  # fmt: skip
    return [message.content, episode.embedding_text, *episode.part_texts()]


def queue_deleted_note(pipe: Any, tenant: str, source: str, ids: Iterable[str] = ()) -> None:
    """Queue on `pipe` the note that the platform's message `source` was deleted, kept a day
    (with the ids of the messages stored from it, when known): a turn for it still queued is
    then not run, and a later edit of it keeps nothing. The one writer of that note."""
    key = deleted_message_key(tenant, source)
    pipe.sadd(key, DELETED_NOTE, *ids)
    pipe.expire(key, DELETED_NOTE_SECONDS)


def erasing_parts(ids: Iterable[str], said: dict[str, list[str]]) -> dict[str, int]:
    """What the erasing hash holds for each message: how many parts its texts (`said`, see
    `message_texts`) have; every possible one for a message whose text is gone already."""
    return {i: len(said[i]) - 2 if i in said else MAX_PARTS for i in ids}


class Purge:
    """Hides forgotten messages' episodic entries, deletes them in the background, and deletes
    the cached vectors of forgotten texts."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._running: dict[str, asyncio.Task] = {}
        self._dirty: set[str] = set()  # tenants with episodic documents to purge

    async def hide(self, tenant: str, ids: list[str], said: dict[str, list[str]]) -> int:
        """Hide messages' episodic entries from every read now, to be deleted by `purge`: each
        message's document and its parts, as many as its texts (`said`, see `message_texts`)
        have; every possible one for a message whose text is gone already. Returns how many
        messages were indexed."""
        if not ids:
            return 0
        found = await self.indexed(tenant, ids)
        items = list(erasing_parts(ids, said).items())
        for start in range(0, len(items), SCAN_COUNT):
            await self.redis.hset(
                erasing_key(tenant), mapping=dict(items[start : start + SCAN_COUNT])
            )
        return len(found)

    async def indexed(self, tenant: str, ids: list[str]) -> set[str]:
        """Those of `ids` with a document in episodic memory (one EXISTS each, pipelined)."""
        store = self.memory.episodes
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.exists(store.key(tenant, i))
        return {i for i, n in zip(ids, await pipe.execute(), strict=True) if n}

    async def uncache(self, texts: Iterable[str]) -> int:
        """Delete the cached vectors of `texts` (memory/embeddings.py `CachedEmbedder`: keyed
        by model and the SHA-1 of the cleaned text); how many there were."""
        keys = cache_keys(self.memory.embedder.model_name, texts)
        return await delete_keys(self.redis, keys) if keys else 0

    async def close_sources(self, tenant: str, messages: Iterable[Message]) -> None:
        """Messages being forgotten: the platform's messages they were stored from are noted
        as deleted for a day, with their ids, as a platform deletion is (a later edit of one
        keeps nothing, a turn for it still queued is not run, and one running finds its record
        by the ids when it ends: a tombstone keeps no source to find it by), and
        the notes of their edits go (memory/governance_edits.py: their latest text, and old
        texts of an edit under way)."""
        ids_of: dict[str, list[str]] = {}  # source -> the ids of the messages stored from it
        for message in messages:
            if source := message.metadata.get("source"):
                ids_of.setdefault(source, []).append(message.id)
        if not ids_of:
            return
        async with self.redis.pipeline(transaction=True) as pipe:  # the tenant's slot
            for source, ids in ids_of.items():  # noted first: an edit noted meanwhile sees it
                # with the ids: a turn that saves its record after this (bot/turns.py
                # `changed_meanwhile`) queues `forget_deleted`, which finds them here
                queue_deleted_note(pipe, tenant, source, ids)
                pipe.delete(edited_message_key(tenant, source))
            await pipe.execute()

    async def purge(self, tenant: str) -> int:
        """Delete the episodic documents of forgotten messages (hidden from reads until then),
        a batch at a time so other commands run in between; returns how many messages' went.
        Also finishes what a stopped process left."""
        store, key, done = self.memory.episodes, erasing_key(tenant), 0
        while rows := await self.redis.hrandfield(key, PURGE_BATCH, withvalues=True):
            await self.redis.set(purging_key(tenant), 1, ex=PURGING_SECONDS)  # at it
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

    async def leftovers(self) -> list[str]:
        """The tenants with forgotten messages' documents still to purge (a scan: for the
        hourly leftover purge, not for turns)."""
        found = [decode(k) async for k in self.redis.scan_iter(match=erasing_pattern(), count=1000)]
        return sorted({tenant for tenant in map(tenant_of_key, found) if tenant})

    async def claim(self, tenant: str) -> bool:
        """Mark the tenant as being purged, unless a purge marked it in the last
        PURGING_SECONDS (it is at it, or stopped only just)."""
        return bool(await self.redis.set(purging_key(tenant), 1, nx=True, ex=PURGING_SECONDS))

    def schedule(self, tenant: str) -> None:
        """Purge the tenant in the background (once more, if a purge of it is running)."""
        self._dirty.add(tenant)
        running = self._running.get(tenant)
        if running is None or running.done():
            self._running[tenant] = asyncio.create_task(self._while_dirty(tenant))

    async def settle(self) -> None:
        """Wait for this process's purges (before it exits; benchmarks; tests)."""
        while running := [t for t in self._running.values() if not t.done()]:
            await asyncio.gather(*running, return_exceptions=True)

    async def _while_dirty(self, tenant: str) -> None:
        while tenant in self._dirty:
            self._dirty.discard(tenant)
            try:
                await self.purge(tenant)
            except Exception:  # hidden meanwhile; purged by the next erasure or leftover purge
                log.exception("purging the forgotten episodic entries of %s failed", tenant)
                return
