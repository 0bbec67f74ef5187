"""Messages posted while no gateway session was up are answered at the next READY (Discord
replays missed events only to a session that resumes), and `arxivscout discord` stops on
SIGTERM as the worker does."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import os
import signal
import sys
from typing import Any
from unittest import mock

import discord

from adapters.discord import DiscordAdapter
from memory.keys import seen_event_key
from tests import test_discord
from tests.support.bot_process import ROOT
from tests.test_discord import new_adapter, settle, stoppable

world, fake = test_discord.world, test_discord.fake  # its fixtures: a world whose model echoes

_low_bits = itertools.count(1)


def posted_at(when: datetime.datetime) -> int:
    """A message id from `when`, as Discord makes them (the time is in the id's high bits)."""
    return discord.utils.time_snowflake(when) + next(_low_bits)


def now_id() -> int:
    return posted_at(discord.utils.utcnow())


def holds(channel: Any, *messages: Any) -> None:
    """What Discord keeps in `channel`: `history` pages it as Discord does (after the given
    message, oldest first, at most `limit`), `fetch_message` gives one by id (else 404), and
    a cached channel knows its last message."""
    held = sorted(messages, key=lambda m: m.id)
    if not isinstance(channel, discord.DMChannel):  # discord.py keeps none for DMs
        channel.last_message_id = held[-1].id

    async def history(*, limit: int = 100, after: Any = None, **kw: Any):
        for message in [m for m in held if after is None or m.id > after.id][:limit]:
            yield message

    channel.history.side_effect = history

    async def fetch_message(message_id: int, /) -> Any:
        for message in held:
            if message.id == message_id:
                return message
        raise discord.NotFound(mock.Mock(status=404, reason="Not Found"), "Unknown Message")

    channel.fetch_message.side_effect = fetch_message


async def ready(adapter: DiscordAdapter, *guilds: Any) -> None:
    """A new gateway session: READY, with the servers the bot is in; the catch-up it starts
    is waited for."""
    for guild in guilds:
        adapter.client._connection._guilds[guild.id] = guild
    await adapter.client.on_ready()
    if adapter.catchup._running is not None:
        await adapter.catchup._running


async def test_messages_posted_while_down_are_answered_at_ready(world, fake, caplog):
    guild, user = fake.guild(), fake.user()
    channel, dm = fake.text_channel(guild), fake.dm_channel(user)
    before = new_adapter(world, fake)  # the process that then crashed
    mention = fake.mention(channel, user, "find MemGPT", message_id=now_id())
    await before.handle_message(mention)
    hello = fake.message(dm, user, "hello", message_id=now_id())
    await before.handle_message(hello)
    two_days_ago = discord.utils.utcnow() - datetime.timedelta(days=2)
    quiet = fake.thread(guild, owner_id=fake.bot.id)  # a thread of the bot's, quiet since
    await before.handle_message(
        fake.message(quiet, user, "an old question", message_id=posted_at(two_days_ago))
    )
    await settle(world, before)
    await before.pipeline.close()
    thread = fake.channels[mention.id]  # opened from the mention
    assert fake.texts(thread.id) == ["Answer: find MemGPT"]

    # while no session is up: nothing of this arrives as an event
    answer = fake.message(thread, fake.bot, "Answer: find MemGPT", message_id=now_id())
    follow_up = fake.message(thread, user, "who wrote it?", message_id=now_id())
    chatter = fake.message(channel, user, "lunch?", message_id=now_id())
    second = fake.mention(channel, user, "and Voyager?", message_id=now_id())
    in_dm = fake.message(dm, user, "are you there?", message_id=now_id())
    too_old = discord.utils.utcnow() - datetime.timedelta(hours=30)
    stale = fake.message(quiet, user, "anyone?", message_id=posted_at(too_old))
    late = fake.message(quiet, user, "still there?", message_id=now_id())
    holds(thread, mention, answer, follow_up)
    holds(channel, mention, chatter, second)
    holds(dm, hello, in_dm)
    holds(quiet, stale, late)

    after = new_adapter(world, fake)  # the process started again
    with caplog.at_level(logging.INFO, logger="adapters.discord_catchup"):
        await ready(after, guild)
    await settle(world, after)
    assert fake.texts(thread.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    assert fake.texts(second.id) == ["Answer: and Voyager?"]  # a new thread, from the mention
    assert fake.texts(channel.id) == []  # chatter without a mention stays unanswered
    assert fake.texts(dm.id) == ["Answer: hello", "Answer: are you there?"]
    # quiet for two days: still read, but only what was posted within the last day answered
    assert fake.texts(quiet.id) == ["Answer: an old question", "Answer: still there?"]
    assert "caught up on Discord: 6 messages in 4 places" in caplog.text

    # the next READY (a session lost again) reads from where this one left: nothing twice
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="adapters.discord_catchup"):
        await ready(after, guild)
    await settle(world, after)
    assert "caught up on Discord: 0 messages in 2 places (3 with nothing new" in caplog.text
    # nothing posted after their cursors, as the cached channels tell: not read again
    assert [place.history.call_count for place in (thread, channel, quiet)] == [1, 1, 1]
    assert fake.texts(thread.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    assert fake.texts(dm.id) == ["Answer: hello", "Answer: are you there?"]
    await after.pipeline.close()


async def test_a_message_read_again_at_ready_is_answered_once(world, fake):
    """A cursor behind what was answered (another process, a write that failed): what is read
    again at READY is de-duplicated by its id; what is new is answered."""
    guild, user = fake.guild(), fake.user()
    thread = fake.thread(guild, owner_id=fake.bot.id)
    asked = fake.message(thread, user, "find MemGPT", message_id=now_id())
    adapter = new_adapter(world, fake)
    await adapter.handle_message(asked)
    await settle(world, adapter)
    newer = fake.message(thread, user, "who wrote it?", message_id=now_id())
    holds(thread, asked, newer)  # Discord pages from an older cursor
    await adapter.catchup.cursors.advance(str(guild.id), str(thread.id), str(asked.id - 1))
    await adapter.catchup.cursors.advance(str(guild.id), str(thread.id), str(asked.id - 2))
    assert (await adapter.catchup.cursors.places(str(guild.id)))[str(thread.id)] == str(asked.id)
    await adapter.catchup.cursors.drop(str(guild.id), str(thread.id))
    await adapter.catchup.cursors.advance(str(guild.id), str(thread.id), str(asked.id - 1))
    await ready(adapter, guild)
    await settle(world, adapter)
    assert fake.texts(thread.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    await adapter.pipeline.close()


async def test_a_mention_after_much_chatter_is_answered_at_ready(world, fake):
    """A busy channel: the mention posted while down comes after more than a page of
    chatter; the catch-up pages on until the present."""
    guild, user = fake.guild(), fake.user()
    channel = fake.text_channel(guild)
    adapter = new_adapter(world, fake)
    first = fake.mention(channel, user, "find MemGPT", message_id=now_id())
    await adapter.handle_message(first)
    await settle(world, adapter)
    chatter = [fake.message(channel, user, f"chat {n}", message_id=now_id()) for n in range(60)]
    late = fake.mention(channel, user, "and Voyager?", message_id=now_id())
    holds(channel, first, *chatter, late)
    await ready(adapter, guild)
    await settle(world, adapter)
    assert fake.texts(late.id) == ["Answer: and Voyager?"]
    await adapter.pipeline.close()


async def test_an_answered_message_read_again_after_its_dedup_lapsed_is_not_answered(world, fake):
    """A cursor left behind an answered message (its move failed), and the next READY more
    than an hour later, once the message id's de-duplication has lapsed: the record of its
    delivered answer (kept a week) keeps it from being answered twice."""
    guild, user = fake.guild(), fake.user()
    thread = fake.thread(guild, owner_id=fake.bot.id)
    asked = fake.message(thread, user, "find MemGPT", message_id=now_id())
    adapter = new_adapter(world, fake)
    await adapter.handle_message(asked)
    await settle(world, adapter)
    tenant = str(guild.id)
    redis = world.runtime.memory.redis
    await redis.delete(  # an hour on: what the de-duplication knew has expired
        seen_event_key(tenant, f"discord:{asked.id}"),
        seen_event_key(tenant, f"discord-job:{asked.id}"),
    )
    await adapter.catchup.cursors.drop(tenant, str(thread.id))
    await adapter.catchup.cursors.advance(tenant, str(thread.id), str(asked.id - 1))
    newer = fake.message(thread, user, "who wrote it?", message_id=now_id())
    holds(thread, asked, newer)
    await ready(adapter, guild)
    await settle(world, adapter)
    assert fake.texts(thread.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    assert (await adapter.catchup.cursors.places(tenant))[str(thread.id)] == str(newer.id)
    await adapter.pipeline.close()


def unreadable(channel: Any, error: Exception) -> None:
    """Discord (or the network) fails while `channel`'s history is read."""

    async def history(**kw: Any):
        raise error
        yield  # an async generator, as discord.py's

    channel.history.side_effect = history


async def test_a_place_discord_fails_to_give_is_read_at_the_next_ready(world, fake, caplog):
    """At READY, one place's history times out and a DM's channel is answered 503: the other
    places are still read, and the failed ones keep their cursors (chatter there meanwhile
    does not move them past what was missed), so the next READY answers what was missed."""
    guild, user = fake.guild(), fake.user()
    read, timing_out = (fake.thread(guild, owner_id=fake.bot.id) for _ in range(2))
    dm_read, dm = fake.dm_channel(fake.user()), fake.dm_channel(user)
    places = (dm_read, read, timing_out, dm)  # the failing ones most recent: read first
    before = new_adapter(world, fake)
    asked = {}
    for place in places:
        asked[place.id] = fake.message(place, user, "find MemGPT", message_id=now_id())
        await before.handle_message(asked[place.id])
    await settle(world, before)
    await before.pipeline.close()
    missed = {p.id: fake.message(p, user, "who wrote it?", message_id=now_id())
              for p in places}  # fmt: skip
    for place in places:
        holds(place, asked[place.id], missed[place.id])
    unreadable(timing_out, TimeoutError())
    after = new_adapter(world, fake)
    cached = after.client.get_channel.side_effect
    after.client.get_channel.side_effect = lambda i: None if i == dm.id else cached(i)
    fetch = after.client.fetch_channel.side_effect
    unavailable = discord.DiscordServerError(mock.Mock(status=503, reason="x"), "unavailable")
    after.client.fetch_channel.side_effect = mock.AsyncMock(side_effect=unavailable)
    with caplog.at_level(logging.WARNING, logger="adapters.discord_catchup"):
        await ready(after, guild)
    await settle(world, after)
    for place in (read, dm_read):
        assert fake.texts(place.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    assert "TimeoutError" in caplog.text and "DiscordServerError" in caplog.text
    chatter = fake.message(timing_out, user, "lunch?", message_id=now_id())
    await after.handle_message(chatter)  # live, while what came before it was not read
    holds(timing_out, asked[timing_out.id], missed[timing_out.id], chatter)
    after.client.fetch_channel.side_effect = fetch
    await ready(after, guild)  # the next session: Discord answers again
    await settle(world, after)
    assert fake.texts(dm.id) == ["Answer: find MemGPT", "Answer: who wrote it?"]
    later = ["Answer: find MemGPT", "Answer: lunch?", "Answer: who wrote it?"]
    assert fake.texts(timing_out.id) == later  # the bot's thread: every message is for it
    await after.pipeline.close()


async def test_a_message_kept_for_redis_is_queued_before_stopping(tmp_path, fake):
    """Stopping while a message waits in the process for Redis to be back (Discord sends it
    once): it gets a last try, so it is in Redis, for the next process, before this one
    exits."""
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        guild, user = fake.guild(), fake.user()
        thread = fake.thread(guild, owner_id=fake.bot.id)
        server.stop()
        await adapter.handle_message(fake.message(thread, user, "still there?"))
        assert adapter._waiting  # kept here, tried again every few seconds
        server.ensure_running()
        await adapter.stop()
        assert not adapter._waiting
        queued = await world.runtime.memory.turns.busy("discord")
        assert f"discord:{guild.id}:{thread.id}" in [scope.thread for scope in queued]


STOPPABLE_BOT = """
import asyncio, sys
import discord

async def connected(self, token, *, reconnect=True):
    print("gateway up", flush=True)  # no gateway here: serve until closed
    while not self.is_closed():
        await asyncio.sleep(0.05)

discord.Client.start = connected
from app import cli
sys.exit(cli.main(["discord", "--no-sync"]))
"""


async def test_the_discord_command_stops_cleanly_on_sigterm(redis_url, tmp_path):
    """SIGTERM (a deploy, a platform's stop) ends `arxivscout discord` as it ends the worker:
    turns handed back, the gateway closed, exit 0; not a kill mid-turn."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "DISCORD_"))}
    env.update(
        REDIS_URL=redis_url, OPENAI_API_KEY="test-key", DISCORD_TOKEN="discord-test-token",
        ARXIVSCOUT_DATA_DIR=str(tmp_path), ARXIVSCOUT_EMBEDDINGS="local", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    bot = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STOPPABLE_BOT, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output = b""
        while b"gateway up" not in output:
            line = await asyncio.wait_for(bot.stdout.readline(), 120)
            assert line, output.decode()[-3000:]  # it exited before serving
            output += line
        bot.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(bot.communicate(), 60)
        output += rest
        assert bot.returncode == 0, output.decode()[-3000:]
        assert b"Traceback" not in output
    finally:
        if bot.returncode is None:
            bot.kill()
            await bot.wait()
