"""Channels and threads deleted on Slack or Discord: each of their threads is forgotten whole, as
`Governance.forget_thread` does (messages, summaries, tool logs, episodic entries, cached
vectors, presence, turn records, private PDFs), and so is what the place itself kept: its topic
watches (a digest cannot be posted to a place that is gone, and no one can resume it there),
Slack's latest thread per person in the channel, Discord's record of the threads under it.

- Which threads: a Slack thread's id names its channel (`slack:<team>:<channel>:<ts>`), so the
  tenant's threads, and those with turns queued, are scanned for the prefix. A Discord thread's
  id names only itself: the adapter records the threads the bot takes part in under each
  channel (`note_thread`); a deleted channel's are those and the channel's own conversation.
- Turns there: a turn still queued cannot be answered (its post fails) and must store nothing.
  Before the threads go, the place and each thread are noted as deleted for a day (a Slack
  thread not in memory yet is found by its channel's note), and so is the message of each turn
  queued or running there (`queue_deleted_note`): a queued turn is then skipped
  (adapters/spine.py), and a running one, which may store its answer after the erasure, ends by
  queueing its message's erasure, which finds the thread noted and forgets it whole again
  (`Governance.forget_deleted`).
- Nothing there (`holds_nothing`, and no watch there): most Discord thread deletions are of
  threads the bot never took part in (every one in a server arrives), so a few lookups settle
  them, without the tenant's erasure lock or a scan of its PDFs. Run again (a redelivered
  event, a retried task), a deletion finds nothing left, and so returns there too.
- A Discord thread forgotten whole any other way (Forget thread, a person's erasure, retention:
  `ThreadEraser.erase_unchanged`) leaves its channel's record (`unlist`): the thread id does not
  name its channel, so `note_thread` also maps each thread to its channel
  (`thread_channels_key`). A thread with a turn queued or running (its answer will be stored),
  or stored again since, stays listed; so does one its place's deletion is erasing (a run of it
  again after a crash must find it, and its watches). A thread recorded before the map existed,
  or mapped to no channel (a channel's own conversation), stays an id in its channel's record.
- Watches removed with their place: they are found (`watches_in`, read once per deletion) before
  the records that find them go, and `clear` hands them to its caller's `removing` (the bot
  queues a durable notice to each creator: bot/watch_removals.py), then drops the place's
  records and the watches; run again after a crash in between, the deletion finds and hands
  them again (the notice is said once).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from memory.keys import (
    busy_threads_key,
    deleted_thread_key,
    erased_tenant_key,
    joined_key,
    last_thread_key,
    messages_key,
    place_threads_key,
    thread_channels_key,
    threads_key,
    turn_queue_key,
    turn_running_key,
    validate_tenant,
    watch_removed_told_key,
)
from memory.stores.base import decode, delete_keys
from memory.stores.watches import Watch, WatchStore

log = logging.getLogger(__name__)

PLACE_NOTE_SECONDS = 24 * 3600  # as long as a deleted message's note
TOLD_SECONDS = 24 * 3600  # a removed watch's notice is marked said this long
TELLING_SECONDS = 60  # a claim to say it, left by a process that died while saying it
_PLATFORM_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")  # Slack's channel ids, Discord's snowflakes

# KEYS: the tenant's thread -> channel map, the channel's record of threads, then the thread's
# messages, queued jobs, running job and deleted-place note. ARGV: the thread's channel id, its
# channel. A thread stored again since its erasure, or with a turn queued or running (it will
# store its answer), stays listed: its channel's deletion must find it. So does one its place's
# deletion is erasing: a run of that deletion again after a crash finds it (and its watches)
# there, and clears the record itself. Otherwise the thread leaves both.
_UNLIST_SCRIPT = """
if redis.call('EXISTS', KEYS[3], KEYS[4], KEYS[5], KEYS[6]) > 0 then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""


def _is_slack(thread: str) -> bool:
    """A Slack thread's id (`slack:<team>:<channel>:<ts>`), which names its channel."""
    return thread.startswith("slack:") and thread.count(":") == 3


@dataclass(frozen=True)
class DeletedPlace:
    """A channel or thread deleted on a platform: a Slack channel id, or a Discord channel or
    thread id (`parent`: a deleted Discord thread's channel, whose record lists it)."""

    tenant: str
    platform: str  # "slack" or "discord"
    channel: str
    parent: str = ""

    def __post_init__(self) -> None:
        validate_tenant(self.tenant)
        ids = [self.channel, *([self.parent] if self.parent else [])]
        if self.platform not in ("slack", "discord") or not all(map(_PLATFORM_ID.match, ids)):
            raise ValueError(f"not a platform's place: {self.platform} {self.channel}")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeletedPlace:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def own_thread(self) -> str:
        """Slack: its threads' common prefix; Discord: the channel's (or thread's) conversation."""
        if self.platform == "slack":
            return f"slack:{self.tenant}:{self.channel}:"
        return f"discord:{self.tenant}:{self.channel}"

    def holds(self, thread: str) -> bool:
        """Whether `thread` is one of this place's by its id alone."""
        if self.platform == "slack":
            return thread.startswith(self.own_thread)
        return thread == self.own_thread


class Places:
    """Finds a deleted place's threads, notes them, and clears what the place kept; the threads
    themselves are erased by `Governance.forget_place`."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._unlist = redis.register_script(_UNLIST_SCRIPT)

    async def note_thread(self, tenant: str, channel: str, thread: str) -> None:
        """The bot takes part in Discord thread `thread` (its channel id) under `channel`."""
        async with self.redis.pipeline(transaction=True) as pipe:  # one slot: the tenant's
            pipe.sadd(place_threads_key(tenant, channel), thread)
            pipe.hset(thread_channels_key(tenant), thread, channel)
            await pipe.execute()

    async def unlist(self, tenant: str, threads: Iterable[str]) -> int:
        """Discord threads just forgotten whole leave their channel's record (and the map);
        returns how many left one. Others (Slack's, DMs', a channel's own) are skipped."""
        prefix = f"discord:{tenant}:"
        ids = {t: t[len(prefix) :] for t in threads if t.startswith(prefix)}
        if not ids:
            return 0
        parents = await self.redis.hmget(thread_channels_key(tenant), list(ids.values()))
        pipe, sent = self.redis.pipeline(transaction=False), 0
        for (thread, child), parent in zip(ids.items(), parents, strict=True):
            if parent is None:  # under no channel: a channel's own conversation, or recorded
                continue  # before the map (an id only, left in its channel's record)
            keys = [thread_channels_key(tenant), place_threads_key(tenant, decode(parent) or ""),
                    messages_key(tenant, thread), turn_queue_key(tenant, thread),
                    turn_running_key(tenant, thread), deleted_thread_key(tenant, thread)]  # fmt: skip
            await self._unlist(keys=keys, args=[child, decode(parent)], client=pipe)
            sent += 1
        return sum(int(r) for r in await pipe.execute()) if sent else 0

    async def any_joined(self, tenant: str, threads: Iterable[str]) -> bool:
        """Whether the bot takes part in any of `threads` (an edit's adapter asks where a
        message may be stored): one EXISTS over their keys, all in the tenant's slot."""
        keys = [joined_key(tenant, t) for t in threads]
        return bool(keys) and bool(await self.redis.exists(*keys))

    async def threads_of(self, place: DeletedPlace) -> list[str]:
        """The place's threads in memory, or with turns queued (Slack), or recorded (Discord).
        First a Slack channel is noted as deleted, for a day (its `own_thread`, `deleted`): a
        thread of it neither stored nor busy yet is not found here (a top-level mention starts
        one; its shared PDF may be read meanwhile: adapters/shared_files.py `_erased`), and its
        id names the channel, so `deleted` finds it by that note; before the scan, so a thread
        stored after it finds the note. Not in a tenant erased in the last day (a deletion
        queued before the erasure writes nothing after it). A Discord place's conversation is
        one of its threads: `note` notes it."""
        tenant = place.tenant
        if place.platform == "slack":
            if not await self.redis.exists(erased_tenant_key(tenant)):
                note = deleted_thread_key(tenant, place.own_thread)
                await self.redis.set(note, 1, ex=PLACE_NOTE_SECONDS)
            found: set[str] = set()
            for key in (threads_key(tenant), busy_threads_key(tenant)):
                async for member, _ in self.redis.zscan_iter(key, match=f"{place.own_thread}*"):
                    found.add(decode(member))
            return sorted(found)
        children = await self.redis.smembers(place_threads_key(tenant, place.channel))
        ids = sorted({decode(c) for c in children} - {place.channel})
        return [place.own_thread, *(f"discord:{tenant}:{i}" for i in ids)]

    async def holds_nothing(self, place: DeletedPlace, threads: list[str]) -> bool:
        """Nothing of the place in memory but perhaps its watches (`watches_in`): none of
        `threads` (`threads_of`) listed, stored, joined or with turns queued or running, and no
        record of the place (Discord: its threads, its entry in its channel's; Slack: the
        latest thread per person). One round trip."""
        tenant = place.tenant
        pipe = self.redis.pipeline(transaction=False)
        if threads:
            pipe.zmscore(threads_key(tenant), threads)
            pipe.zmscore(busy_threads_key(tenant), threads)
            pipe.exists(*(key(tenant, t) for t in threads for key in (messages_key, joined_key)))
        if place.platform == "slack":
            pipe.exists(last_thread_key(tenant, place.channel))
        else:
            pipe.exists(place_threads_key(tenant, place.channel))
            if place.parent:
                pipe.sismember(place_threads_key(tenant, place.parent), place.channel)
        replies = await pipe.execute()
        scores = replies[:2] if threads else []  # the two ZMSCOREs; then counts and flags
        listed = any(s is not None for each in scores for s in each)
        return not listed and not any(replies[len(scores) :])

    async def note(self, tenant: str, threads: list[str]) -> list[str]:
        """Note each thread as deleted (a day), and return the messages (their sources) of the
        turns queued or running there, read at once, for the caller to note as deleted."""
        if not threads:
            return []
        pipe = self.redis.pipeline(transaction=True)
        for thread in threads:
            pipe.set(deleted_thread_key(tenant, thread), 1, ex=PLACE_NOTE_SECONDS)
            pipe.lrange(turn_queue_key(tenant, thread), 0, -1)
            pipe.get(turn_running_key(tenant, thread))
        replies = await pipe.execute()
        jobs = [job for i in range(len(threads)) for job in replies[3 * i + 1]]
        jobs += [job for i in range(len(threads)) if (job := replies[3 * i + 2]) is not None]
        sources: list[str] = []
        for raw in jobs:
            with contextlib.suppress(ValueError, AttributeError):
                source = json.loads(decode(raw) or "").get("source")
                if source and source not in sources:
                    sources.append(source)
        return sources

    async def deleted(self, tenant: str, threads: Iterable[str]) -> list[str]:
        """Those of `threads` whose channel or thread was deleted on the platform in the last
        day: each noted itself (`note`), or, a Slack thread, its channel (`threads_of`)."""
        threads = list(threads)
        if not threads:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for thread in threads:
            places = {thread, *([thread.rsplit(":", 1)[0] + ":"] if _is_slack(thread) else [])}
            pipe.exists(*(deleted_thread_key(tenant, place) for place in places))
        return [t for t, found in zip(threads, await pipe.execute(), strict=True) if found]

    async def clear(
        self, place: DeletedPlace, threads: list[str], doomed: list[Watch],
        removing: Callable[[list[Watch]], Awaitable[None]] | None = None,
    ) -> int:  # fmt: skip
        """What the place kept besides its threads: the bot's presence in threads that only had
        turns queued, Slack's latest thread per person, Discord's record of its threads (and
        its entry in its channel's, and their channels in the map), and the watches posting
        there (`doomed`: `watches_in`, read before these records go), handed to `removing`
        before they go. Returns the watches removed."""
        tenant = place.tenant
        store, removed = WatchStore(self.redis), 0
        if doomed and removing is not None:
            await removing(doomed)  # first: a crash before they go hands them again
        keys = [joined_key(tenant, t) for t in threads]
        if place.platform == "slack":
            keys.append(last_thread_key(tenant, place.channel))
        else:
            keys.append(place_threads_key(tenant, place.channel))
            if place.parent:
                await self.redis.srem(place_threads_key(tenant, place.parent), place.channel)
            ids = {place.channel, *(t.rsplit(":", 1)[1] for t in threads)}
            await self.redis.hdel(thread_channels_key(tenant), *ids)
        await delete_keys(self.redis, keys)
        for watch in doomed:
            removed += await store.remove(tenant, watch.id)
        if removed:
            log.info("%d watches of deleted %s %s removed", removed, place.platform, place.channel)
        return removed

    async def claim_telling(self, tenant: str, watch_id: str) -> str:
        """Claim saying that watch `watch_id` was removed with its place: "" when claimed now,
        "told" when it was said (kept a day), "telling" when another process is saying it. The
        claim lapses after TELLING_SECONDS: one left by a process that died while saying it
        leaves the notice to a later delivery."""
        key = watch_removed_told_key(tenant, watch_id)
        if await self.redis.set(key, "telling", nx=True, ex=TELLING_SECONDS):
            return ""
        return decode(await self.redis.get(key)) or "telling"  # lapsed just now: try later

    async def told(self, tenant: str, watch_id: str, said: bool) -> None:
        """The notice was said (kept a day), or could not be (the claim goes: it is tried again)."""
        key = watch_removed_told_key(tenant, watch_id)
        if said:
            await self.redis.set(key, "told", ex=TOLD_SECONDS)
        else:
            await self.redis.delete(key)

    async def watches_in(self, place: DeletedPlace, threads: list[str]) -> list[Watch]:
        """The watches posting to the place (Slack: its channel; Discord: it or its threads)."""
        if place.platform == "slack":
            channels = {place.channel}
        else:
            channels = {place.channel, *(t.rsplit(":", 1)[1] for t in threads)}
        return [
            watch for watch in await WatchStore(self.redis).all(place.tenant)
            if watch.platform == place.platform and watch.channel in channels
        ]  # fmt: skip
