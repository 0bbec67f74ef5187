"""A Discord message the adapter gives up (stopped while it waits, or its hour of retries out)
lets go of its de-duplication claim, so the next READY's catch-up takes it again and answers it:
the notice promised to keep trying. Discord's failures are real HTTP answers from the local
REST stand-in; Redis is real."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import discord
import pytest

from adapters.discord import DISCORD_FAILED, EMPTY_MENTION, DiscordAdapter
from memory.coordination import GivenUpMessages, PlaceCursors
from memory.keys import seen_event_key
from tests import test_discord
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi, serving_discord_api
from tests.test_discord import settle
from tests.test_discord_catchup import holds, now_id, ready

world, fake = test_discord.world, test_discord.fake  # a world whose model echoes; fake Discord

# The stand-in has no route for opening a thread from a message: such a call is "unknown" to
# it, and answers what `fail` tells that name to (else 404).
THREAD_ROUTE = "unknown"


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as api:
        yield api


async def over_http(adapter: DiscordAdapter, message: Any) -> Any:
    """`message.create_thread` asks Discord's REST API (the stand-in) as discord.py's does;
    returns how it opened threads before, to give it back once Discord is back."""
    await adapter.client.http.static_login(BOT_TOKEN)
    opens = message.create_thread.side_effect

    async def create_thread(*, name: str, **kw: Any) -> Any:
        await adapter.client.http.start_thread_with_message(
            message.channel.id, message.id, name=name, auto_archive_duration=1440
        )
        return await opens(name=name, **kw)  # not reached while the stand-in fails

    message.create_thread.side_effect = create_thread
    return opens


async def claimed(world, guild: Any, message: Any) -> bool:
    """Whether `message`'s de-duplication claim stands."""
    key = seen_event_key(str(guild.id), f"discord:{message.id}")
    return bool(await world.runtime.memory.redis.exists(key))


async def test_a_message_discord_failed_until_stop_is_answered_after_the_next_ready(
    world, fake, api
):
    """Discord answers 503 to every try at opening the mention's thread, the last one at
    stop() too: the claim is let go, so the next process's catch-up answers it in its thread."""
    guild, user = fake.guild(), fake.user()
    channel = fake.text_channel(guild)
    before = DiscordAdapter(
        world.runtime.turns(), sync=False, resubmit_every_seconds=3600.0, last_tries_seconds=5.0
    )
    fake.attach(before.client)
    asked = fake.mention(channel, user, "find MemGPT", message_id=now_id())
    await before.handle_message(asked)  # answered: the channel's catch-up cursor
    await settle(world, before)
    failing = fake.mention(channel, user, "and Voyager?", message_id=now_id())
    opens = await over_http(before, failing)
    api.fail(THREAD_ROUTE, 503, times=100)
    try:
        await before.handle_message(failing)
        assert fake.texts(channel.id) == [DISCORD_FAILED]
        assert len(before._waiting) == 1 and await claimed(world, guild, failing)
        await before.stop()  # its last try: a 503 again
        tries = api.of(THREAD_ROUTE)
        assert [call.path for call in tries] == [
            f"/api/v10/channels/{channel.id}/messages/{failing.id}/threads"
        ] * 2
        assert not await claimed(world, guild, failing)
    finally:
        await before.pipeline.close()
        await before.client.http.close()

    failing.create_thread.side_effect = opens  # Discord is back
    holds(channel, asked, failing)
    after = test_discord.new_adapter(world, fake)
    await ready(after, guild)
    await settle(world, after)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]
    await after.catchup.stop()
    await after.pipeline.close()


async def test_a_message_whose_retries_ran_out_lets_go_of_its_claim(world, fake, api):
    """The retries' hour out (two tries here), Discord failing throughout: the claim is let
    go, and another delivery (the next READY's catch-up) takes the message again."""
    guild, user = fake.guild(), fake.user()
    adapter = DiscordAdapter(
        world.runtime.turns(), sync=False, resubmit_every_seconds=0.01, resubmit_tries=2
    )
    fake.attach(adapter.client)
    message = fake.mention(fake.text_channel(guild), user, "find MemGPT")
    await over_http(adapter, message)
    api.fail(THREAD_ROUTE, 503, times=100)
    try:
        await adapter.handle_message(message)
        [retries] = adapter._waiting
        assert await claimed(world, guild, message)
        await retries
        assert len(api.of(THREAD_ROUTE)) == 3  # the first try and two retries
        assert not await claimed(world, guild, message)
        events = world.runtime.memory.events
        assert await events.first_time(str(guild.id), f"discord:{message.id}", taker="next")
    finally:
        await adapter.pipeline.close()
        await adapter.client.http.close()


async def test_a_claim_is_let_go_only_by_its_taker(world):
    events, tenant = world.runtime.memory.events, "t1"
    assert await events.first_time(tenant, "discord:1", taker="first")
    assert not await events.let_go(tenant, "discord:1", taker="second")
    assert not await events.first_time(tenant, "discord:1", taker="second")
    assert await events.let_go(tenant, "discord:1", taker="first")
    assert await events.first_time(tenant, "discord:1", taker="second")


async def test_a_record_lets_go_of_its_claim_in_the_same_step_only_for_its_taker(world):
    """Recording a given-up message lets go of its claim in one step (a record never stands
    beside a claim its dead delivery still holds, which would make the next catch-up drop it
    unanswered as a duplicate), and only for the delivery that took it."""
    redis, tenant = world.runtime.memory.redis, "t1"
    events, records = world.runtime.memory.events, GivenUpMessages(redis, 3600)
    assert await events.first_time(tenant, "discord:7", taker="first")
    await records.add(tenant, "42", "7", ("discord:7", "second"))  # not its taker: kept
    assert await redis.exists(seen_event_key(tenant, "discord:7"))
    await records.add(tenant, "42", "7", ("discord:7", "first"))
    assert not await redis.exists(seen_event_key(tenant, "discord:7"))
    assert await records.of([tenant]) == [(tenant, 42, 7)]


# -- the message itself recorded: read again by id, whatever passed its place's cursor -------


async def given_up_at_stop(world, fake, api, channel: Any, *passing: Any) -> Any:
    """A process that answers a first mention in `channel` (its cursor there: none if no
    `passing`), then one Discord fails (503) to open a thread for until it stops, while each of
    `passing` (a later message in the place, or a READY) goes by meanwhile: that mention, and
    the first, in `channel`'s history."""
    before = DiscordAdapter(
        world.runtime.turns(), sync=False, resubmit_every_seconds=3600.0, last_tries_seconds=5.0
    )
    fake.attach(before.client)
    posted = []
    if passing:
        asked = fake.mention(channel, fake.user(), "find MemGPT", message_id=now_id())
        await before.handle_message(asked)
        await settle(world, before)
        posted.append(asked)
    failing = fake.mention(channel, fake.user(), "and Voyager?", message_id=now_id())
    posted.append(failing)
    holds(channel, *posted)
    opens = await over_http(before, failing)
    api.fail(THREAD_ROUTE, 503, times=100)
    try:
        await before.handle_message(failing)
        assert len(before._waiting) == 1
        for then in passing:
            posted.extend(await then(before, failing))
            holds(channel, *posted)
        await before.stop()
    finally:
        await before.pipeline.close()
        await before.client.http.close()
    failing.create_thread.side_effect = opens  # Discord is back
    return failing


async def given_up_records(world, guild: Any) -> list[tuple[str, int, int]]:
    return await GivenUpMessages(world.runtime.memory.redis, 3600).of([str(guild.id)])


async def answered_at_next_ready(world, fake, guild: Any) -> None:
    after = test_discord.new_adapter(world, fake)
    await ready(after, guild)
    await settle(world, after)
    await after.catchup.stop()
    await after.pipeline.close()


async def test_a_message_given_up_after_a_later_one_passed_is_answered(world, fake, api):
    """(a) A later message in the place moves its cursor past the mention being retried: the
    mention given up at stop() is recorded, so the next READY fetches and answers it."""
    guild = fake.guild()
    channel = fake.text_channel(guild)
    cursors = PlaceCursors(world.runtime.memory.redis)

    async def chatter_passes(adapter: DiscordAdapter, failing: Any) -> list[Any]:
        chatter = fake.message(channel, fake.user(), "lunch?", message_id=now_id())
        await adapter.handle_message(chatter)
        places = await cursors.places(str(guild.id))
        assert places[str(channel.id)] == str(chatter.id)  # the cursor passed the mention
        return [chatter]

    failing = await given_up_at_stop(world, fake, api, channel, chatter_passes)
    places = await cursors.places(str(guild.id))  # the give-up left the cursor alone
    assert places[str(channel.id)] == str(fake.channels[channel.id].last_message_id)
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]
    assert fake.texts(channel.id) == [DISCORD_FAILED]  # the chatter stays unanswered
    assert await given_up_records(world, guild) == []  # taken: its record gone


async def test_a_message_read_by_a_catch_up_while_retried_is_answered_after_stop(world, fake, api):
    """(b) A READY while the mention is retried: its catch-up reads it (the claim held by the
    retries, so skipped) and moves the cursor to it. Given up at stop(), it is still read by
    the next process's READY and answered."""
    guild = fake.guild()
    channel = fake.text_channel(guild)

    async def a_ready(adapter: DiscordAdapter, failing: Any) -> list[Any]:
        await ready(adapter, guild)
        places = await adapter.catchup.cursors.places(str(guild.id))
        assert places[str(channel.id)] == str(failing.id)  # read, skipped, passed
        return []

    failing = await given_up_at_stop(world, fake, api, channel, a_ready)
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]


async def test_a_first_mention_given_up_in_a_place_with_no_cursor_is_answered(world, fake, api):
    """(d) The first mention in a channel (no cursor there yet), its thread failing to open
    until stop(): its record is read at the next READY, which fetches and answers it."""
    guild = fake.guild()
    channel = fake.text_channel(guild)
    failing = await given_up_at_stop(world, fake, api, channel)
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]


async def test_only_the_given_up_message_is_read_again_not_a_bare_mention_after_it(
    world, fake, api
):
    """A bare mention after the one given up, answered more than an hour before the next READY
    (its de-duplication claim lapsed; only turns are remembered as answered longer): the
    READY fetches the given-up mention alone, so the bare one is not answered twice."""
    guild = fake.guild()
    channel = fake.text_channel(guild)

    async def bare_mention(adapter: DiscordAdapter, failing: Any) -> list[Any]:
        bare = fake.mention(channel, fake.user(), "", message_id=now_id())
        await adapter.handle_message(bare)
        assert fake.texts(channel.id) == [DISCORD_FAILED, EMPTY_MENTION]
        await world.runtime.memory.redis.delete(  # an hour on: its claim lapsed
            seen_event_key(str(guild.id), f"discord:{bare.id}")
        )
        return [bare]

    failing = await given_up_at_stop(world, fake, api, channel, bare_mention)
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]
    assert fake.texts(channel.id) == [DISCORD_FAILED, EMPTY_MENTION]  # not told twice
    assert await given_up_records(world, guild) == []  # taken: its record gone


async def test_a_given_up_message_whose_channel_is_gone_is_dropped(world, fake, api, caplog):
    """The channel deleted before the next READY (Discord answers 404 for it): the record is
    dropped with a log line, not fetched again at every READY."""
    guild = fake.guild()
    channel = fake.text_channel(guild)
    failing = await given_up_at_stop(world, fake, api, channel)
    assert await given_up_records(world, guild) == [(str(guild.id), channel.id, failing.id)]
    del fake.channels[channel.id]  # gone: not cached, and fetching it answers 404
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == []
    assert await given_up_records(world, guild) == []
    assert f"message {failing.id} given up in {channel.id} is gone" in caplog.text


async def test_a_given_up_message_discord_fails_to_give_is_kept_for_the_next_ready(
    world, fake, api
):
    """Discord answers 503 to fetching the message at the first READY: its record stays, and
    the READY after that answers it."""
    guild = fake.guild()
    channel = fake.text_channel(guild)
    failing = await given_up_at_stop(world, fake, api, channel)
    answers = channel.fetch_message.side_effect
    channel.fetch_message.side_effect = discord.DiscordServerError(
        mock.Mock(status=503, reason="Service Unavailable"), "try later"
    )
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == []
    assert await given_up_records(world, guild) == [(str(guild.id), channel.id, failing.id)]
    channel.fetch_message.side_effect = answers  # Discord is back
    await answered_at_next_ready(world, fake, guild)
    assert fake.texts(failing.id) == ["Answer: and Voyager?"]
    assert await given_up_records(world, guild) == []


async def test_a_tenant_with_a_given_up_message_alone_stays_listed(world):
    """A message given up in a place with no cursor: its tenant stays listed (a READY reads
    its records) until both its cursors and its records are gone."""
    redis = world.runtime.memory.redis
    cursors, records = PlaceCursors(redis), GivenUpMessages(redis, 3600)
    tenant = f"dm-{uuid.uuid4().int % 10**18}"  # the Redis is shared by the tests
    await records.add(tenant, "7", "100")
    assert await cursors.places(tenant) == {}
    assert tenant in await cursors.tenants()
    await records.drop(tenant, 7, 100)
    assert await cursors.places(tenant) == {}
    assert tenant not in await cursors.tenants()
