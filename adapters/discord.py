"""The Discord adapter (discord.py): gateway events in, `Job`s out; typing, a step status and
messages back. Everything between is the spine's (`adapters/spine.py`).

- A mention of the bot in a server text channel opens a thread from that message and answers
  there. Later messages in that thread need no mention; nor do messages in any thread where
  the bot was mentioned once (participation is kept in Redis, so it holds across restarts and
  processes). Direct messages are answered in the DM channel.
- Scope: thread `discord:<guild>:<thread>` and tenant = the server (guild id); a channel that
  `@everyone` cannot view (and its threads) is private, and so is a private thread anywhere
  (audience `private:<thread>`: its members' and Manage Threads holders'). A thread whose
  parent is not cached has its parent fetched first; what Discord cannot tell is private. In
  DMs thread `discord:dm:<channel>` and tenant `dm-<user>`, so a user's DMs are their own
  memory, never a server's.
- Changes people make on Discord are followed (adapters/discord_changes.py): a message
  deleted is forgotten, one edited gets its new text in memory (the edit is not answered), a
  channel or thread deleted is forgotten whole, with the threads the bot took part in under it
  (recorded as they come, since a thread's id does not name its channel) and its watches.
- The bot's own messages, other bots and system messages are ignored. The spine de-duplicates
  message ids (the gateway can redeliver on resume) and runs a thread's turns one at a time in
  arrival order, across every process sharing the Redis. Jobs hold ids, not discord.py
  objects: the channel is looked up when the job runs.
- Slash commands `/summarize` (in a thread the bot answers in, or a DM), `/expand
  <summary_id>` (anywhere in the server or a DM) and `/memory` (an ephemeral signed link to the
  memory page, for that person in that server, or for their DMs' memory in a DM).
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import discord
from discord import app_commands

from adapters.discord_changes import DiscordChanges
from adapters.discord_feedback import DiscordFeedback, send_options
from adapters.discord_files import DiscordFiles, shared_attachments
from adapters.discord_watch import DiscordWatches
from adapters.memory_page.access import Admins
from adapters.memory_page.auth import NOT_SERVED, Links
from adapters.platform_ids import discord_source, discord_tenant
from adapters.spine import (
    NOT_TAKEN,
    Job,
    Pipeline,
    Platform,
    Status,
    feedback_turn,
    not_queued_for_now,
)
from adapters.text import link_arxiv, split_for_delivery
from bot.agent import AgentEvent
from bot.errors import ConfigError
from bot.feedback import FeedbackService
from bot.tools import TOOL_ACTIVITY
from bot.turns import TurnHandler
from memory.scope import Scope, Visibility

log = logging.getLogger(__name__)

DISCORD_LIMIT = 2000
THREAD_NAME_LIMIT = 100
RESUBMIT_EVERY_SECONDS = 5.0
RESUBMIT_TRIES = 720  # an hour: Discord does not redeliver a message, so this process keeps it
ASK_DISCORD_SECONDS = 1.5  # a lookup of who sees a channel (a command has 3 s to answer)
ANSWERED_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NOT_IN_THREAD = (
    "Use /summarize inside a thread where I have answered (mention me in a channel to start "
    "one) or in a direct message with me."
)
EMPTY_MENTION = (
    "Ask me about arXiv papers: mention me with a question, e.g. `@ArxivScout find MemGPT`."
)


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
    if len(line) > THREAD_NAME_LIMIT:
        line = line[: THREAD_NAME_LIMIT - 1].rstrip() + "…"
    return line or "ArxivScout"


@dataclass(frozen=True)
class Route:
    """Where a message's turn goes: its scope and the channel to answer in."""

    scope: Scope
    channel_id: int
    open_thread: bool = False  # a mention in a channel: open a thread from the message first


def visibility(channel: discord.abc.Messageable) -> Visibility:
    """A DM; a private thread (its members' and Manage Threads holders', whatever its parent);
    a channel (or a thread's parent) that @everyone cannot view; or public. What the cache
    cannot settle (a thread whose parent is not cached, a server whose roles are not) is
    private: memory never crosses a privacy line because of a cache miss. `resolve_visibility`
    fetches the parent first."""
    if isinstance(channel, discord.DMChannel):
        return Visibility.DM
    if isinstance(channel, discord.Thread) and channel.type is discord.ChannelType.private_thread:
        return Visibility.PRIVATE
    parent = channel.parent if isinstance(channel, discord.Thread) else channel
    guild = getattr(parent, "guild", None)
    everyone = getattr(guild, "default_role", None)
    if parent is None or everyone is None or not hasattr(parent, "permissions_for"):
        return Visibility.PRIVATE
    seen = parent.permissions_for(everyone).view_channel
    return Visibility.PUBLIC if seen is not False else Visibility.PRIVATE


async def resolve_visibility(
    client: discord.Client, channel: discord.abc.Messageable | None, channel_id: int | None
) -> Visibility:
    """`visibility`, after fetching from Discord what the cache lacks: the channel itself (a
    command's channel may come uncached, built from the interaction's partial data, which
    need not carry its permission overwrites) or a thread's parent. When Discord cannot tell
    (no access, an error, no answer), the place is private."""
    try:  # bounded: a command must be answered within 3 s
        async with asyncio.timeout(ASK_DISCORD_SECONDS):
            if channel is None or _not_cached(client, channel):
                if channel_id is None:
                    return Visibility.PRIVATE
                channel = await client.fetch_channel(channel_id)
            if (
                isinstance(channel, discord.Thread)
                and channel.parent is None
                and channel.type is not discord.ChannelType.private_thread
            ):
                return visibility(await client.fetch_channel(channel.parent_id))
    except Exception as exc:  # an HTTP error, the network, no answer in time
        log.warning("Discord could not say who sees channel %s (%r): private", channel_id, exc)
        return Visibility.PRIVATE
    return visibility(channel)


def _not_cached(client: discord.Client, channel: discord.abc.Messageable) -> bool:
    """A server channel this client does not hold: its overwrites may be missing."""
    if isinstance(channel, discord.PartialMessageable):
        return True
    if isinstance(channel, discord.DMChannel) or getattr(channel, "guild", None) is None:
        return False
    return client.get_channel(channel.id) is None


class DiscordPlatform(Platform):
    name = "discord"
    limit = DISCORD_LIMIT

    def __init__(self, client: discord.Client) -> None:
        self.client = client

    def render(self, text: str) -> str:
        return link_arxiv(text)

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        channel = await self.channel(job.reply["channel_id"])
        if channel is None:
            raise LookupError(f"channel {job.reply['channel_id']} is gone")
        async with channel.typing():
            yield StepStatus(channel)

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        assert isinstance(status, StepStatus)
        await status.channel.send(part, **send_options(feedback_turn(job, index)))

    async def notice(self, job: Job, text: str) -> None:
        channel = await self.channel(job.reply["channel_id"])
        if channel is not None:
            await channel.send(text)

    async def channel(self, channel_id: int) -> discord.abc.Messageable | None:
        channel = self.client.get_channel(channel_id)
        if channel is None:
            try:
                channel = await self.client.fetch_channel(channel_id)
            except (discord.NotFound, discord.Forbidden):
                return None
        return channel if isinstance(channel, discord.abc.Messageable) else None


class _Client(discord.Client):
    """A discord.Client whose events go to the adapter."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        super().__init__(intents=intents(), allowed_mentions=discord.AllowedMentions.none())
        self.adapter = adapter

    async def setup_hook(self) -> None:
        self.adapter.pipeline.start()  # take over the threads of processes that died
        await self.adapter.sync_commands()

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s in %d servers", self.user, len(self.guilds))

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
    ) -> None:  # fmt: skip
        """`links`: the memory page's, for `/memory`; `admins`: ARXIVSCOUT_ADMINS, who manage
        every channel's watches as server managers do."""
        self.handler = handler
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
        self._waiting: set[asyncio.Task] = set()  # messages waiting for the memory to be back
        self._register_commands()
        DiscordWatches(
            handler.watches, self.client, self.pipeline.platform.channel, admins
        ).register(self.tree, self._command_scope)  # /watch, digests and their Save buttons

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

    async def sync_commands(self) -> None:
        """Register the slash commands: globally (shown within the hour), or in one server
        (shown at once)."""
        if not self.sync:
            return
        try:
            if self.sync_guild is None:
                await self.tree.sync()
            else:  # one server only: synced globally too, every command would show twice there
                guild = discord.Object(id=self.sync_guild)
                self.tree.copy_global_to(guild=guild)
                await self.tree.sync(guild=guild)
        except discord.HTTPException as exc:
            log.warning("could not sync slash commands: %s", exc)

    def _register_commands(self) -> None:
        @self.tree.command(name="summarize", description="Summarize this thread into memory.")
        async def summarize(interaction: discord.Interaction) -> None:
            await self.summarize_command(interaction)

        @self.tree.command(name="expand", description="Show a summary and the messages it covers.")
        @app_commands.describe(summary_id="the id shown as [Summary ID: ...]")
        async def expand(interaction: discord.Interaction, summary_id: str) -> None:
            await self.expand_command(interaction, summary_id)

        @self.tree.command(
            name="memory", description="Your link to what I remember (only you see it)."
        )
        async def memory(interaction: discord.Interaction) -> None:
            await self.memory_command(interaction)

    # -- messages: filter, de-duplicate, queue ---------------------------------------------

    async def handle_message(self, message: discord.Message) -> None:
        """Queue a turn for a message the bot should answer; ignore everything else. Discord
        does not redeliver: while the memory is unreachable, the message is kept here and
        tried again (the person is told once)."""
        delivery = uuid.uuid4().hex  # its retries below are this delivery, not a redelivery
        try:
            await self._take(message, delivery)
        except Exception as exc:
            if not not_queued_for_now(exc):
                raise
            await self._reply_quietly(message, NOT_TAKEN)
            self._retry_later(f"message {message.id}", lambda: self._take(message, delivery))

    async def _take(self, message: discord.Message, delivery: str) -> None:
        me = self.client.user
        if me is None or message.author.bot or message.author.id == me.id:
            return
        if message.type not in ANSWERED_TYPES:
            return
        mentioned = self.mentions_me(message, me.id)
        route = await self.route(message, mentioned)
        if route is None:
            return
        if not await self.handler.memory.events.first_time(
            route.scope.tenant, f"discord:{message.id}", taker=delivery
        ):
            return
        text = self.question_text(message, me.id)
        addressed = mentioned or isinstance(message.channel, discord.DMChannel)
        pdfs = shared_attachments(message, addressed)  # adapters/discord_files.py
        if not text and not pdfs:  # a bare mention; or, without Message Content, any follow-up
            if mentioned:
                await self._reply_quietly(message, EMPTY_MENTION)
            return
        if route.open_thread:
            route = await self._open_thread(message, route, text or pdfs[0].filename)
            if route is None:
                return
        elif isinstance(message.channel, discord.Thread):  # found if its channel is deleted
            await self.places.note_thread(
                route.scope.tenant, str(message.channel.parent_id), str(message.channel.id)
            )
        if pdfs and await self.files.submit(message, pdfs, route.scope, route.channel_id, text):
            pass  # read first; the text then runs as a turn (it sees them)
        elif text:  # the message id was de-duplicated above; the job goes in as a new one
            job = Job(
                "turn", route.scope, text, reply={"channel_id": route.channel_id},
                source=discord_source(message.id),
            )  # fmt: skip
            await self.pipeline.submit(job, notify=False)
        if mentioned and isinstance(message.channel, discord.Thread):
            await self.presence.join(route.scope)  # a thread someone else opened

    async def now_or_later(self, what: str, take: Callable[[], Awaitable[object]]) -> None:
        """Queue a platform event's work (`take`). Discord sends an event once: while the
        memory is unreachable, it is kept here and tried again (`_retry_later`)."""
        try:
            await take()
        except Exception as exc:
            if not not_queued_for_now(exc):
                raise
            self._retry_later(what, take)

    def _retry_later(self, what: str, take: Callable[[], Awaitable[object]]) -> None:
        """Call `take` again every few seconds, for an hour, until the memory is back."""

        async def retry() -> None:
            for _ in range(RESUBMIT_TRIES):
                await asyncio.sleep(RESUBMIT_EVERY_SECONDS)
                try:
                    await take()
                    return
                except Exception as exc:
                    if not not_queued_for_now(exc):
                        log.exception("%s could not be queued", what)
                        return
            log.error("memory stayed unavailable; %s not taken", what)

        task = asyncio.create_task(retry())
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

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
        try:
            thread = await message.create_thread(name=thread_name(text))
        except discord.HTTPException as exc:
            log.warning("could not open a thread in channel %s: %s", route.channel_id, exc)
            await self._reply_quietly(
                message,
                "I could not open a thread for this (I need the Create Public Threads and Send "
                "Messages in Threads permissions here).",
            )
            return None
        # the thread is the place from now on: its follow-ups arrive with its own channel id
        scope = replace(
            route.scope, thread=f"discord:{route.scope.tenant}:{thread.id}", channel=str(thread.id)
        )
        await self.presence.join(scope)
        await self.places.note_thread(route.scope.tenant, str(route.channel_id), str(thread.id))
        return Route(scope, thread.id)

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
        with contextlib.suppress(discord.HTTPException):
            await message.reply(text)

    async def knows_thread(self, scope: Scope, owner_id: int | None = None) -> bool:
        """A thread the bot opened, or one where it was mentioned before (by any process)."""
        me = self.client.user
        if me is not None and owner_id == me.id:
            return True
        return await self.presence.joined(scope)

    # -- slash commands --------------------------------------------------------------------

    async def summarize_command(self, interaction: discord.Interaction) -> None:
        scope = await self._command_scope(interaction)
        channel = interaction.channel
        owner_id = channel.owner_id if isinstance(channel, discord.Thread) else None
        known = interaction.guild_id is None or await self.knows_thread(scope, owner_id)
        if interaction.channel_id is None or not known:
            await interaction.response.send_message(NOT_IN_THREAD, ephemeral=True)
            return
        await interaction.response.defer(thinking=True)
        await self._followup(interaction, await self.handler.summarize(scope))

    async def expand_command(self, interaction: discord.Interaction, summary_id: str) -> None:
        await interaction.response.defer(thinking=True)
        scope = await self._command_scope(interaction)
        await self._followup(interaction, await self.handler.expand(scope, summary_id))

    async def memory_command(self, interaction: discord.Interaction) -> None:
        await interaction.response.send_message(self.memory_link(interaction), ephemeral=True)

    def memory_link(self, interaction: discord.Interaction) -> str:
        """The answer to `/memory`: a link for this person in this server (the tenant, as for
        their messages), or for their DMs' memory when used in a DM."""
        if self.links is None:
            return NOT_SERVED
        tenant, _, user = self._command_place(interaction)
        url = self.links.login(tenant, str(user.id), "discord")
        minutes = self.links.ttl // 60
        return (
            f"[Open your ArxivScout memory page](<{url}>): what I remember that you may see. "
            f"The link is yours alone and works for {minutes} minutes."
        )

    async def _command_scope(self, interaction: discord.Interaction) -> Scope:
        """The conversation a command was used in (its channel is the thread's id part)."""
        tenant, thread, user = self._command_place(interaction)
        seen = await resolve_visibility(self.client, interaction.channel, interaction.channel_id)
        return Scope(
            tenant, thread, str(interaction.channel_id), seen, str(user.id), user.display_name
        )

    @staticmethod
    def _command_place(interaction: discord.Interaction) -> tuple[str, str, discord.abc.User]:
        """A command's tenant, thread and user: all a memory link needs."""
        tenant = discord_tenant(interaction)
        if interaction.guild_id is None:
            return tenant, f"discord:dm:{interaction.channel_id}", interaction.user
        return tenant, f"discord:{tenant}:{interaction.channel_id}", interaction.user

    @staticmethod
    async def _followup(interaction: discord.Interaction, text: str) -> None:
        for part in split_for_delivery(link_arxiv(text), DISCORD_LIMIT) or ["(nothing to show)"]:
            await interaction.followup.send(part)


class StepStatus(Status):
    """One status message per turn, edited as tools start and finish."""

    def __init__(self, channel: discord.abc.Messageable) -> None:
        self.channel = channel
        self.lines: list[str] = []
        self.message: discord.Message | None = None

    async def event(self, event: AgentEvent) -> None:
        label = TOOL_ACTIVITY.get(event.name, event.name)
        if event.kind == "tool_start":
            self.lines.append(f"⏳ {label}…")
        elif event.kind == "tool_end" and self.lines:
            mark = "✅" if event.detail == "success" else "⚠️"
            self.lines[-1] = f"{mark} {label} ({event.detail})"
        elif event.kind == "compacted":
            self.lines.append(f"🗜️ older messages compacted (context was {event.detail} full)")
        text = "\n".join(self.lines)[-DISCORD_LIMIT:]
        if not text:
            return
        with contextlib.suppress(discord.HTTPException):
            if self.message is None:
                self.message = await self.channel.send(text)
            else:
                await self.message.edit(content=text)
