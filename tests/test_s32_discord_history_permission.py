"""s32: `DiscordWatches.find` in a channel whose history the bot may not read. Discord answers
such a history with an empty list (no 403), so reading it would silently find nothing and a
digest task run again after an outage longer than the nonce would post twice. The history is
always read; when it holds no digest, the bot's permissions there are resolved from the cache
(the server's roles, the bot's member, the channel's overwrites, as the mock serves them and
the gateway gives them): without Read Message History a warning, once per channel, says what
to grant. A channel the bot may read (its role allowed back) finds its digest; a cache that
says no while Discord serves the history (stale) finds it too; a cache without the bot's
member warns of nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import discord
import pytest

from adapters.discord_platform import DiscordPlatform
from adapters.discord_watch import DiscordWatches, marker_tag
from memory.stores.watches import DAY, Watch
from tests.support.discord_api import (
    BOT_TOKEN,
    READ_MESSAGE_HISTORY,
    ROLE,
    SEND_MESSAGES,
    VIEW_CHANNEL,
    Guild,
    MockDiscordApi,
    serving_discord_api,
)

WARNING = "cannot read the history of Discord channel"


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as served:
        yield served


async def poster(api: MockDiscordApi, guild: Guild, *, me: bool = True) -> DiscordWatches:
    """A bot process's poster, its client's cache filled as the gateway's GUILD_CREATE fills it
    (roles, channels with their overwrites, active threads; the bot's member unless `me` is
    False: a cache that lacks it)."""
    client = discord.Client(intents=discord.Intents.none())
    await client.login(BOT_TOKEN)
    data = await client.http.get_guild(guild.id)
    active = await client.http.get_active_threads(guild.id)
    data.update({
        "channels": await client.http.get_all_guild_channels(guild.id),
        "members": [await client.http.get_member(guild.id, api.bot_id)] if me else [],
        "threads": active["threads"], "member_count": len(guild.members), "large": False,
    })  # fmt: skip
    client._connection.parse_guild_create(data)
    return DiscordWatches(None, client, DiscordPlatform(client).channel)


async def closed(*posters: DiscordWatches) -> None:
    for each in posters:
        await each.client.close()


def posted_digest(api: MockDiscordApi, guild: Guild, channel: int) -> tuple[Watch, str, str]:
    """A watch of `channel`, and its digest already posted there by the bot a minute ago (a
    task run again after an outage): the watch, the digest's marker, the message's id."""
    watch = Watch("w1", str(guild.id), "state space models", 7 * DAY, "discord", str(channel))
    marker = f"{watch.id}:{int(time.time())}"
    message = api.say(channel, f"New on it … {marker_tag(marker)}", seconds_ago=30)
    return watch, marker, str(message)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


def history_of(api: MockDiscordApi, channel: int) -> list[str]:
    return [c.path for c in api.of("history") if c.path.endswith(f"/channels/{channel}/messages")]


@pytest.mark.parametrize("denied_to", ["the bot", "@everyone", "the server's @everyone role"])
async def test_a_history_the_bot_may_not_read_finds_none_and_the_warning_says_what_to_grant(
    api, caplog, denied_to
):
    owner = api.user("ada")
    if denied_to == "the server's @everyone role":  # no Read Message History anywhere
        guild = api.guild(owner, everyone=VIEW_CHANNEL | SEND_MESSAGES)
        channel = guild.channel("papers")
        api.no_history.add(channel)
    else:
        guild = api.guild(owner)
        channel = guild.channel("papers")
        if denied_to == "the bot":
            api.deny_history(guild, channel)
        else:
            api.deny_history(guild, channel, guild.id, ROLE)
    watch, marker, _ = posted_digest(api, guild, channel)
    bot = await poster(api, guild)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        assert await bot.find(watch, marker, time.time() - 20) is None
    assert len(history_of(api, channel)) == 1  # asked all the same: the cache may be stale
    [warned] = warnings(caplog)
    assert str(channel) in warned and "grant the bot Read Message History" in warned
    await closed(bot)


async def test_the_warning_is_once_per_channel_and_a_readable_channel_is_still_read(api, caplog):
    owner = api.user("ada")
    guild = api.guild(owner)
    scouts = guild.role("scouts")
    guild.member(api.bot_id, scouts)
    closed_off = guild.channel("announcements")
    api.deny_history(guild, closed_off, guild.id, ROLE)
    # @everyone denied there too, but an overwrite of the bot's role allows it back
    allowed_back = guild.channel("papers", roles=(scouts,))
    guild.channels[-1]["permission_overwrites"].insert(0, {
        "id": str(guild.id), "type": ROLE, "allow": "0", "deny": str(READ_MESSAGE_HISTORY),
    })  # fmt: skip
    bot = await poster(api, guild)
    watch, marker, _ = posted_digest(api, guild, closed_off)
    readable, readable_marker, digest = posted_digest(api, guild, allowed_back)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        for _ in range(3):  # a busy watch, tried again and again
            assert await bot.find(watch, marker, time.time() - 20) is None
        assert await bot.find(readable, readable_marker, time.time() - 20) == digest
    assert len(warnings(caplog)) == 1
    assert len(history_of(api, closed_off)) == 3 and len(history_of(api, allowed_back)) == 1
    await closed(bot)


async def test_a_thread_under_a_channel_the_bot_may_not_read_is_warned_of(api, caplog):
    owner = api.user("ada")
    guild = api.guild(owner)
    channel = guild.channel("papers")
    thread = api.thread(guild, channel)
    api.deny_history(guild, channel)
    api.no_history.add(thread)  # a thread's permissions are its parent's
    watch, marker, _ = posted_digest(api, guild, thread)
    bot = await poster(api, guild)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        assert await bot.find(watch, marker, time.time() - 20) is None
    assert len(history_of(api, thread)) == 1
    [warned] = warnings(caplog)
    assert str(thread) in warned and f"its parent channel {channel}" in warned
    await closed(bot)


async def test_without_the_bots_member_in_the_cache_the_history_is_read_as_before(api, caplog):
    owner = api.user("ada")
    guild = api.guild(owner)
    channel = guild.channel("papers")
    api.deny_history(guild, channel)
    watch, marker, _ = posted_digest(api, guild, channel)
    knowing, unsure = await poster(api, guild), await poster(api, guild, me=False)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        assert await knowing.find(watch, marker, time.time() - 20) is None
        assert len(history_of(api, channel)) == 1
        assert await unsure.find(watch, marker, time.time() - 20) is None  # Discord's []
    assert len(history_of(api, channel)) == 2  # asked by both
    assert len(warnings(caplog)) == 1  # the one that knew
    await closed(knowing, unsure)


async def test_a_stale_cache_does_not_stop_the_history_being_read(api, caplog):
    """The bot's cached permissions say no, but Discord serves the history (a role granted
    since, not yet seen): the digest is found, not posted twice, and nothing is warned."""
    owner = api.user("ada")
    guild = api.guild(owner)
    channel = guild.channel("papers")
    api.deny_history(guild, channel)
    api.no_history.discard(channel)  # Discord reads it otherwise than the cache does
    watch, marker, digest = posted_digest(api, guild, channel)
    bot = await poster(api, guild)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        assert await bot.find(watch, marker, time.time() - 20) == digest
    assert warnings(caplog) == []
    await closed(bot)
