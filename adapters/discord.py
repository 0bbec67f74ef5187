"""The Discord adapter (discord.py): translates gateway events to turns and back.

- A mention of the bot in a server text channel opens a thread from that message and answers
  there. Later messages in that thread need no mention; nor do messages in any thread where
  the bot was mentioned once (participation is kept in Redis, so it holds across restarts and
  processes). Direct messages are answered in the DM channel.
- Memory keys: thread id `discord:<guild>:<thread>` and tenant = the server (guild id); in DMs
  thread id `discord:dm:<channel>` and tenant `dm-<user>`, so a user's DMs are their own
  memory, never a server's.
- The bot's own messages, other bots and system messages are ignored. Message ids are
  de-duplicated (the gateway can redeliver on resume); turns run in `ThreadDispatcher`, one at
  a time per thread in arrival order, across every process sharing the Redis. Jobs hold ids,
  not discord.py objects: the channel is looked up when the job runs.
- Slash commands `/summarize` (in a thread the bot answers in, or a DM) and `/expand
  <summary_id>` (anywhere in the server or a DM).
- Replies are split under 2,000 characters at paragraph or code-block boundaries; a typing
  indicator shows while a turn runs, and a status message lists the tool steps.

Intents (Developer Portal → Bot → Privileged Gateway Intents): **Message Content** must be
enabled, or follow-ups without a mention arrive empty. The client asks for `guilds`,
`guild_messages`, `dm_messages` and `message_content`. Invite the bot with the `bot` and
`applications.commands` scopes and the permissions View Channels, Send Messages, Create Public
Threads, Send Messages in Threads and Read Message History.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass

import discord
from discord import app_commands
from redis.asyncio import Redis

from adapters.text import split_message
from bot.agent import AgentEvent
from bot.config import ConfigError
from bot.dispatch import Deduplicator, Job, ThreadDispatcher
from bot.tools import TOOL_ACTIVITY
from bot.turns import TurnHandler
from memory.keys import ROOT

log = logging.getLogger(__name__)

DISCORD_LIMIT = 2000
THREAD_NAME_LIMIT = 100
THREADS_KEY = f"{ROOT}:discord:threads"  # set of thread ids the bot answers in
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
    """Where a message's turn goes: memory keys and the channel to answer in."""

    tenant: str
    thread_id: str
    channel_id: int
    open_thread: bool = False  # a mention in a channel: open a thread from the message first


class _Client(discord.Client):
    """A discord.Client whose events go to the adapter."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        super().__init__(intents=intents(), allowed_mentions=discord.AllowedMentions.none())
        self.adapter = adapter

    async def setup_hook(self) -> None:
        await self.adapter.sync_commands()

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s in %d servers", self.user, len(self.guilds))

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter.handle_message(message)


class DiscordAdapter:
    def __init__(
        self,
        handler: TurnHandler,
        redis: Redis,
        *,
        sync: bool = True,
        sync_guild: int | None = None,
    ) -> None:
        self.handler = handler
        self.redis = redis
        self.sync = sync
        self.sync_guild = sync_guild
        self.client = _Client(self)
        self.tree = app_commands.CommandTree(self.client)
        self.dedup = Deduplicator(redis)
        self.dispatcher = ThreadDispatcher(redis, self.run_job)
        self._register_commands()

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
        """Register the slash commands (a guild sync shows up at once, a global one later)."""
        if not self.sync:
            return
        try:
            if self.sync_guild is not None:
                guild = discord.Object(id=self.sync_guild)
                self.tree.copy_global_to(guild=guild)
                await self.tree.sync(guild=guild)
            await self.tree.sync()
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

    # -- messages: filter, de-duplicate, queue ---------------------------------------------

    async def handle_message(self, message: discord.Message) -> None:
        """Queue a turn for a message the bot should answer; ignore everything else."""
        me = self.client.user
        if me is None or message.author.bot or message.author.id == me.id:
            return
        if message.type not in ANSWERED_TYPES:
            return
        mentioned = self._mentions_me(message, me.id)
        route = await self.route(message, mentioned)
        if route is None:
            return
        if not await self.dedup.first_time(f"discord:{message.id}"):
            return
        text = self._strip_mention(message, me.id)
        if not text:  # a bare mention; or, without the Message Content intent, any follow-up
            if mentioned:
                await self._reply_quietly(message, EMPTY_MENTION)
            return
        if route.open_thread:
            route = await self._open_thread(message, route, text)
            if route is None:
                return
        job = {"kind": "turn", "event_id": f"discord:{message.id}", "message_id": message.id,
               "channel_id": route.channel_id, "tenant": route.tenant,
               "thread_id": route.thread_id, "user": str(message.author.id), "text": text}  # fmt: skip
        self.handler.prefetch(text)
        await self.dispatcher.submit(route.thread_id, job)
        if mentioned and isinstance(message.channel, discord.Thread):
            await self.remember_thread(message.channel.id)  # a thread someone else opened

    async def route(self, message: discord.Message, mentioned: bool) -> Route | None:
        """Which conversation a message belongs to, or None if the bot should stay quiet."""
        channel = message.channel
        if message.guild is None:
            if not isinstance(channel, discord.DMChannel):
                return None
            return Route(f"dm-{message.author.id}", f"discord:dm:{channel.id}", channel.id)
        tenant = str(message.guild.id)
        if isinstance(channel, discord.Thread):
            if not (mentioned or await self.knows_thread(channel.id, channel.owner_id)):
                return None
            return Route(tenant, f"discord:{tenant}:{channel.id}", channel.id)
        if not mentioned:
            return None
        if isinstance(channel, discord.TextChannel):
            return Route(tenant, "", channel.id, open_thread=True)
        # voice-channel chat and the like cannot hold threads: the channel is the conversation
        return Route(tenant, f"discord:{tenant}:{channel.id}", channel.id)

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
        await self.remember_thread(thread.id)
        return Route(route.tenant, f"discord:{route.tenant}:{thread.id}", thread.id)

    @staticmethod
    def _my_roles(message: discord.Message, my_id: int) -> list[int]:
        """Mentioned roles that are the bot's own managed role (Discord autocompletes those)."""
        return [
            r.id for r in message.role_mentions if r.tags is not None and r.tags.bot_id == my_id
        ]

    def _mentions_me(self, message: discord.Message, my_id: int) -> bool:
        mentioned = any(user.id == my_id for user in message.mentions)
        return mentioned or bool(self._my_roles(message, my_id))

    def _strip_mention(self, message: discord.Message, my_id: int) -> str:
        ids = "|".join([rf"!?{my_id}", *(rf"&{role}" for role in self._my_roles(message, my_id))])
        return re.sub(rf"<@(?:{ids})>", "", message.content).strip()

    @staticmethod
    async def _reply_quietly(message: discord.Message, text: str) -> None:
        with contextlib.suppress(discord.HTTPException):
            await message.reply(text)

    # -- Redis bookkeeping -----------------------------------------------------------------

    async def remember_thread(self, thread_id: int) -> None:
        await self.redis.sadd(THREADS_KEY, str(thread_id))

    async def knows_thread(self, thread_id: int, owner_id: int | None = None) -> bool:
        """A thread the bot opened, or one where it was mentioned before (by any process)."""
        me = self.client.user
        if me is not None and owner_id == me.id:
            return True
        return bool(await self.redis.sismember(THREADS_KEY, str(thread_id)))

    # -- jobs: one at a time per thread ----------------------------------------------------

    async def run_job(self, job: Job) -> None:
        """Run one queued turn: typing indicator, tool-step status, the reply in parts."""
        channel = await self._channel(job["channel_id"])
        if channel is None:
            log.warning("channel %s is gone; dropping %s", job["channel_id"], job["event_id"])
            return
        status = _StepStatus(channel)
        try:
            async with channel.typing():
                reply = await self.handler.handle(
                    job["tenant"], job["thread_id"], job["user"], job["text"],
                    on_event=status.update,
                )  # fmt: skip
        except Exception:
            log.exception("turn failed in %s", job["thread_id"])
            await self.send(channel, "Sorry, something went wrong on my side. Please try again.")
            return
        await self.send(channel, reply.text)

    async def _channel(self, channel_id: int) -> discord.abc.Messageable | None:
        channel = self.client.get_channel(channel_id)
        if channel is None:
            try:
                channel = await self.client.fetch_channel(channel_id)
            except (discord.NotFound, discord.Forbidden):
                return None
        return channel if isinstance(channel, discord.abc.Messageable) else None

    @staticmethod
    async def send(channel: discord.abc.Messageable, text: str) -> None:
        for part in split_message(text, DISCORD_LIMIT) or ["(no answer)"]:
            await channel.send(part)

    # -- slash commands --------------------------------------------------------------------

    async def summarize_command(self, interaction: discord.Interaction) -> None:
        scope = await self._thread_scope(interaction)
        if scope is None:
            await interaction.response.send_message(NOT_IN_THREAD, ephemeral=True)
            return
        await interaction.response.defer(thinking=True)
        await self._followup(interaction, await self.handler.summarize(*scope))

    async def expand_command(self, interaction: discord.Interaction, summary_id: str) -> None:
        await interaction.response.defer(thinking=True)
        await self._followup(
            interaction, await self.handler.expand(self._tenant(interaction), summary_id)
        )

    @staticmethod
    def _tenant(interaction: discord.Interaction) -> str:
        if interaction.guild_id is None:
            return f"dm-{interaction.user.id}"
        return str(interaction.guild_id)

    async def _thread_scope(self, interaction: discord.Interaction) -> tuple[str, str] | None:
        """(tenant, thread id) of the conversation a command was used in, if the bot has one."""
        tenant, channel_id = self._tenant(interaction), interaction.channel_id
        if channel_id is None:
            return None
        if interaction.guild_id is None:
            return tenant, f"discord:dm:{channel_id}"
        channel = interaction.channel
        owner_id = channel.owner_id if isinstance(channel, discord.Thread) else None
        if await self.knows_thread(channel_id, owner_id):
            return tenant, f"discord:{tenant}:{channel_id}"
        return None

    @staticmethod
    async def _followup(interaction: discord.Interaction, text: str) -> None:
        for part in split_message(text, DISCORD_LIMIT) or ["(nothing to show)"]:
            await interaction.followup.send(part)


class _StepStatus:
    """One status message per turn, edited as tools start and finish."""

    def __init__(self, channel: discord.abc.Messageable) -> None:
        self.channel = channel
        self.lines: list[str] = []
        self.message: discord.Message | None = None

    async def update(self, event: AgentEvent) -> None:
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
