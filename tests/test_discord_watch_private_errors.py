"""`/watch add` past its quick-answer window (Redis slow, so the command defers its answer
publicly, as a watch made is the channel's news): a watch not made (a topic arXiv cannot
search, Redis away) is still said only to the person who asked, as when it is quick. A
follow-up would fill the channel's "thinking…" and be shown there (`Shown` models it, and
keeps all the channel was shown)."""

from __future__ import annotations

import asyncio

import discord
import pytest

from bot.watches import UNREACHABLE
from memory.keys import thread_channels_key
from tests.support.discord_fakes import FakeDiscord
from tests.test_discord import new_adapter
from tests.test_discord_audit_s28 import gated, until, watch_callback  # noqa: F401 (fixture)
from tests.test_discord_expand_private_miss import Shown, assert_channel_told_nothing

TOPIC = "状态空间模型"  # no word arXiv's search reads: refused


@pytest.mark.parametrize("redis", ["slow", "lost"])
async def test_a_slow_watch_add_that_makes_no_watch_is_said_only_to_the_person(gated, redis):  # noqa: F811
    """Redis holds the note of the command's thread (the first write of `/watch add` there),
    then answers (the topic is refused) or is cut off."""
    world, gate = gated
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    guild = fake.guild()
    thread, user = fake.thread(guild, owner_id=fake.user().id), fake.user()
    interaction = fake.interaction(thread, user)
    interaction.app_permissions = discord.Permissions(
        view_channel=True, send_messages_in_threads=True
    )
    shown = Shown(interaction, fake)
    gate.hold(thread_channels_key(str(guild.id)).encode())
    running = asyncio.create_task(watch_callback(adapter, "add")(interaction, topic=TOPIC))
    try:
        await asyncio.wait_for(gate.held.wait(), 30)
        await until(lambda: interaction.response.defer.await_count == 1, "not deferred")
        if redis == "slow":
            gate.release.set()
        else:
            gate.cut()
        await asyncio.wait_for(running, 30)
    finally:
        gate.release.set()
        gate.mend()
        running.cancel()
    assert interaction.response.defer.await_args.kwargs == {"ephemeral": False, "thinking": True}
    [(text, private)] = shown.answers
    assert private, shown.answers
    if redis == "slow":
        assert text.startswith(f"I cannot search arXiv for “{TOPIC}”"), text
    else:
        assert text == UNREACHABLE
    assert fake.texts(thread.id) == [] and fake.texts(thread.parent_id) == []
    assert_channel_told_nothing(shown)
    assert await world.runtime.watches.store.all(str(guild.id)) == []
