"""The Discord adapter (discord.py): gateway events in, `Job`s out; typing, a step status and
messages back (adapters/discord_platform.py). Everything between is the spine's
(`adapters/spine.py`).

- A mention of the bot in a server text channel opens a thread from that message and answers
  there. Later messages in that thread need no mention; nor do messages in any thread where
  the bot was mentioned once (participation is kept in Redis, so it holds across restarts and
  processes). Direct messages are answered in the DM channel.
- Scope: thread `discord:<guild>:<thread>` and tenant = the server (guild id); a channel that
  `@everyone` cannot view (and its threads) is private, and so is a private thread anywhere
  (audience `private:<thread>`: its members' and Manage Threads holders'). A thread whose
  parent is not cached has its parent fetched first; what Discord cannot tell is private
  (adapters/discord_platform.py `resolve_visibility`). In DMs thread `discord:dm:<channel>`
  and tenant `dm-<user>`, so a user's DMs are their own memory, never a server's.
- Changes people make on Discord are followed (adapters/discord_changes.py): a message
  deleted is forgotten, one edited gets its new text in memory (the edit is not answered), a
  channel or thread deleted is forgotten whole, with the threads the bot took part in under it
  (recorded as they come, since a thread's id does not name its channel) and its watches.
- The bot's own messages, other bots and system messages are ignored. The spine de-duplicates
  message ids (the gateway can redeliver on resume) and runs a thread's turns one at a time in
  arrival order, across every process sharing the Redis. Jobs hold ids, not discord.py
  objects: the channel is looked up when the job runs.
- A message is taken again by this process while the memory is unreachable, or while Discord
  fails in passing to open its thread (Discord sends it once); its job is named by the message
  id and its thread (which has the message's id) is reused, so a retry after a try that got
  further than it knew answers once. Only a person who surely addressed the bot (a mention, a
  DM, a thread the bot opened) is told; chatter in other threads is retried silently. At each
  new session (READY), what was posted meanwhile is read (adapters/discord_catchup.py).
- The bot removed from a server (`on_guild_remove`): the server's memory is erased
  ARXIVSCOUT_UNINSTALLED_KEEP_DAYS later, unless it joins again (`on_guild_join`, or the
  server is among its guilds at connect): memory/governance_tenants.py.
- Slash commands `/summarize` (in a thread the bot answers in, or a DM), `/expand
  <summary_id>` (anywhere in the server or a DM) and `/memory` (an ephemeral signed link to the
  memory page, for that person in that server, or for their DMs' memory in a DM):
  adapters/discord_commands.py.
- Replies are split under 2,000 characters at paragraph or code-block boundaries; a typing
  indicator shows while a turn runs, and a status message lists the tool steps.

Intents (Developer Portal → Bot → Privileged Gateway Intents): **Message Content** must be
enabled, or follow-ups without a mention arrive empty. The client asks for `guilds`,
`guild_messages`, `dm_messages` and `message_content`. Invite the bot with the `bot` and
`applications.commands` scopes and the permissions View Channels, Send Messages, Create Public
Threads, Send Messages in Threads and Read Message History.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import discord
from discord import app_commands

from adapters.discord_catchup import DiscordCatchUp, turn_job_id
from adapters.discord_changes import DiscordChanges
from adapters.discord_commands import DiscordCommands
from adapters.discord_feedback import DiscordFeedback
from adapters.discord_files import DiscordFiles, shared_attachments
from adapters.discord_platform import UNSENT, DiscordPlatform, resolve_visibility
from adapters.discord_watch import DiscordWatches
from adapters.memory_page.access import Admins
from adapters.memory_page.auth import Links
from adapters.platform_ids import discord_source
from adapters.spine import (
    NOT_TAKEN,
    SHUTDOWN_GRACE_SECONDS,
    Job,
    Pipeline,
    not_queued_for_now,
)
from bot.errors import ConfigError
from bot.feedback import FeedbackService
from bot.turns import TurnHandler
from memory.scope import Scope
from memory.shorten import shortened

log = logging.getLogger(__name__)

THREAD_NAME_LIMIT = 100
RESUBMIT_EVERY_SECONDS = 5.0
RESUBMIT_TRIES = 720  # an hour: Discord does not redeliver a message, so this process keeps it
LAST_TRIES_SECONDS = 8.0  # all of stop()'s last tries, when the running turns left that much
STOP_WITHIN_SECONDS = 27.0  # all of stop() (turns' grace, then last tries): Heroku kills at 30 s
GIVE_UP_SECONDS = 1.0  # of those, kept for letting go of what was given up (the grace and the
# last tries end before it: a turn, or discord.py's own retries of a 5xx, could take them all)
ANSWERED_TYPES = (discord.MessageType.default, discord.MessageType.reply)
Take = Callable[[], Awaitable[object]]  # queueing a message or an event's work
GiveUp = Callable[[], Awaitable[bool]]  # after the last try: False when the memory failed
EMPTY_MENTION = (
    "Ask me about arXiv papers: mention me with a question, e.g. `@ArxivScout find MemGPT`."
)
NO_THREAD_ALLOWED = (
    "I could not open a thread for this (I need the Create Public Threads and Send Messages "
    "in Threads permissions here)."
)
# Only "for a while": the retries are this process's, for an hour at most. A message given up
# (the hour out, the process stopping first, or another error) is recorded as given up and
# lets go of its de-duplication claim, so the next READY's catch-up
# (adapters/discord_catchup.py) fetches it by id and answers it, whatever passed its place's
# cursor meanwhile. Unless the memory is unreachable then (the claim lapses within the hour,
# nothing is recorded), or no READY comes in time: in a rolling restart the process that goes
# on is connected already, so the record is read at its next READY, and a message older than
# the catch-up's WINDOW by then is not answered.
DISCORD_FAILED = (  # Discord answered a server error or a rate limit
    "Discord answered with an error while I was opening a thread for this. I will keep trying "
    "for a while and answer in a thread if it works."
)
DISCORD_SILENT = (  # the network failed or Discord did not answer in time
    "Discord did not answer while I was opening a thread for this. I will keep trying for a "
    "while and answer in a thread if it works."
)


class DiscordFailed(Exception):
    """Discord failed in passing (a server error, a rate limit, the network) while a message
    was being taken: it is taken again later, as while the memory is unreachable."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.cause = cause

    @property
    def notice(self) -> str:
        """What the person is told: Discord's own error, or no answer from it at all."""
        return DISCORD_FAILED if isinstance(self.cause, discord.HTTPException) else DISCORD_SILENT


def claim_id(message: discord.Message) -> str:
    """The event id under which a message's delivery is de-duplicated (`EventLog`)."""
    return f"discord:{message.id}"


def intents() -> discord.Intents:
    """Only what the adapter reads: servers, their messages and DMs, and message text."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    return wanted


def thread_name(text: str) -> str:
    """The question's first line, as a thread title (Discord allows 100 characters)."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return shortened(line, THREAD_NAME_LIMIT) or "ArxivScout"


@dataclass(frozen=True)
class Waiting:
    """Work kept for the memory (or Discord) to be back: its name, how to take it, and what to
    do when it is given up (a message lets go of its de-duplication claim)."""

    what: str
    take: Take
    give_up: GiveUp | None = None


@dataclass(frozen=True)
class Route:
    """Where a message's turn goes: its scope and the channel to answer in."""

    scope: Scope
    channel_id: int
    open_thread: bool = False  # a mention in a channel: open a thread from the message first


class _Client(discord.Client):
    """A discord.Client whose events go to the adapter."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        super().__init__(intents=intents(), allowed_mentions=discord.AllowedMentions.none())
        self.adapter = adapter

    async def setup_hook(self) -> None:
        self.adapter.pipeline.start()  # take over the threads of processes that died
        await self.adapter.commands.sync()

    async def on_connect(self) -> None:  # READY received; `on_ready` once the servers are in
        self.adapter.catchup.connected()

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s in %d servers", self.user, len(self.guilds))
        self.adapter.catchup.start()  # a new session: what was posted meanwhile never arrives
        await self.adapter.guilds_back(self.guilds)  # joined again while this was offline

    async def on_guild_remove(self, guild: discord.Guild) -> None:
        await self.adapter.guild_removed(guild)

    async def on_guild_join(self, guild: discord.Guild) -> None:
        await self.adapter.guilds_back([guild])

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter.handle_message(message)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self.adapter.changes.handle_deletion(payload)

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self.adapter.changes.handle_bulk_deletion(payload)

    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        await self.adapter.changes.handle_channel_deletion(channel)

    async def on_raw_thread_delete(self, payload: discord.RawThreadDeleteEvent) -> None:
        await self.adapter.changes.handle_thread_deletion(payload)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        await self.adapter.changes.handle_edit(payload)


class DiscordAdapter:
    def __init__(
        self, handler: TurnHandler, *, sync: bool = True, sync_guild: int | None = None,
        links: Links | None = None, admins: Admins | None = None,
        resubmit_every_seconds: float = RESUBMIT_EVERY_SECONDS,
        resubmit_tries: int = RESUBMIT_TRIES, last_tries_seconds: float = LAST_TRIES_SECONDS,
    ) -> None:  # fmt: skip
        """`links`: the memory page's, for `/memory`; `admins`: ARXIVSCOUT_ADMINS, who manage
        every channel's watches as server managers do. `resubmit_every_seconds`: how often a
        kept message is tried again, `resubmit_tries` how often before it is given up;
        `last_tries_seconds`: what stop()'s last tries may take at most (all shorter in
        tests)."""
        self.handler = handler
        self.resubmit_every_seconds = resubmit_every_seconds
        self.resubmit_tries = resubmit_tries
        self.last_tries_seconds = last_tries_seconds
        self.links = links
        self.presence = handler.memory.presence
        self.places = handler.memory.governance.places  # Discord threads under each channel
        self.sync = sync
        self.sync_guild = sync_guild
        self.client = _Client(self)
        self.tree = app_commands.CommandTree(self.client)
        self.pipeline = Pipeline(DiscordPlatform(self.client), handler)
        self.feedback = DiscordFeedback(FeedbackService(handler.memory), self.client)  # 👍/👎
        self.files = DiscordFiles(self)  # PDFs attached where the bot answers
        self.changes = DiscordChanges(self)  # deletions and edits made on Discord
        self._waiting: dict[asyncio.Task, Waiting] = {}  # for the memory to be back
        # delivery -> tenant: a message's de-duplication claim taken, its work not queued yet
        self._claims: dict[str, str] = {}
        self._kept: dict[int, asyncio.Task] = {}  # message id -> its retries (in `_waiting`)
        self.catchup = DiscordCatchUp(self)  # messages posted while no session was up
        self.commands = DiscordCommands(self)  # /summarize, /expand and /memory
        DiscordWatches(
            handler.watches, self.client, self.pipeline.platform.channel, admins
        ).register(self.tree, self.commands.scope)  # /watch, digests and their Save buttons

    # -- start-up --------------------------------------------------------------------------

    async def start(self, token: str) -> None:
        """Connect and serve until stopped; a rejected token or intent is a ConfigError."""
        try:
            async with self.client:
                await self.client.start(token)
        except discord.LoginFailure:
            raise ConfigError(
                "Discord rejected DISCORD_TOKEN (login failed). Copy the bot token again from "
                "https://discord.com/developers/applications → your app → Bot → Reset Token."
            ) from None
        except discord.PrivilegedIntentsRequired:
            raise ConfigError(
                "The Message Content intent is not enabled for the bot of DISCORD_TOKEN. Enable "
                "it under Developer Portal → your app → Bot → Privileged Gateway Intents."
            ) from None

    # -- the bot removed from a server, or back ---------------------------------------------

    async def guild_removed(self, guild: discord.Guild) -> None:
        """Kicked, banned, or the server deleted: its memory is erased
        ARXIVSCOUT_UNINSTALLED_KEEP_DAYS later (memory/governance_tenants.py), unless the bot
        joins it again. People's DMs with the bot are theirs: never erased so."""
        upkeep = self.handler.agent.harness.upkeep
        await self.now_or_later("a server's removal", lambda: upkeep.bot_removed(str(guild.id)))

    async def guilds_back(self, guilds: Sequence[discord.Guild]) -> None:
        """Servers the bot is in (joined, or found at connect): their erasures are off."""
        upkeep, tenants = self.handler.agent.harness.upkeep, [str(g.id) for g in guilds]
        await self.now_or_later("a server's return", lambda: upkeep.bot_returned(*tenants))

    # -- messages: filter, de-duplicate, queue ---------------------------------------------

    async def handle_message(self, message: discord.Message) -> None:
        """Queue a turn for a message the bot should answer; ignore everything else. Discord
        does not redeliver: while the memory is unreachable, or Discord fails in passing to
        open the message's thread, the message is kept here and tried again (a person who
        addressed the bot is told once; chatter in threads that may not be the bot's is
        tried again silently). Every step is safe to repeat: a retry after a try that got
        further than it knew (a push that timed out after Redis ran it, a thread opened
        before Redis failed) queues the message once, in its thread. A message already
        kept (read again by the catch-up, or redelivered) is not kept, nor told, twice. One
        given up (its hour of retries out, at stop(), or another error) is recorded and lets
        go of its de-duplication claim, so the next READY's catch-up fetches and takes it
        again (within the catch-up's WINDOW: see DISCORD_FAILED)."""
        delivery = uuid.uuid4().hex  # its retries below are this delivery, not a redelivery
        try:
            await self._take(message, delivery)
        except Exception as exc:
            if isinstance(exc, DiscordFailed):
                notice: str | None = exc.notice
            elif not_queued_for_now(exc):  # unsure whether it is for the bot: say so only if
                notice = NOT_TAKEN if self.addressed(message) else None  # it surely is
            else:  # given up at once, as a retry failing so would be
                await self._let_go(message, delivery)
                raise
            if message.id in self._kept:  # another delivery's retries go on, and told: any
                # claim this one took is let go, or those retries would take it for a duplicate
                await self._let_go(message, delivery, record=False)
                return
            self._keep(message, delivery)
            if notice is not None:
                await self._reply_quietly(message, notice)

    def _keep(self, message: discord.Message, delivery: str) -> None:
        """`message`'s retries, one loop per message id."""
        task = self._retry_later(
            f"message {message.id}",
            lambda: self._take(message, delivery),
            lambda: self._let_go(message, delivery),
        )
        self._kept[message.id] = task

        def forget(done: asyncio.Task) -> None:
            if self._kept.get(message.id) is done:
                del self._kept[message.id]

        task.add_done_callback(forget)

    async def _let_go(self, message: discord.Message, delivery: str, record: bool = True) -> bool:
        """A message given up before its work was queued is recorded as given up (`record`:
        not when another delivery's retries go on) and lets go of its de-duplication claim, if
        `delivery` still holds it: the next catch-up fetches it (or a redelivery takes it)
        again, however far its place's cursor went meanwhile.
        Best effort: a failure is logged (the claim then lapses within the hour); False when
        the memory was unreachable."""
        tenant = self._claims.pop(delivery, None)
        if tenant is None:  # never claimed, or its work was queued: the claim stays
            return True
        try:  # recorded even if another delivery took the claim since: it may give up too
            if record:  # the record and the claim's letting go are one step
                await self.catchup.given_up(tenant, message, (claim_id(message), delivery))
            else:
                await self.handler.memory.events.let_go(tenant, claim_id(message), delivery)
        except Exception as exc:
            log.warning("message %s keeps its de-duplication claim: %r", message.id, exc)
            return not not_queued_for_now(exc)
        return True

    def addressed(self, message: discord.Message) -> bool:
        """Surely for the bot, whatever the memory knows: a mention, a DM, or a message in a
        thread the bot opened."""
        me = self.client.user
        if me is None or message.author.bot or message.author.id == me.id:
            return False
        channel = message.channel
        return (
            self.mentions_me(message, me.id)
            or isinstance(channel, discord.DMChannel)
            or (isinstance(channel, discord.Thread) and channel.owner_id == me.id)
        )

    async def _take(self, message: discord.Message, delivery: str) -> None:
        route = await self._queue(message, delivery)
        await self.catchup.seen(message, route.scope.tenant if route else None)

    async def _queue(self, message: discord.Message, delivery: str) -> Route | None:
        """Queue the message's turn; its route, or None when the bot stays quiet."""
        me = self.client.user
        if me is None or message.author.bot or message.author.id == me.id:
            return None
        if message.type not in ANSWERED_TYPES:
            return None
        mentioned = self.mentions_me(message, me.id)
        route = await self.route(message, mentioned)
        if route is None:
            return None
        tenant = route.scope.tenant
        self._claims[delivery] = tenant  # before: a claim whose answer is lost is let go too
        if not await self.handler.memory.events.first_time(
            tenant, claim_id(message), taker=delivery
        ):
            self._claims.pop(delivery, None)  # another delivery's
            return route
        text = self.question_text(message, me.id)
        addressed = mentioned or isinstance(message.channel, discord.DMChannel)
        pdfs = shared_attachments(message, addressed)  # adapters/discord_files.py
        if not text and not pdfs:  # a bare mention; or, without Message Content, any follow-up
            # nothing queued: the claim is given back, so an edit of it into a question (in
            # the hour the claim would hold) is taken (adapters/discord_changes.py); the hint
            # has its own, so a redelivery does not give it twice
            await self._let_go(message, delivery, record=False)
            hint = f"{claim_id(message)}:hint"
            if mentioned and await self.handler.memory.events.first_time(tenant, hint):
                await self._reply_quietly(message, EMPTY_MENTION)
            return route
        if route.open_thread:
            opened = await self._open_thread(message, route, text or pdfs[0].filename)
            if opened is None:  # refused, and the person told: not tried again
                self._claims.pop(delivery, None)
                return route
            route = opened
        elif isinstance(message.channel, discord.Thread):  # found if its channel is deleted
            await self.places.note_thread(
                route.scope.tenant, str(message.channel.parent_id), str(message.channel.id)
            )
        if pdfs and await self.files.submit(message, pdfs, route.scope, route.channel_id, text):
            pass  # read first; the text then runs as a turn (it sees them)
        elif text:  # queued once per message id, however often this is retried
            job = Job(
                "turn", route.scope, text, event_id=f"discord-job:{message.id}",
                reply={"channel_id": route.channel_id}, id=turn_job_id(message.id),
                source=discord_source(message.id),
            )  # fmt: skip
            await self.pipeline.submit(job, notify=False)
        self._claims.pop(delivery, None)  # queued: the claim stays (so does the job's own id)
        if mentioned and isinstance(message.channel, discord.Thread):
            await self.presence.join(route.scope)  # a thread someone else opened
        return route

    async def now_or_later(self, what: str, take: Take) -> None:
        """Queue a platform event's work (`take`). Discord sends an event once: while the
        memory is unreachable, it is kept here and tried again (`_retry_later`)."""
        try:
            await take()
        except Exception as exc:
            if not not_queued_for_now(exc):
                raise
            self._retry_later(what, take)

    def _retry_later(self, what: str, take: Take, give_up: GiveUp | None = None) -> asyncio.Task:
        """Call `take` again every few seconds, for an hour (`resubmit_tries`), until the
        memory (or Discord) is back; then, or on another error, it is given up (`give_up`)."""

        async def retry() -> None:
            for _ in range(self.resubmit_tries):
                await asyncio.sleep(self.resubmit_every_seconds)
                try:
                    await take()
                    return
                except Exception as exc:
                    if not (isinstance(exc, DiscordFailed) or not_queued_for_now(exc)):
                        log.exception("%s could not be queued", what)
                        break
            else:
                log.error("memory or Discord stayed unavailable; %s not taken", what)
            if give_up is not None:
                await give_up()

        task = asyncio.create_task(retry())
        self._waiting[task] = Waiting(what, take, give_up)
        task.add_done_callback(lambda done: self._waiting.pop(done, None))
        return task

    async def stop(self) -> None:
        """On SIGTERM/SIGINT, before the client closes: no more catching up; running turns
        finish or go back to the queue (their progress kept); what waits for the memory (or
        for Discord) gets one last try, all within `last_tries_seconds`, and what still cannot
        be taken is logged and given up (a message is recorded as given up and lets go of its
        de-duplication claim, so the next READY's catch-up fetches and takes it again). The
        whole of it ends STOP_WITHIN_SECONDS after it began, so the runtime and client still
        close before the platform kills the process: the last tries get what the turns left of
        it, but for the letting go's GIVE_UP_SECONDS. Once the memory proves unreachable, or
        the time is out, the rest is not tried; Discord failing for one message says nothing
        of the others, which are still tried."""
        loop = asyncio.get_running_loop()
        stop_by = loop.time() + STOP_WITHIN_SECONDS
        tries_by = stop_by - GIVE_UP_SECONDS
        await self.catchup.stop()
        await self.pipeline.shutdown(
            grace=max(0.0, min(SHUTDOWN_GRACE_SECONDS, tries_by - loop.time()))
        )
        waiting = list(self._waiting.items())
        for task, _ in waiting:
            task.cancel()
        await asyncio.gather(*(task for task, _ in waiting), return_exceptions=True)
        untried: list[Waiting] = []  # the memory unreachable, or no time left
        failed: list[Waiting] = []  # Discord's failure, or any other error
        deadline = min(loop.time() + self.last_tries_seconds, tries_by)
        for index, (_, kept) in enumerate(waiting):
            try:
                async with asyncio.timeout_at(deadline):
                    await kept.take()
            except Exception as exc:
                log.warning("%s could not be taken before stopping: %r", kept.what, exc)
                out_of_time = isinstance(exc, TimeoutError) and loop.time() >= deadline
                if out_of_time or not_queued_for_now(exc):
                    untried = [rest for _, rest in waiting[index:]]
                    break
                failed.append(kept)
        if untried:
            log.error(
                "stopped with the memory unreachable (or out of time); not taken: %s",
                ", ".join(kept.what for kept in untried),
            )
        if failed:
            log.error(
                "stopped with Discord (or another error) failing: %s",
                ", ".join(kept.what for kept in failed),
            )
        await self._give_up_all([*failed, *untried], stop_by)

    @staticmethod
    async def _give_up_all(given_up: list[Waiting], stop_by: float) -> None:
        """At stop(), what was not taken is given up, all at once, within what is left of
        stop()'s time (what is not let go then lapses in time)."""
        giving_up = [kept.give_up() for kept in given_up if kept.give_up is not None]
        try:
            async with asyncio.timeout_at(stop_by):
                await asyncio.gather(*giving_up)
        except TimeoutError:
            log.warning("out of time giving up what was not taken before stopping")

    async def route(self, message: discord.Message, mentioned: bool) -> Route | None:
        """Which conversation a message belongs to, or None if the bot should stay quiet."""
        channel, author = message.channel, message.author
        if message.guild is None:
            if not isinstance(channel, discord.DMChannel):
                return None
            tenant, thread = f"dm-{author.id}", f"discord:dm:{channel.id}"
        else:
            tenant = str(message.guild.id)
            thread = f"discord:{tenant}:{channel.id}"
        scope = Scope(
            tenant, thread, str(channel.id),
            await resolve_visibility(self.client, channel, channel.id), str(author.id),
            author.display_name,
        )  # fmt: skip
        if message.guild is None:
            return Route(scope, channel.id)
        if isinstance(channel, discord.Thread):
            if not (mentioned or await self.knows_thread(scope, channel.owner_id)):
                return None
            return Route(scope, channel.id)
        if not mentioned:
            return None
        if isinstance(channel, discord.TextChannel):
            return Route(scope, channel.id, open_thread=True)
        # voice-channel chat and the like cannot hold threads: the channel is the conversation
        return Route(scope, channel.id)

    async def _open_thread(self, message: discord.Message, route: Route, text: str) -> Route | None:
        thread = await self._thread_of(message)  # opened by an earlier try of this message
        if thread is None:
            thread = await self._new_thread(message, route, text)
            if thread is None:
                return None
        # the thread is the place from now on: its follow-ups arrive with its own channel id
        scope = replace(
            route.scope, thread=f"discord:{route.scope.tenant}:{thread.id}", channel=str(thread.id)
        )
        await self.presence.join(scope)
        await self.places.note_thread(route.scope.tenant, str(route.channel_id), str(thread.id))
        await self.catchup.opened(route.scope.tenant, thread.id, message.id)
        return Route(scope, thread.id)

    async def _new_thread(
        self, message: discord.Message, route: Route, text: str
    ) -> discord.Thread | None:
        """The thread opened from `message`, or None when Discord refuses it (the person is
        told why). Discord failing in passing (a server error, a rate limit, the network)
        raises DiscordFailed: the message is taken again later, never dropped."""
        passing = self.pipeline.platform.passing
        try:
            return await message.create_thread(name=thread_name(text))
        except Exception as exc:
            failed = exc
        try:  # a try whose answer was lost (or an earlier one) may have opened it
            thread = await self._thread_of(message, ask_discord=True)
        except Exception as exc:
            if passing(exc):
                raise DiscordFailed(exc) from exc
            raise
        if thread is not None:
            return thread
        if passing(failed):
            log.warning("Discord failed to open a thread in %s: %r", route.channel_id, failed)
            raise DiscordFailed(failed) from failed
        if not isinstance(failed, discord.HTTPException):
            raise failed
        log.warning("could not open a thread in channel %s: %s", route.channel_id, failed)
        if isinstance(failed, discord.Forbidden):
            await self._reply_quietly(message, NO_THREAD_ALLOWED)
        else:
            text = f"Discord would not open a thread for this (HTTP {failed.status})."
            await self._reply_quietly(message, text)  # its own wording is not for people
        return None

    async def _thread_of(
        self, message: discord.Message, ask_discord: bool = False
    ) -> discord.Thread | None:
        """The thread opened from `message` (it has the message's id), if any: cached, or
        asked of Discord."""
        found = self.client.get_channel(message.id)
        if found is None and ask_discord:
            with contextlib.suppress(discord.HTTPException):
                found = await self.client.fetch_channel(message.id)
        return found if isinstance(found, discord.Thread) else None

    @staticmethod
    def _my_roles(message: discord.Message, my_id: int) -> list[int]:
        """Mentioned roles that are the bot's own managed role (Discord autocompletes those)."""
        return [
            r.id for r in message.role_mentions if r.tags is not None and r.tags.bot_id == my_id
        ]

    def mentions_me(self, message: discord.Message, my_id: int) -> bool:
        mentioned = any(user.id == my_id for user in message.mentions)
        return mentioned or bool(self._my_roles(message, my_id))

    def question_text(self, message: discord.Message, my_id: int) -> str:
        """A person's message as the bot takes it (new or edited): its mentions of the bot, or
        of the bot's own role, taken out."""
        ids = "|".join([rf"!?{my_id}", *(rf"&{role}" for role in self._my_roles(message, my_id))])
        return re.sub(rf"<@(?:{ids})>", "", message.content).strip()

    @staticmethod
    async def _reply_quietly(message: discord.Message, text: str) -> None:
        """A reply Discord fails to take (its API, the network) is skipped."""
        try:
            await message.reply(text)
        except UNSENT as exc:
            log.info("a reply could not be sent to message %s: %r", message.id, exc)

    async def knows_thread(self, scope: Scope, owner_id: int | None = None) -> bool:
        """A thread the bot opened, or one where it was mentioned before (by any process)."""
        me = self.client.user
        if me is not None and owner_id == me.id:
            return True
        return await self.presence.joined(scope)
