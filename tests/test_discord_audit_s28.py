"""Audit s28, Discord: a bare mention edited into a question is answered; /watch answers in
Discord's 3 s while Redis hangs (deferred, then its follow-up), a slow add made once; an
answer refused in its place is said by DM; /summarize's follow-up failing still answers."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any
from unittest import mock

import discord
import pytest

from adapters.discord import EMPTY_MENTION
from adapters.spine import NOT_SHOWN
from memory.keys import watches_key
from tests import test_discord
from tests.agent_world import close_world, open_world
from tests.support.discord_fakes import FakeDiscord
from tests.support.redis_gate import RedisGate
from tests.test_discord import new_adapter, settle
from tests.test_platform_edits import edit

# test_discord's fixtures: a world whose model echoes, a fake Discord, an adapter on both
world, fake, adapter = test_discord.world, test_discord.fake, test_discord.adapter


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


# -- 1. a bare mention, then edited into a question -------------------------------------------


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
async def test_a_bare_mention_edited_into_a_question_is_answered_once(world, fake, adapter, cached):
    """`@ArxivScout` alone is told how to ask; edited into a question it is answered, once
    (the gateway may deliver the update twice), in the thread opened from it. Cached, the
    message before the edit mentioned the bot but asked nothing; uncached, the bare
    mention's de-duplication claim must not hold the question out."""
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    bare = fake.mention(channel, user, "")
    before = fake.mention(channel, user, "", message_id=bare.id)  # as the cache keeps it
    await adapter.handle_message(bare)
    await settle(world, adapter)
    assert fake.texts(channel.id) == [EMPTY_MENTION]

    for _ in range(2):
        update = edit(bare, f"<@{fake.bot.id}> find MemGPT")
        if cached:
            update.cached_message = before
        await adapter.client.on_raw_message_edit(update)
        await settle(world, adapter)
    assert fake.texts(bare.id) == ["Answer: find MemGPT"]  # the thread opened from it
    assert fake.texts(channel.id) == [EMPTY_MENTION]
    assert len(world.model_requests()) == 1


# -- 2. /watch within Discord's 3 s -----------------------------------------------------------


@pytest.fixture
async def gated(redis_url, tmp_path):
    gate = RedisGate(redis_url)
    world = await open_world(await gate.start(), tmp_path)
    yield world, gate
    gate.release.set()
    await close_world(world)
    await gate.close()


def watch_callback(adapter: Any, sub: str) -> Any:
    group = adapter.tree.get_command("watch")
    return group.get_command(sub).callback


async def run_while_redis_holds(gate, guild, interaction, command):
    """Run a /watch command while Redis holds its guild's watches; it must defer meanwhile.
    Released then, the command finishes: its interaction's response, for the test to check."""
    gate.hold(watches_key(str(guild.id)).encode())
    running = asyncio.create_task(command)
    try:
        # bounded: a command that never reaches Redis fails here rather than hanging the run
        await asyncio.wait_for(gate.held.wait(), 30)
        response = interaction.response
        await until(lambda: response.defer.await_count == 1, "not deferred while Redis hangs")
        gate.release.set()
        await running
    finally:
        gate.release.set()
        running.cancel()
    return response


async def test_watch_add_defers_while_redis_hangs_and_makes_one_watch(gated):
    """Redis holds the watch's write: the command defers ("thinking…") rather than letting
    Discord's 3 s pass ("The application did not respond", and a person asking again makes a
    second watch); once Redis answers, the follow-up says the watch was made, once."""
    world, gate = gated
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    interaction = fake.interaction(channel, user)
    interaction.app_permissions = discord.Permissions(view_channel=True, send_messages=True)
    command = watch_callback(adapter, "add")(interaction, topic="state space models")
    response = await run_while_redis_holds(gate, guild, interaction, command)
    assert response.defer.await_args.kwargs == {"ephemeral": False, "thinking": True}
    response.send_message.assert_not_awaited()
    [watch] = await world.runtime.watches.store.all(str(guild.id))
    [said] = fake.texts(channel.id)
    assert said.startswith("Watching “state space models”") and watch.id in said


async def test_watch_list_defers_only_to_the_person_while_redis_hangs(gated):
    """`/watch list` while Redis holds its read: deferred only to the person, then answered."""
    world, gate = gated
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    interaction = fake.interaction(channel, user)
    command = watch_callback(adapter, "list")(interaction)
    response = await run_while_redis_holds(gate, guild, interaction, command)
    assert response.defer.await_args.kwargs == {"ephemeral": True, "thinking": True}
    response.send_message.assert_not_awaited()
    assert interaction.followup.send.await_args.kwargs == {"ephemeral": True}
    assert len(fake.texts(channel.id)) == 1


# -- 3. an answer Discord refuses in its place --------------------------------------------------


def forbidden(message: str = "Missing Permissions") -> discord.Forbidden:
    return discord.Forbidden(mock.Mock(status=403, reason="Forbidden"), message)


def dms_to(fake: FakeDiscord, adapter: Any, user: Any) -> Any:
    """The person's DM with the bot, as `client.create_dm` opens it (Discord's side)."""
    dm = fake.dm_channel(user)
    client = adapter.client
    client.create_dm = mock.create_autospec(client.create_dm, return_value=dm)
    return dm


def where(channel_id: int) -> str:
    return f"About your message in <#{channel_id}>, where Discord does not let me post: "


async def test_a_notice_refused_in_a_locked_thread_is_said_by_dm(world, fake, adapter):
    """The thread is locked (or Send Messages denied) when the answer comes: the answer and
    then the notice of it are refused there, so the notice goes to the person by DM, naming
    the thread, rather than nowhere."""
    guild, user = fake.guild(), fake.user()
    opened = fake.thread(guild, owner_id=fake.bot.id)  # a thread the bot answers in
    opened.send.side_effect = forbidden()
    dm = dms_to(fake, adapter, user)
    await adapter.handle_message(fake.message(opened, user, "find MemGPT"))
    await settle(world, adapter)
    [told] = fake.texts(dm.id)  # a locked thread refuses: not shown
    assert told == where(opened.id) + NOT_SHOWN, told
    assert adapter.client.create_dm.await_args.args[0].id == user.id


async def test_a_turn_whose_channel_is_gone_is_said_not_shown_by_dm(world, fake, adapter):
    """The thread is deleted, or hidden from the bot, before the turn runs: Discord refuses
    it for good (`refused`), so the person is told NOT_SHOWN, by DM as the thread is gone."""
    guild, user = fake.guild(), fake.user()
    opened = fake.thread(guild, owner_id=fake.bot.id)
    del fake.channels[opened.id]  # Discord: Unknown Channel
    dm = dms_to(fake, adapter, user)
    await adapter.handle_message(fake.message(opened, user, "find MemGPT"))
    await settle(world, adapter)
    assert fake.texts(dm.id) == [where(opened.id) + NOT_SHOWN]


# -- 4. /summarize's follow-up failing ----------------------------------------------------------


def token_expired() -> discord.HTTPException:
    response = mock.Mock(status=401, reason="Unauthorized")
    return discord.HTTPException(response, {"code": 50027, "message": "Invalid Webhook Token"})


async def summarized_thread(world, fake, adapter) -> tuple[Any, Any]:
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "Can you get me the paper MemGPT"))
    await settle(world, adapter)
    return next(c for c in fake.channels.values() if isinstance(c, discord.Thread)), user


@pytest.mark.parametrize("edit_works", [True, False], ids=["edited", "told-in-channel"])
async def test_summarize_whose_follow_up_fails_still_answers(world, fake, adapter, edit_works):
    """The follow-up is refused (the token expired): the answer replaces "thinking…" through
    an edit of the original response; that failing too, the thread is told the summary was
    stored (so the person does not run /summarize again for a second one)."""
    thread, user = await summarized_thread(world, fake, adapter)
    interaction = fake.interaction(thread, user)
    interaction.followup.send.side_effect = token_expired()
    if not edit_works:
        interaction.edit_original_response.side_effect = token_expired()
    await adapter.tree.get_command("summarize").callback(interaction)
    if edit_works:
        shown = interaction.edit_original_response.await_args.kwargs["content"]
        assert re.match(r"Stored as \[Summary ID: sum_\w+\]", shown), shown
        return
    interaction.edit_original_response.assert_awaited_once()
    told = fake.texts(thread.id)[-1]
    stored = re.search(r"stored as \[Summary ID: (sum_\w+)\]: `/expand \1` shows it", told)
    assert stored and told.startswith("I could not show the answer to /summarize"), told
