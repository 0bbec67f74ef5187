"""Catching up on Discord after a new gateway session.

Messages posted while no session is up (the worker crashed, was restarted or deployed) never
arrive as events: Discord replays missed events only to a session that resumes (RESUMED), not
to a new one (READY). So:

- As messages pass (`seen`), the id of the last one in each place the bot answers in (a
  channel where it was mentioned, a thread it takes part in, a DM) is kept in Redis, forward
  only (memory/coordination.py `PlaceCursors`); a place not seen for the cursors' TTL is
  dropped.
- On READY, `start` reads, in each place with something posted after its cursor (most recent
  first, at most `MAX_PLACES`), what was posted since the cursor but within `WINDOW` (older
  messages are not answered that late), oldest first and at most `MAX_MESSAGES`, and hands
  every message to the adapter's `handle_message`, as if the gateway had delivered it: message
  ids are de-duplicated there, and one whose answer was delivered is skipped here (the de-dup
  lasts an hour, the record of a delivered answer a week). Places known to hold something new
  (cached channels) come before DMs (never cached). A place Discord fails to give (an error, a
  timeout) is logged and the others are read; until a place is read its cursor stays, so the
  next READY reads it from there.
- A place the bot never saw a message in (a first DM, a first mention in a channel) has no
  cursor: what is posted there while no session is up is not read.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING

import discord

from adapters.spine import not_queued_for_now
from memory.coordination import PlaceCursors

if TYPE_CHECKING:
    from adapters.discord import DiscordAdapter

log = logging.getLogger(__name__)

WINDOW = datetime.timedelta(days=1)  # messages older than this are not answered when caught up
MAX_PLACES = 100
MAX_MESSAGES = 500  # per place
RETRY_EVERY_SECONDS = 5.0
RETRIES = 60


def turn_job_id(message_id: int) -> str:
    """The id of a message's turn job (its delivery is recorded under it)."""
    return f"discord-{message_id}"


class DiscordCatchUp:
    """The adapter's cursors per place, and the catch-up each READY starts."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        self.adapter = adapter
        self.cursors = PlaceCursors(adapter.handler.memory.redis)
        self.known: dict[int, str] = {}  # place -> tenant: every message there moves its cursor
        self.unread: set[int] = set()  # places this catch-up has not read (yet): cursors kept
        self._running: asyncio.Task | None = None

    async def seen(self, message: discord.Message, tenant: str | None) -> None:
        """`message` passed (taken, ignored or a duplicate); `tenant` when it was for the bot.
        Best effort: a cursor not moved only means a message read twice at the next READY."""
        place = message.channel.id
        tenant = tenant or self.known.get(place)
        if tenant is None or place in self.unread:  # kept for the next READY to read from
            return
        try:
            await self.opened(tenant, place, message.id)
        except Exception as exc:
            log.warning("the catch-up cursor of %s was not moved: %r", place, exc)

    async def opened(self, tenant: str, place: int, after: int) -> None:
        """A place to catch up from message `after` on (a thread opened from it)."""
        await self.cursors.advance(tenant, str(place), str(after))
        self.known[place] = tenant

    def start(self) -> None:
        """On READY: catch up in the background, unless a catch-up still runs."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._catch_up_safely())

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)

    async def _catch_up_safely(self) -> None:
        """The memory unreachable at connect: tried again every few seconds, for a while."""
        for _ in range(RETRIES):
            try:
                await self.catch_up()
                return
            except Exception as exc:
                if not not_queued_for_now(exc):
                    log.exception("could not catch up on messages posted while disconnected")
                    return
            await asyncio.sleep(RETRY_EVERY_SECONDS)
        log.error("memory stayed unavailable: messages posted while disconnected not read")

    async def catch_up(self) -> int:
        """Read each place's messages after its cursor, within the window; the number handed
        on."""
        now = discord.utils.utcnow()
        window_start = discord.utils.time_snowflake(now - WINDOW)
        expired = discord.utils.time_snowflake(now - datetime.timedelta(seconds=self.cursors.ttl))
        guilds = {str(guild.id) for guild in self.adapter.client.guilds}
        tenants = [t for t in await self.cursors.tenants() if t.startswith("dm-") or t in guilds]
        places: list[tuple[bool, int, int, str]] = []  # (known new, read after, place, tenant)
        dropped = unchanged = 0
        for tenant, cursors in (await self.cursors.places_of(tenants)).items():
            old = [place for place, cursor in cursors.items() if int(cursor) < expired]
            await self.cursors.drop(tenant, *old)
            dropped += len(old)
            for place, cursor in cursors.items():
                if place in old:
                    continue
                after = max(int(cursor), window_start)
                last = self._last_message(int(place))
                if last is not None and last <= after:
                    unchanged += 1
                    self.known[int(place)] = tenant
                else:
                    places.append((last is not None, after, int(place), tenant))
        # places known to hold something new (cached channels) first, then the most recent
        # (DMs are not cached: a mention in a channel must not rank below a hundred of them)
        places.sort(reverse=True)
        for _, _, place, tenant in places[MAX_PLACES:]:  # left out: followed from now on
            self.known[place] = tenant
        self.unread = {place for _, _, place, _ in places[:MAX_PLACES]}
        handed = 0
        for _, after, place, tenant in places[:MAX_PLACES]:
            try:  # one place failing leaves the others to read
                handed += await self._place(tenant, place, after)
            except Exception as exc:
                if not_queued_for_now(exc):
                    raise
                log.warning("could not read what was posted in %s meanwhile: %r", place, exc)
        log.info(
            "caught up on Discord: %d messages in %d places (%d with nothing new; %d more left "
            "out; %d not seen for %d days, no longer followed)", handed,
            min(len(places), MAX_PLACES), unchanged, max(len(places) - MAX_PLACES, 0), dropped,
            self.cursors.ttl // 86400,
        )  # fmt: skip
        return handed

    def _last_message(self, place: int) -> int | None:
        """The id of the cached channel's last message: whether a history call is needed
        (discord.py keeps `last_message_id` for the channels and threads it holds; not DMs)."""
        last = getattr(self.adapter.client.get_channel(place), "last_message_id", None)
        return last if isinstance(last, int) else None

    async def _place(self, tenant: str, place: int, after: int) -> int:
        """Hand on what was posted in `place` after `after`. Until all of it is read, its
        cursor stays (`unread`): a Discord error leaves it for the next READY to read."""
        channel = await self.adapter.pipeline.platform.channel(place)
        if channel is None:  # deleted, or no longer visible to the bot
            await self.cursors.drop(tenant, str(place))
            self.known.pop(place, None)
            self.unread.discard(place)
            return 0
        messages: list[discord.Message] = []
        try:  # discord.py pages on (100 a call) until the present or the limit
            history = channel.history(
                limit=MAX_MESSAGES + 1, after=discord.Object(id=after), oldest_first=True
            )
            async for message in history:  # what was read before an error is handed on
                messages.append(message)
        except Exception as exc:  # Discord's error, the network's, a timeout: read again later
            if not_queued_for_now(exc):
                raise
            log.warning("could not read what was posted in %s meanwhile: %r", place, exc)
        else:
            self.unread.discard(place)
            self.known[place] = tenant
        if len(messages) > MAX_MESSAGES:
            log.warning(
                "over %d messages posted in %s meanwhile: the first %d read, the rest not",
                MAX_MESSAGES, place, MAX_MESSAGES,
            )  # fmt: skip
            messages = messages[:MAX_MESSAGES]
        answered = await self.cursors.answered(tenant, [turn_job_id(m.id) for m in messages])
        handed = 0
        for message in messages:
            if turn_job_id(message.id) in answered:
                await self.seen(message, tenant)
                continue
            handed += 1
            try:  # the memory unreachable is the adapter's to retry (and say)
                await self.adapter.handle_message(message)
            except Exception:
                log.exception("message %s (caught up) could not be taken", message.id)
        return handed
