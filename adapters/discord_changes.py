"""Changes people make on Discord that memory follows (the adapter's `changes`): a message
deleted (`on_raw_message_delete`, and a moderator's bulk deletion) is forgotten, a message
edited (`on_raw_message_edit` with a `content`) gets its new text in memory, a channel or
thread deleted is forgotten whole. Each is queued as durable background work (bot/upkeep.py)
and found where `DiscordAdapter.route` would have stored it: a message in its channel's thread
or the thread a mention opened from it (Discord gives such a thread the message's id), in a DM
the DM channel's, whose tenant is its person. Discord sends each event once: while the memory
is unreachable, the adapter keeps it and tries again (`now_or_later`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import discord

from adapters.platform_ids import discord_source
from memory.governance_places import DeletedPlace

log = logging.getLogger(__name__)

DM_LOOKUP_SECONDS = 1.5  # how long a DM channel's person is asked of Discord


class DiscordChanges:
    """Deletions and edits on Discord, queued for memory to follow."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter  # its `now_or_later`, `question_text`, `mentions_me`, presence
        self.client: discord.Client = adapter.client
        self.handler = adapter.handler

    async def handle_deletion(self, payload: discord.RawMessageDeleteEvent) -> None:
        """Queue the erasure of a deleted message from memory (in a DM, the recipient's DM
        memory)."""
        if payload.guild_id is not None:
            await self._in_guild(payload.guild_id, payload.channel_id, payload.message_id)
            return
        user = await self._dm_person(payload)
        if user is None:
            log.warning("deleted DM message %s: its person is unknown", payload.message_id)
            return
        threads = [f"discord:dm:{payload.channel_id}"]
        await self._queue_deletion(f"dm-{user}", threads, payload.message_id)

    async def handle_bulk_deletion(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        """A moderator's purge, or a ban that deletes the member's messages: each one as a
        single deletion (bulk deletions happen in servers only)."""
        if payload.guild_id is None:
            return
        for message_id in sorted(payload.message_ids):
            await self._in_guild(payload.guild_id, payload.channel_id, message_id)

    async def _in_guild(self, guild_id: int, channel_id: int, message_id: int) -> None:
        tenant = str(guild_id)
        threads = [f"discord:{tenant}:{channel_id}", f"discord:{tenant}:{message_id}"]
        await self._queue_deletion(tenant, threads, message_id)

    async def _queue_deletion(self, tenant: str, threads: list[str], message_id: int) -> None:
        source = discord_source(message_id)
        await self.adapter.now_or_later(
            f"deletion of message {message_id}",
            lambda: self.handler.message_deleted(tenant, threads, source),
        )

    async def handle_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        """Queue the following of a person's edit in memory: its new text taken as a new
        message's is (`question_text`); edited to nothing (a bare mention), its erasure, as a
        deletion. Only a message the bot may hold (in a DM, a mention of it, a thread it
        answers in); one it never took, edited to mention it, is a question. Ignored: the
        bot's and other bots' messages, an update that is no edit (an embed added, a pin: no
        `edited_at`, or no `content`), the same text as cached."""
        me, message = self.client.user, payload.message
        if me is None or "content" not in payload.data or message.author.bot:
            return
        before = payload.cached_message
        if message.edited_at is None or (before is not None and before.content == message.content):
            return
        if payload.guild_id is None:
            tenant = f"dm-{message.author.id}"
            places = {f"discord:dm:{payload.channel_id}": str(payload.channel_id)}
        else:  # its channel's thread, or the thread a mention opened (the message's id)
            tenant, channel, opened = str(payload.guild_id), payload.channel_id, message.id
            places = {f"discord:{tenant}:{channel}": str(channel),
                      f"discord:{tenant}:{opened}": str(opened)}  # fmt: skip
        text = self.adapter.question_text(message, me.id)
        source, at = discord_source(message.id), message.edited_at.timestamp()

        async def take() -> None:
            if await self._newly_asked(tenant, places, message, before):
                # a question now, answered once; the edit is noted too: an edit again before
                # its turn stores it is dropped as a question (its `discord:<id>` key) but
                # followed here, and the turn runs with the latest text
                await self.adapter.handle_message(message)
            if payload.guild_id is not None and not await self._may_hold(
                tenant, places, message, before
            ):
                return
            if not text:
                await self.handler.message_deleted(tenant, list(places), source)
            else:
                await self.handler.message_edited(tenant, places, source, text, at)

        await self.adapter.now_or_later(f"edit of message {message.id}", take)

    async def _newly_asked(
        self, tenant: str, places: dict[str, str], message: discord.Message,
        before: discord.Message | None,
    ) -> bool:  # fmt: skip
        """A server message edited to mention the bot, which it never took (not stored; one
        still queued is kept out by its `discord:<id>` event): a question now, as Slack's
        `app_mention` for such an edit is."""
        me = self.client.user
        if me is None or message.guild is None or not self.adapter.mentions_me(message, me.id):
            return False
        if (
            before is not None
            and self.adapter.mentions_me(before, me.id)
            and self.adapter.question_text(before, me.id)
        ):
            return False  # asked before the edit: taken then (a bare mention asked nothing)
        source = discord_source(message.id)
        return not await self.handler.memory.governance.edits.stored(tenant, places, source)

    async def _may_hold(
        self, tenant: str, places: dict[str, str], message: discord.Message,
        before: discord.Message | None,
    ) -> bool:  # fmt: skip
        """Whether the bot may have stored a server message: it mentions the bot (before the
        edit, as cached, or after), it is in a thread the bot opened, or in one it answers in
        (one EXISTS for them all; a mention that opened a thread joined the thread of the
        message's id)."""
        me = self.client.user
        if me is None:
            return False
        if any(self.adapter.mentions_me(m, me.id) for m in (before, message) if m is not None):
            return True  # (now too: a mention stored where no thread is joined, a voice chat's)
        channel = message.channel
        if isinstance(channel, discord.Thread) and channel.owner_id == me.id:
            return True
        return await self.handler.memory.governance.places.any_joined(tenant, places)

    async def handle_channel_deletion(self, channel: discord.abc.GuildChannel) -> None:
        """A server channel deleted: queue the erasure of its own conversation and of the
        threads the bot took part in under it (recorded as they came: archived threads are in
        no cache). discord.py also sends the deletion of each thread it has cached."""
        if isinstance(channel, discord.CategoryChannel):
            return  # no messages of its own; its channels stay
        await self._queue_place_deletion(
            DeletedPlace(str(channel.guild.id), "discord", str(channel.id))
        )

    async def handle_thread_deletion(self, payload: discord.RawThreadDeleteEvent) -> None:
        """A thread deleted (raw: cached or not), or one of a deleted channel's: queue the
        erasure of its conversation."""
        place = DeletedPlace(
            str(payload.guild_id), "discord", str(payload.thread_id), parent=str(payload.parent_id)
        )
        await self._queue_place_deletion(place)

    async def _queue_place_deletion(self, place: DeletedPlace) -> None:
        await self.adapter.now_or_later(
            f"deletion of channel {place.channel}",
            lambda: self.handler.place_deleted(place),
        )

    async def _dm_person(self, payload: discord.RawMessageDeleteEvent) -> int | None:
        """The person of a DM channel (its tenant is theirs): the channel's recipient, from the
        cache or Discord; else the deleted message's author, if it was cached."""
        channel = self.client.get_channel(payload.channel_id)
        if channel is None:
            try:
                async with asyncio.timeout(DM_LOOKUP_SECONDS):
                    channel = await self.client.fetch_channel(payload.channel_id)
            except Exception as exc:  # an error, no answer: the cached message may still say
                log.warning("DM channel %s could not be fetched: %r", payload.channel_id, exc)
        recipient = channel.recipient if isinstance(channel, discord.DMChannel) else None
        if recipient is not None:
            return recipient.id
        cached = payload.cached_message
        return cached.author.id if cached is not None and not cached.author.bot else None
