"""The Discord slash commands (the adapter's `commands`), on the adapter's command tree:

- `/summarize`: in a thread the bot answers in (it opened it, or was mentioned there) or a DM,
  the conversation is summarized into memory; elsewhere, an ephemeral word on where it works.
- `/expand <summary_id>`: a summary and the messages it covers, anywhere in the server or a DM
  (an id naming none, or an error: only to the person, as on Slack, however long it took).
- `/memory`: an ephemeral signed link to the memory page, for that person in that server (the
  tenant, as for their messages), or for their DMs' memory in a DM.

A command's scope is its channel's, with who may see it asked of Discord where the cache cannot
tell (`scope`, used by the watch commands too). Memory is reached only through the adapter
(`knows_thread`) and its turn handler (`summarize`, `expand`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from adapters.discord_platform import DISCORD_LIMIT, defer, resolve_visibility, tell_privately
from adapters.memory_page.auth import NOT_SERVED
from adapters.platform_ids import discord_tenant
from adapters.text import link_arxiv, split_for_delivery
from bot.turns import COMMAND_MEMORY_DOWN, command_failure
from memory.scope import Scope, Visibility

if TYPE_CHECKING:
    from adapters.discord import DiscordAdapter

log = logging.getLogger(__name__)

# How long /summarize looks up, before its first answer, who sees the channel (Discord: not
# told in time, it is private) and whether the thread is one it answers in (memory: not told
# in time, it is said to be down): 2.0 s in all, leaving 1 s of Discord's 3 s to answer (or
# defer) for the gateway's delivery and the answer's POST, however long Discord took; a slow
# but working Redis still has its 1.2 s.
DISCORD_LOOKUP_SECONDS = 0.8
MEMORY_LOOKUP_SECONDS = 1.2
# What /expand's work (who sees the channel, then the summary) may take before it defers, the
# same 2.0 s in all; who sees the channel has no shorter limit there, as what it may show
# hangs on it.
EXPAND_WITHIN_SECONDS = DISCORD_LOOKUP_SECONDS + MEMORY_LOOKUP_SECONDS

UNSHOWN = "I could not show the answer to {command} here (Discord failed to take it). {what}"
SUMMARY_KEPT = "The summary was stored as [Summary ID: {id}]: `/expand {id}` shows it."
RUN_AGAIN = "Please run it again."
SUMMARY_ID = re.compile(r"\[Summary ID: ([^\]\s]+)\]")

NOT_IN_THREAD = (
    "Use /summarize inside a thread where I have answered (mention me in a channel to start "
    "one) or in a direct message with me."
)


class DiscordCommands:
    """`/summarize`, `/expand` and `/memory`, registered on the adapter's tree when made."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        self.adapter = adapter
        self.client = adapter.client
        self.tree = adapter.tree
        self._register()

    async def sync(self) -> None:
        """Register the slash commands: globally (shown within the hour), or in one server
        (shown at once)."""
        if not self.adapter.sync:
            return
        try:
            if self.adapter.sync_guild is None:
                await self.tree.sync()
            else:  # one server only: synced globally too, every command would show twice there
                guild = discord.Object(id=self.adapter.sync_guild)
                self.tree.copy_global_to(guild=guild)
                await self.tree.sync(guild=guild)
        except discord.HTTPException as exc:
            log.warning("could not sync slash commands: %s", exc)

    def _register(self) -> None:
        @self.tree.command(name="summarize", description="Summarize this thread into memory.")
        async def summarize(interaction: discord.Interaction) -> None:
            await self.summarize(interaction)

        @self.tree.command(name="expand", description="Show a summary and the messages it covers.")
        @app_commands.describe(summary_id="the id shown as [Summary ID: ...]")
        async def expand(interaction: discord.Interaction, summary_id: str) -> None:
            await self.expand(interaction, summary_id)

        @self.tree.command(
            name="memory", description="Your link to what I remember (only you see it)."
        )
        async def memory(interaction: discord.Interaction) -> None:
            await self.memory(interaction)

    async def summarize(self, interaction: discord.Interaction) -> None:
        deferred = False
        try:
            channel = interaction.channel
            owner_id = channel.owner_id if isinstance(channel, discord.Thread) else None
            scope = await self.scope(interaction, within=DISCORD_LOOKUP_SECONDS)
            try:  # before the defer: a hanging Redis must not outlast Discord's 3 s
                async with asyncio.timeout(MEMORY_LOOKUP_SECONDS):
                    known = interaction.guild_id is None or await self.adapter.knows_thread(
                        scope, owner_id
                    )
            except TimeoutError:
                log.warning(
                    "/summarize: the memory did not say within %s s whether the bot answers "
                    "in the thread", MEMORY_LOOKUP_SECONDS,
                )  # fmt: skip
                text = COMMAND_MEMORY_DOWN.format(command="/summarize")
                await interaction.response.send_message(text, ephemeral=True)
                return
            if interaction.channel_id is None or not known:
                await interaction.response.send_message(NOT_IN_THREAD, ephemeral=True)
                return
            if not await defer(interaction, "/summarize"):
                return  # nothing could answer: not the work failing
            deferred = True
            answer = await self.adapter.handler.summarize(scope)
        except Exception as exc:
            await self._failed(interaction, "/summarize", exc, deferred)
            return
        await self._followup(interaction, answer, "/summarize")

    async def expand(self, interaction: discord.Interaction, summary_id: str) -> None:
        """A summary is shown to the channel; anything else (an id naming none here, the
        usage, an error) only to the person, as Slack answers /expand: the channel is not told
        what someone tried to expand, and a long id typed floods no channel. Said within
        EXPAND_WITHIN_SECONDS it is answered at once; else a "thinking…" deferred before
        Discord's 3 s are up takes a summary, and makes way for a miss (`tell_privately`)."""
        work = asyncio.ensure_future(self._expanded(interaction, summary_id))
        done, _ = await asyncio.wait({work}, timeout=EXPAND_WITHIN_SECONDS)
        deferred = not done
        if deferred and not await defer(interaction, "/expand"):
            work.cancel()  # its answer would show nowhere
            return
        try:
            answer = await work
        except Exception as exc:
            answer = command_failure("/expand", exc)
        if not SUMMARY_ID.match(answer):
            if deferred:
                await tell_privately(interaction, answer, "/expand")
            else:
                await interaction.response.send_message(answer, ephemeral=True)
            return
        if not deferred and not await defer(interaction, "/expand"):
            return
        await self._followup(interaction, answer, "/expand")

    async def _expanded(self, interaction: discord.Interaction, summary_id: str) -> str:
        scope = await self.scope(interaction)
        return await self.adapter.handler.expand(scope, summary_id)

    async def _failed(
        self, interaction: discord.Interaction, command: str, exc: Exception, deferred: bool
    ) -> None:
        """A command that raised still answers (the tree has no error handler): in place of
        its "thinking…" when deferred, else at once (before Discord's 3 s are up)."""
        text = command_failure(command, exc)
        if deferred:
            await self._followup(interaction, text, command)
        else:
            await interaction.response.send_message(text, ephemeral=True)

    async def memory(self, interaction: discord.Interaction) -> None:
        await interaction.response.send_message(self.memory_link(interaction), ephemeral=True)

    def memory_link(self, interaction: discord.Interaction) -> str:
        """The answer to `/memory`: a link for this person in this server (the tenant, as for
        their messages), or for their DMs' memory when used in a DM."""
        links = self.adapter.links
        if links is None:
            return NOT_SERVED
        tenant, _, user = self._place(interaction)
        url = links.login(tenant, str(user.id), "discord")
        minutes = links.ttl // 60
        return (
            f"[Open your ArxivScout memory page](<{url}>): what I remember that you may see. "
            f"The link is yours alone and works for {minutes} minutes."
        )

    async def scope(self, interaction: discord.Interaction, within: float | None = None) -> Scope:
        """The conversation a command was used in (its channel is the thread's id part). Who
        sees it is private when Discord does not tell `within` that many seconds (it has its
        own, longer limit otherwise)."""
        tenant, thread, user = self._place(interaction)
        channel, channel_id = interaction.channel, interaction.channel_id
        try:
            async with asyncio.timeout(within):
                seen = await resolve_visibility(self.client, channel, channel_id)
        except TimeoutError:
            log.warning(
                "Discord did not say in %s s who sees channel %s: private", within, channel_id
            )
            seen = Visibility.PRIVATE
        return Scope(
            tenant, thread, str(interaction.channel_id), seen, str(user.id), user.display_name
        )

    @staticmethod
    def _place(interaction: discord.Interaction) -> tuple[str, str, discord.abc.User]:
        """A command's tenant, thread and user: all a memory link needs."""
        tenant = discord_tenant(interaction)
        if interaction.guild_id is None:
            return tenant, f"discord:dm:{interaction.channel_id}", interaction.user
        return tenant, f"discord:{tenant}:{interaction.channel_id}", interaction.user

    @staticmethod
    async def _followup(interaction: discord.Interaction, text: str, command: str) -> None:
        """The answer in place of "thinking…". A follow-up Discord does not take (its errors
        after its own retries, the network, the token expired) is tried once as an edit of
        the original response; failing that, the channel is told what became of it (a summary
        stored: not to be asked again), or nothing is left showing "thinking…" for ever."""
        parts = split_for_delivery(link_arxiv(text), DISCORD_LIMIT) or ["(nothing to show)"]
        for index, part in enumerate(parts):
            try:
                await interaction.followup.send(part)
                continue
            except Exception as exc:
                log.warning("%s: part %d of its answer not sent: %r", command, index, exc)
            if index == 0:  # "thinking…" still shows: it may take the answer's start
                try:
                    await interaction.edit_original_response(content=part)
                    continue
                except Exception as exc:
                    log.warning("%s: its answer could not replace thinking: %r", command, exc)
            stored = SUMMARY_ID.search(text) if command == "/summarize" else None
            what = SUMMARY_KEPT.format(id=stored[1]) if stored else RUN_AGAIN
            await _tell_channel(interaction, UNSHOWN.format(command=command, what=what))
            return


async def _tell_channel(interaction: discord.Interaction, text: str) -> None:
    """A last word in the command's channel, when its interaction cannot answer."""
    channel = interaction.channel
    if not isinstance(channel, discord.abc.Messageable):
        log.warning("could not tell channel %s: not cached", interaction.channel_id)
        return
    try:
        await channel.send(text, allowed_mentions=discord.AllowedMentions.none())
    except Exception as exc:
        log.warning("could not tell channel %s: %r", interaction.channel_id, exc)
