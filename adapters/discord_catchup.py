"""Catching up on Discord after a new gateway session.

Messages posted while no session is up (the worker crashed, was restarted or deployed) never
arrive as events: Discord replays missed events only to a session that resumes (RESUMED), not
to a new one (READY). So:

- As messages pass (`seen`), the id of the last one in each place the bot answers in (a
  channel where it was mentioned, a thread it takes part in, a DM) is kept in Redis, forward
  only (memory/coordination.py `PlaceCursors`); a place not seen for the cursors' TTL is
  dropped.
- From a new session's start (`connected`, READY) until its catch-up has planned which places
  to read, no cursor moves: a live message taken meanwhile must not move one past what was
  missed before it. The memory unreachable then, the plan is tried again with back-off for as
  long as the adapter runs; a plan that fails otherwise is given up, and cursors move again
  (a resumed session sends no READY: held cursors would never move, and expire).
- On READY, `start` reads, in each place with something posted after its cursor (most recent
  first, at most `MAX_PLACES`), what was posted since the cursor but within `WINDOW` (older
  messages are not answered that late), oldest first and at most `MAX_MESSAGES`, and hands
  every message to the adapter's `handle_message`, as if the gateway had delivered it: message
  ids are de-duplicated there, and one whose answer was delivered is skipped here (the de-dup
  lasts an hour, the record of a delivered answer a week). Places known to hold something new
  (cached channels) come before DMs (never cached). Until a place is read its cursor stays.
- A place Discord fails to give in passing (a server error, a rate limit, the network, a
  timeout) is logged, the others are read, and it is read again in the session with back-off,
  at most `REREAD_TRIES` times; one Discord refuses (no access, a bad request) is not. Either
  way a place given up keeps its cursor, so the next READY reads it from there.
- A message the adapter gave up (`given_up`: at stop(), or its retries out, its work never
  queued) is recorded itself (memory/coordination.py `GivenUpMessages`, for `WINDOW`); cursors
  are untouched. After reading the places, the catch-up fetches each recorded message by id
  and hands it on as it does the others, whatever passed its place's cursor meanwhile (a later
  message, a catch-up that read it while its claim was held, another process): only it is
  read again, not what its place held around it. Its record goes once handed on, or once
  Discord says it or its place is gone (or refuses it); a passing failure keeps it for the
  next READY.
- Otherwise a place the bot never saw a message in (a first DM, a first mention in a channel)
  has no cursor: what is posted there while no session is up is not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from typing import TYPE_CHECKING

import discord

from adapters.spine import not_queued_for_now
from memory.coordination import GivenUpMessages, PlaceCursors

if TYPE_CHECKING:
    from adapters.discord import DiscordAdapter

log = logging.getLogger(__name__)

WINDOW = datetime.timedelta(days=1)  # messages older than this are not answered when caught up
MAX_PLACES = 100
MAX_MESSAGES = 500  # per place
RETRY_EVERY_SECONDS = 5.0
PLAN_RETRY_MAX_SECONDS = 60.0  # the plan's back-off cap while the memory is unreachable
REREAD_TRIES = 8  # re-reads of a place Discord failed to give: 5 s, 10 s, ... about 15 minutes
REREAD_MAX_SECONDS = 300.0  # the back-off's cap


def turn_job_id(message_id: int) -> str:
    """The id of a message's turn job (its delivery is recorded under it)."""
    return f"discord-{message_id}"


class DiscordCatchUp:
    """The adapter's cursors per place, and the catch-up each READY starts."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        self.adapter = adapter
        self.cursors = PlaceCursors(adapter.handler.memory.redis)
        self.given_up_messages = GivenUpMessages(
            adapter.handler.memory.redis, int(WINDOW.total_seconds())
        )
        self.known: dict[int, str] = {}  # place -> tenant: every message there moves its cursor
        # places this session's catch-up has not read (yet) -> (tenant, read after): cursors kept
        self.unread: dict[int, tuple[str, int]] = {}
        self.failed_reads: dict[int, int] = {}  # of the unread, those to read again -> tries
        self.plan_pending = False  # a new session whose catch-up has not planned yet
        self._session = 0  # READYs so far: a catch-up planned in an older one plans again
        self._connects = 0  # sessions begun (`connected`): an older plan leaves the flag set
        self._wake = asyncio.Event()  # a new READY: the re-reads' back-off ends early
        self._stopped = False
        self._running: asyncio.Task | None = None
        self._rereading: asyncio.Task | None = None

    async def seen(self, message: discord.Message, tenant: str | None) -> None:
        """`message` passed (taken, ignored or a duplicate); `tenant` when it was for the bot.
        Best effort: a cursor not moved only means a message read twice at the next READY."""
        place = message.channel.id
        tenant = tenant or self.known.get(place)
        if tenant is None or self.plan_pending or place in self.unread:  # kept to read from
            return
        try:
            await self.opened(tenant, place, message.id)
        except Exception as exc:
            log.warning("the catch-up cursor of %s was not moved: %r", place, exc)

    async def opened(self, tenant: str, place: int, after: int) -> None:
        """A place to catch up from message `after` on (a thread opened from it)."""
        await self.cursors.advance(tenant, str(place), str(after))
        self.known[place] = tenant

    async def given_up(
        self, tenant: str, message: discord.Message, claim: tuple[str, str] | None = None
    ) -> None:
        """`message` was given up before its work was queued: the next READY fetches it and
        takes it again (`_retake`); its de-duplication `claim` (event id, delivery) is let go in
        the same step."""
        await self.given_up_messages.add(tenant, str(message.channel.id), str(message.id), claim)

    def connected(self) -> None:
        """A new gateway session (discord.py's `connect`, on READY): no cursor moves until
        its catch-up has planned (`start` follows once discord.py has the servers)."""
        self._connects += 1
        self.plan_pending = True

    def start(self) -> None:
        """On READY: catch up in the background; a catch-up still running plans again once
        its current plan is read (what was posted during the last gap is to be read too)."""
        if self._stopped:
            return
        self.plan_pending = True
        self._session += 1
        self._wake.set()
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._catch_up_safely())

    async def stop(self) -> None:
        self._stopped = True
        tasks = [task for task in (self._running, self._rereading) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _catch_up_safely(self) -> None:
        """The memory unreachable: tried again, with back-off, until it is back. A READY
        meanwhile: planned again. Then places Discord failed to give are read again. Given up
        on another error: cursors move again (held, they would never move, and expire)."""
        if self._rereading is not None:  # an older session's: it ends at its next step
            await asyncio.gather(self._rereading, return_exceptions=True)
        wait = RETRY_EVERY_SECONDS
        while True:
            session = self._session
            try:
                await self.catch_up()
            except Exception as exc:
                if not_queued_for_now(exc):
                    log.warning("catching up: the memory is unreachable (%r); trying again", exc)
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, PLAN_RETRY_MAX_SECONDS)
                    continue
                log.exception("could not catch up on messages posted while disconnected")
                if self.plan_pending:
                    self.plan_pending = False
                    log.error(
                        "no catch-up this session: what was posted while disconnected is not read"
                    )
                return
            if session == self._session:
                if self.failed_reads and not self._stopped:
                    self._rereading = asyncio.create_task(self._reread(session))
                return

    async def catch_up(self) -> int:
        """Read each place's messages after its cursor, within the window; the number handed
        on."""
        session, connects = self._session, self._connects
        planned, unchanged, dropped, left_out = await self._plan()
        if (session, connects) == (self._session, self._connects):  # else a newer session:
            self.plan_pending = False  # its plan may hold more (a connect alone: no READY yet)
        handed = 0
        for place, (tenant, after) in list(self.unread.items()):
            if session != self._session:  # a new READY: plan again (the rest keep cursors)
                break
            try:  # one place failing leaves the others to read
                handed += await self._place(tenant, place, after)
            except Exception as exc:
                if not_queued_for_now(exc):
                    raise
                self._failed(place, exc)
        retaken = await self._retake(session)
        log.info(
            "caught up on Discord: %d messages in %d places (%d with nothing new; %d more left "
            "out; %d not seen for %d days, no longer followed); %d given up before, fetched",
            handed, planned, unchanged, left_out, dropped, self.cursors.ttl // 86400, retaken,
        )  # fmt: skip
        return handed + retaken

    async def _plan(self) -> tuple[int, int, int, int]:
        """Which places to read, and from where (`unread`): (how many, how many had nothing
        new, were dropped, were left out)."""
        now = discord.utils.utcnow()
        window_start = discord.utils.time_snowflake(now - WINDOW)
        expired = discord.utils.time_snowflake(now - datetime.timedelta(seconds=self.cursors.ttl))
        tenants = await self._tenants()
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
        self.unread = {place: (tenant, after) for _, after, place, tenant in places[:MAX_PLACES]}
        self.failed_reads = {}
        return len(self.unread), unchanged, dropped, max(len(places) - MAX_PLACES, 0)

    async def _tenants(self) -> list[str]:
        """The tenants this session serves: its servers', and every DM's."""
        guilds = {str(guild.id) for guild in self.adapter.client.guilds}
        return [t for t in await self.cursors.tenants() if t.startswith("dm-") or t in guilds]

    async def _retake(self, session: int) -> int:
        """Fetch each message given up (`given_up`) and hand it on as a caught-up one: the
        number handed on. Its record goes once handed on, answered, older than WINDOW, or gone
        or refused by Discord; a passing failure (a server error, the network) keeps it for the
        next READY, as does its take failing."""
        records = self.given_up_messages
        window_start = discord.utils.time_snowflake(discord.utils.utcnow() - WINDOW)
        handed = 0
        for tenant, place, message_id in await records.of(await self._tenants()):
            if session != self._session:  # a new READY: its catch-up takes the rest
                break
            answered = await self.cursors.answered(tenant, [turn_job_id(message_id)])
            if message_id < window_start or answered:
                await records.drop(tenant, place, message_id)
                continue
            try:
                message = await self._fetch(place, message_id)
            except Exception as exc:
                if not_queued_for_now(exc) or self.adapter.pipeline.platform.passing(exc):
                    log.warning(
                        "message %s given up in %s could not be fetched (%r): the next READY "
                        "tries again", message_id, place, exc,
                    )  # fmt: skip
                    continue
                log.warning("message %s given up in %s: refused (%r)", message_id, place, exc)
                message = None
            if message is None:
                log.warning(
                    "message %s given up in %s is gone or out of reach: not taken again",
                    message_id, place,
                )  # fmt: skip
                await records.drop(tenant, place, message_id)
                continue
            handed += 1
            try:  # the memory unreachable is the adapter's to retry (and record if given up)
                await self.adapter.handle_message(message)
            except Exception:
                log.exception("message %s (given up before) could not be taken", message_id)
                continue
            await records.drop(tenant, place, message_id)
        return handed

    async def _fetch(self, place: int, message_id: int) -> discord.Message | None:
        """The message, or None when Discord says it or its place is gone, or out of reach
        (no access, no Read Message History)."""
        channel = await self.adapter.pipeline.platform.channel(place)
        if channel is None:
            return None
        try:
            return await channel.fetch_message(message_id)
        except (discord.NotFound, discord.Forbidden):
            return None

    async def _reread(self, session: int) -> None:
        """Read again, with back-off, the places Discord failed to give in passing, until each
        is read or given up (`_failed`), or a new READY's catch-up takes over."""
        wait = RETRY_EVERY_SECONDS
        while self.failed_reads and session == self._session:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            wait = min(wait * 2, REREAD_MAX_SECONDS)
            for place in list(self.failed_reads):
                if session != self._session:
                    return
                if place not in self.unread:  # read meanwhile (or gone)
                    self.failed_reads.pop(place, None)
                    continue
                tenant, after = self.unread[place]
                try:
                    await self._place(tenant, place, after)
                except Exception as exc:  # the memory unreachable counts as a try too
                    self._failed(place, exc)

    def _failed(self, place: int, exc: Exception) -> None:
        """Reading `place` failed: read again later if it may pass (at most REREAD_TRIES
        times), else given up for this session (its cursor kept for the next READY)."""
        tries = self.failed_reads.get(place, -1) + 1
        passing = self.adapter.pipeline.platform.passing(exc) or not_queued_for_now(exc)
        if passing and tries < REREAD_TRIES:
            self.failed_reads[place] = tries
            log.warning("could not read what was posted in %s meanwhile: %r", place, exc)
            return
        self.failed_reads.pop(place, None)
        why = f"still failing after {tries} re-reads" if passing else "refused"
        log.error(
            "not reading what was posted in %s meanwhile this session (%s: %r); the next "
            "READY reads it", place, why, exc,
        )  # fmt: skip

    def _last_message(self, place: int) -> int | None:
        """The id of the cached channel's last message: whether a history call is needed
        (discord.py keeps `last_message_id` for the channels and threads it holds; not DMs)."""
        last = getattr(self.adapter.client.get_channel(place), "last_message_id", None)
        return last if isinstance(last, int) else None

    async def _place(self, tenant: str, place: int, after: int) -> int:
        """Hand on what was posted in `place` after `after`. Until all of it is read and
        handed on, its cursor stays (`unread`): a Discord error, or the memory failing before
        the messages are handed on, leaves it to read again (`_failed`, or a new plan)."""
        channel = await self.adapter.pipeline.platform.channel(place)
        if channel is None:  # deleted, or no longer visible to the bot
            await self.cursors.drop(tenant, str(place))
            self.known.pop(place, None)
            self.unread.pop(place, None)
            self.failed_reads.pop(place, None)
            return 0
        messages: list[discord.Message] = []
        read_all = False
        try:  # discord.py pages on (100 a call) until the present or the limit
            history = channel.history(
                limit=MAX_MESSAGES + 1, after=discord.Object(id=after), oldest_first=True
            )
            async for message in history:  # what was read before an error is handed on
                messages.append(message)
            read_all = True
        except Exception as exc:  # Discord's error, the network's, a timeout
            if not_queued_for_now(exc):
                raise
            self._failed(place, exc)
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
        if read_all:  # handed on: its cursor moves again, from the last of them
            self.unread.pop(place, None)
            self.failed_reads.pop(place, None)
            self.known[place] = tenant
            if messages:
                await self.seen(messages[-1], tenant)
        return handed
