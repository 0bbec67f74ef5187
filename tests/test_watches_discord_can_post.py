"""`DiscordWatches.can_post` (adapters/discord_watch.py), asked before a watch is made by a
mention or resumed: read from discord.py's channel objects (spec'd fakes, looked up as the
adapter does). A thread needs Send Messages in Threads, from its parent even when the parent
is not cached; a refusal names the watch's channel (an admin may ask from elsewhere); a channel
gone says so; what Discord cannot say now is left to the post."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import discord
import pytest

from adapters.discord_platform import DiscordPlatform
from adapters.discord_watch import CANNOT_SEE, DiscordWatches
from bot.watch_places import WatchPlace
from tests.support.discord_fakes import FakeDiscord

UNAVAILABLE = discord.HTTPException(mock.Mock(status=503, reason="Service Unavailable"), "later")


@pytest.fixture
def discord_side() -> tuple[FakeDiscord, DiscordWatches]:
    fake = FakeDiscord()
    client = discord.Client(intents=discord.Intents.none())
    fake.attach(client)
    return fake, DiscordWatches(None, client, DiscordPlatform(client).channel)


def granting(**allowed: bool) -> Callable[..., discord.Permissions]:
    """A channel's `permissions_for`: the bot sees it and has `allowed`."""
    return lambda target, /: discord.Permissions(view_channel=True, **allowed)


def place(channel: Any) -> WatchPlace:
    return WatchPlace("discord", str(channel.id))


async def can_post(poster: DiscordWatches, channel: Any) -> str:
    """Asked as a watch of the channel's own server asks it (its tenant)."""
    return await poster.can_post(place(channel), tenant=str(channel.guild.id))


def refused_in(channel: Any, permission: str) -> str:
    return (
        f"I cannot send messages in <#{channel.id}>, so Discord would refuse this watch's "
        f"digests there: let me post there first (the channel's permissions: {permission}), "
        "then ask again."
    )


async def test_a_thread_needs_send_messages_in_threads_and_a_channel_send_messages(discord_side):
    fake, poster = discord_side
    thread = fake.thread(fake.guild(), fake.bot.id)  # its permissions are its parent's
    channel = thread.parent
    channel.permissions_for.side_effect = granting(send_messages=True)
    assert await can_post(poster, channel) == ""
    assert await can_post(poster, thread) == refused_in(thread, "Send Messages in Threads")
    channel.permissions_for.side_effect = granting(send_messages_in_threads=True)
    assert await can_post(poster, thread) == ""
    assert await can_post(poster, channel) == refused_in(channel, "Send Messages")


async def test_a_thread_whose_parent_is_not_cached_is_checked_in_the_fetched_parent(discord_side):
    """discord.py's `Thread.permissions_for` raises ClientException without its parent."""
    fake, poster = discord_side
    guild = fake.guild()
    thread = fake.thread(guild, fake.bot.id, parent_id=fake.text_channel(guild, muted=True).id)
    thread.permissions_for.side_effect = discord.ClientException("Parent channel not found")
    assert await can_post(poster, thread) == refused_in(thread, "Send Messages in Threads")
    poster.client.fetch_channel.assert_awaited_with(thread.parent_id)
    thread.parent.permissions_for.side_effect = lambda target, /: discord.Permissions(
        send_messages_in_threads=True
    )  # hidden from the bot: nothing in its threads either
    assert await can_post(poster, thread) == refused_in(thread, "Send Messages in Threads")
    thread.parent.permissions_for.side_effect = granting(send_messages_in_threads=True)
    assert await can_post(poster, thread) == ""

    poster.client.fetch_channel.side_effect = UNAVAILABLE  # Discord cannot say: the post will
    assert await can_post(poster, thread) == ""


async def test_a_channel_gone_or_hidden_cannot_be_seen_and_an_http_error_is_left_to_the_post(
    discord_side,
):
    fake, poster = discord_side
    tenant = str(fake.guild().id)
    gone = WatchPlace("discord", str(fake.snowflake()))  # fetching it: NotFound
    assert await poster.can_post(gone, tenant) == CANNOT_SEE
    assert await poster.can_post(WatchPlace("discord", "not-a-snowflake"), tenant) == CANNOT_SEE
    poster.client.fetch_channel.side_effect = UNAVAILABLE
    assert await poster.can_post(gone, tenant) == ""
