"""A Discord message taken again after a try that got further than it knew is queued once, in
its own thread: Discord sends a message once, so the adapter retries it itself
(`_retry_later`), and every step of taking it must be safe to repeat."""

from __future__ import annotations

import asyncio
from unittest import mock

import discord

from adapters.discord import DiscordAdapter
from adapters.spine import NOT_TAKEN
from memory.scope import Scope
from tests import test_discord
from tests.support.discord_fakes import FakeDiscord
from tests.test_discord import back_and_taken, history, settle, stoppable

# test_discord's fixtures: a world whose model echoes, a fake Discord, an adapter on both
world, fake, adapter = test_discord.world, test_discord.fake, test_discord.adapter

NO_THREAD = "I could not open a thread"


def refused_twice(fake: FakeDiscord, message, first_opened) -> None:
    """Discord's `create_thread`: the first call opens the thread (then `first_opened` runs),
    a second is refused, as Discord refuses a second thread from one message."""
    opened = message.create_thread.side_effect

    async def create_thread(*, name: str, **kw):
        if message.create_thread.await_count > 1:
            response = mock.Mock(status=400, reason="Bad Request")
            raise discord.HTTPException(
                response, {"code": 160004, "message": "A thread has already been created"}
            )
        thread = await opened(name=name, **kw)
        first_opened(thread)
        return thread

    message.create_thread.side_effect = create_thread


async def wait_for_answer(fake: FakeDiscord, channel_id: int, answer: str) -> None:
    for _ in range(200):
        if answer in fake.texts(channel_id):
            return
        await asyncio.sleep(0.1)


async def test_redis_lost_after_the_thread_opened_is_answered_in_that_thread(tmp_path, fake):
    """Redis fails right after the mention's thread is opened: the person is told, and once
    Redis is back the retry answers in that thread (it does not open another, which Discord
    refuses, nor say it lacks a permission)."""
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        guild = fake.guild()
        channel, user = fake.text_channel(guild), fake.user()
        message = fake.mention(channel, user, "find MemGPT")
        refused_twice(fake, message, lambda thread: server.stop())
        await adapter.handle_message(message)
        assert fake.texts(channel.id) == [NOT_TAKEN]
        await back_and_taken(server, world, adapter)
        thread_id = message.id  # a thread opened from a message has its id
        await wait_for_answer(fake, thread_id, "Answer: find MemGPT")
        await settle(world, adapter)
        assert fake.texts(thread_id) == ["Answer: find MemGPT"]
        assert fake.texts(channel.id) == [NOT_TAKEN]  # no "I need the permission" error
        assert message.create_thread.await_count == 1  # the cached thread was reused
        scope = Scope(str(guild.id), f"discord:{guild.id}:{thread_id}")
        assert await adapter.presence.joined(scope)  # its follow-ups need no mention


async def test_an_uncached_thread_refused_again_is_found_on_discord(tmp_path, fake):
    """The thread is not in the cache (archived, or the event not seen yet): Discord refuses
    a second one, and the retry finds the first by the message's id."""
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        guild = fake.guild()
        channel, user = fake.text_channel(guild), fake.user()
        message = fake.mention(channel, user, "find MemGPT")
        refused_twice(fake, message, lambda thread: server.stop())
        cached = adapter.client.get_channel.side_effect
        adapter.client.get_channel.side_effect = lambda i: None if i == message.id else cached(i)
        await adapter.handle_message(message)
        await back_and_taken(server, world, adapter)
        await wait_for_answer(fake, message.id, "Answer: find MemGPT")
        await settle(world, adapter)
        assert message.create_thread.await_count == 2
        assert fake.texts(message.id) == ["Answer: find MemGPT"]
        assert fake.texts(channel.id) == [NOT_TAKEN]


async def test_a_retry_after_the_push_went_through_queues_nothing_more(world, fake, adapter):
    """The push reached Redis but its answer did not come back (SUBMIT_TIMEOUT, a dropped
    connection), or a later step failed: the adapter's retry of the same delivery (what
    `_retry_later` runs) neither answers twice nor stores the question twice."""
    guild = fake.guild()
    user = fake.user()
    mention = fake.mention(fake.text_channel(guild), user, "find MemGPT")
    someones = fake.thread(guild, owner_id=user.id)  # a thread the bot is mentioned in
    in_thread = fake.mention(someones, user, "and its authors?")
    dm = fake.message(fake.dm_channel(user), user, "hello in private")
    for message in (mention, in_thread, dm):
        await adapter._take(message, "one-delivery")
        await adapter._take(message, "one-delivery")  # a retry: the first try went through
    await settle(world, adapter)
    for message, channel_id, question in (
        (mention, mention.id, "find MemGPT"),
        (in_thread, someones.id, "and its authors?"),
        (dm, dm.channel.id, "hello in private"),
    ):
        assert fake.texts(channel_id) == [f"Answer: {question}"]
        tenant = str(guild.id) if message.guild else f"dm-{user.id}"
        place = f"discord:{guild.id}" if message.guild else "discord:dm"
        stored = await history(world, tenant, f"{place}:{channel_id}")
        assert stored.count(("user", question)) == 1, stored


async def test_two_deliveries_still_answer_once(world, fake, adapter: DiscordAdapter):
    """A gateway redelivery (a new delivery of the same message) stays de-duplicated."""
    guild = fake.guild()
    message = fake.mention(fake.text_channel(guild), fake.user(), "find MemGPT")
    await adapter.handle_message(message)
    await adapter.handle_message(message)
    await settle(world, adapter)
    assert fake.texts(message.id) == ["Answer: find MemGPT"]
    assert message.create_thread.await_count == 1
