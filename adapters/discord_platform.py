"""Discord as the spine's platform (adapters/spine.py `Platform`): where a job's answer goes
(typing, a step status message, the reply's parts), which errors of Discord's pass (the job runs
again) and which refuse for good (`refused`: the person is told, by DM when the place refuses
that too), and who may see a channel (`visibility`, `resolve_visibility`: the adapter and its
commands put it in every scope), a command's "thinking…" Discord may refuse (`defer`), and
its answer only for the person after a "thinking…" the channel sees (`tell_privately`). Reads
Discord, never memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator

import aiohttp
import discord

from adapters.discord_feedback import send_options
from adapters.spine import Job, Platform, Status, feedback_turn, if_shown
from adapters.text import link_arxiv, split_for_delivery
from bot.agent import AgentEvent
from bot.tools import TOOL_ACTIVITY
from memory.scope import Visibility

log = logging.getLogger(__name__)

UNSENT = (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError)  # a reply not sent


class ChannelGone(LookupError):
    """A job's channel is deleted, or hidden from the bot, when its turn runs."""


REFUSED = (discord.Forbidden, discord.NotFound, ChannelGone)  # no, for good, in that place

DISCORD_LIMIT = 2000
ASK_DISCORD_SECONDS = 1.5  # a lookup of who sees a channel (a command has 3 s to answer)
ANSWERED_PRIVATELY = "Answered only to the person who asked."  # names no id, no error


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


def part_nonce(job: Job, index: int, part: str) -> str:
    """The same for a part sent again (a re-run sends its saved answer): Discord then returns
    the message a failed or unanswered send may have created instead of posting it twice
    (discord.py sets `enforce_nonce`; 25 characters at most). The text is in it so a notice
    sent as part 0 (the memory down) is not mistaken for the answer's first part."""
    return hashlib.sha1(f"{job.id}:{index}:{part}".encode()).hexdigest()[:25]


async def defer(
    interaction: discord.Interaction, command: str, *, ephemeral: bool | None = None,
    thinking: bool = True,
) -> bool:  # fmt: skip
    """Whether a "thinking…" was deferred (`ephemeral` None: not said, so public). Discord
    refusing it in any way (too late: Unknown interaction; answered already; the network)
    leaves nothing that could answer: logged, not taken for the work failing."""
    options = {} if ephemeral is None else {"ephemeral": ephemeral}
    try:
        await interaction.response.defer(thinking=thinking, **options)
    except Exception as exc:
        log.warning("%s could not defer its answer: %r", command, exc)
        return False
    return True


async def tell_privately(interaction: discord.Interaction, text: str, command: str) -> None:
    """An answer only for the person after a "thinking…" the channel sees. A follow-up fills
    a deferred response still pending and takes its visibility; so the original is first
    edited to words that reveal nothing (`ANSWERED_PRIVATELY`), which ends the deferral, the
    answer then sent as follow-ups of their own, ephemeral, and the original deleted last
    (deleted first, Discord may refuse the follow-up: Unknown Message, discord-api-docs#3087).
    Not edited, the answer is not sent (the channel would read it); not deleted, the neutral
    words stay: both logged."""
    try:
        await interaction.edit_original_response(content=ANSWERED_PRIVATELY)
    except Exception as exc:
        log.warning("%s: its public thinking could not be replaced: %r", command, exc)
        return
    for part in split_for_delivery(text, DISCORD_LIMIT) or ["(nothing to show)"]:
        try:
            await interaction.followup.send(part, ephemeral=True)
        except Exception as exc:
            log.warning("%s: its answer to the person not sent: %r", command, exc)
            break
    try:
        await interaction.delete_original_response()
    except Exception as exc:
        log.warning("%s: its public stand-in could not be removed: %r", command, exc)


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
            raise ChannelGone(f"channel {job.reply['channel_id']} is gone")
        async with if_shown(channel.typing()):  # the answer matters, not the indicator
            yield StepStatus(channel)

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        assert isinstance(status, StepStatus)
        nonce = part_nonce(job, index, part)
        await status.channel.send(part, nonce=nonce, **send_options(feedback_turn(job, index)))

    async def notice(self, job: Job, text: str) -> None:
        """In the job's channel; refused there (a locked thread, Send Messages denied, the
        channel gone), by DM to the person, naming the channel: else they would hear nothing."""
        channel_id = job.reply["channel_id"]
        channel = await self.channel(channel_id)
        if channel is not None:
            try:
                await channel.send(text)
                return
            except (discord.Forbidden, discord.NotFound) as exc:
                log.info("a notice was refused in channel %s: %r", channel_id, exc)
        where = f"About your message in <#{channel_id}>, where Discord does not let me post:"
        await self._by_dm(job, channel, f"{where} {text}")

    async def _by_dm(self, job: Job, place: object, text: str) -> None:
        """A DM to the job's person; none when the refused place was that DM already."""
        if isinstance(place, discord.DMChannel) or not job.scope.user.isdigit():
            return
        if job.scope.tenant == f"dm-{job.scope.user}":  # a DM's job: its DM is the place
            return
        dm = await self.client.create_dm(discord.Object(int(job.scope.user)))
        await dm.send(text, allowed_mentions=discord.AllowedMentions.none())

    def refused(self, exc: BaseException) -> bool:
        """Discord refusing the answer in its place for good (a locked or archived thread,
        Send Messages denied, the channel or message gone): the person is told (NOT_SHOWN)."""
        return isinstance(exc, REFUSED)

    def passing(self, exc: BaseException) -> bool:
        """Discord's server errors (a 503 at once; 500, 502 and 504 after discord.py's own
        retries) and a rate limit it did not wait out pass: the job runs again."""
        if isinstance(exc, discord.DiscordServerError):
            return True
        if isinstance(exc, discord.HTTPException) and exc.status == 429:
            return True
        return super().passing(exc)

    async def channel(self, channel_id: int) -> discord.abc.Messageable | None:
        channel = self.client.get_channel(channel_id)
        if channel is None:
            try:
                channel = await self.client.fetch_channel(channel_id)
            except (discord.NotFound, discord.Forbidden):
                return None
        return channel if isinstance(channel, discord.abc.Messageable) else None


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
        try:  # a status Discord fails to show (its API, the network, a timeout) is skipped
            if self.message is None:
                self.message = await self.channel.send(text)
            else:
                await self.message.edit(content=text)
        except UNSENT as exc:
            log.info("a tool step's status could not be shown (%r); the turn goes on", exc)
