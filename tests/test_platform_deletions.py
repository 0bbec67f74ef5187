"""A message its author deletes in Slack or Discord is forgotten by the bot too: the
adapters queue a durable background task that finds the stored message by its platform id
(`metadata["source"]`) and erases it as the memory page's Forget does; a turn still queued
for a deleted message is neither stored nor answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import discord
import pytest

from adapters.platform_ids import discord_source, slack_source
from adapters.slack import thread_id
from memory.scope import Scope, Visibility
from tests import test_discord
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import text
from tests.support.slack_api import mention, message
from tests.test_discord import back_and_taken, new_adapter, settle, stoppable
from tests.test_slack import slack_world, thread, ts

WAIT = 30.0  # seconds a test waits for the held turn to reach the model, at most


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        yield env


async def texts(memory, scope: Scope) -> list[str]:
    return [m.content for m in await memory.conversation.all(scope)]


async def found(memory, scope: Scope, query: str) -> list[str]:
    """What episodic search finds for `query` from `scope`, as texts."""
    vector = (await memory.embedder.embed([query]))[0]
    return [e.text for e in await memory.episodes.search(scope, query, vector, k=20)]


def deleted(ts_: str, thread_ts: str | None = None, channel: str = "C1", **previous: Any) -> dict:
    """Slack's `message_deleted` event for a person's message."""
    before = {"type": "message", "user": "U1", "text": "(gone)", "ts": ts_, **previous}
    if thread_ts:
        before["thread_ts"] = thread_ts
    return {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": channel,
            "channel_type": "channel", "deleted_ts": ts_, "previous_message": before,
            "event_ts": f"{time.time():.6f}", "ts": f"{time.time():.6f}"}  # fmt: skip


def tombstoned(ts_: str, channel: str = "C1") -> dict:
    """A thread's parent deleted in Slack: it stays as a tombstone (`message_changed`)."""
    now = {"type": "message", "subtype": "tombstone", "text": "This message was deleted.",
           "user": "USLACKBOT", "hidden": True, "ts": ts_, "thread_ts": ts_}  # fmt: skip
    before = {"type": "message", "user": "U1", "text": "(gone)", "ts": ts_, "thread_ts": ts_}
    return {"type": "message", "subtype": "message_changed", "hidden": True, "channel": channel,
            "channel_type": "channel", "message": now, "previous_message": before,
            "event_ts": f"{time.time():.6f}", "ts": f"{time.time():.6f}"}  # fmt: skip


def held_model(world, answer: str) -> tuple[asyncio.Event, asyncio.Event]:
    """The next agent call waits in the model until released: its question is stored by then
    (the turn stores it before calling the model), and later turns of its thread are queued."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def respond(body: dict):
        entered.set()
        await release.wait()
        return text(answer)

    world.model.responder = respond
    return entered, release


# -- Slack ---------------------------------------------------------------------------------------


async def walrus_thread(slack) -> tuple[str, Any, Scope]:
    """A new workspace's thread of two answered turns: a mention (ts 1), a reply (ts 2)."""
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    slack.world.model.script(text("Walruses migrate north."), text("The budget is fine."))
    await slack.a.event(mention("when do walruses migrate", ts(1)), team=team)
    await slack.settle()
    await slack.a.event(message("what about the zebra budget", ts(2), thread_ts=ts(1)), team=team)
    await slack.settle()
    return team, memory, thread(team, ts(1))


async def test_slack_deleted_messages_are_forgotten_and_the_rest_stays(slack):
    team, memory, here = await walrus_thread(slack)
    stored = await memory.conversation.all(here)
    assert [m.metadata.get("source") for m in stored] == [
        slack_source("C1", ts(1)), None, slack_source("C1", ts(2)), None
    ]  # fmt: skip
    assert "what about the zebra budget" in await found(memory, here, "zebra budget")

    # a message the bot never stored, and the bot's own message: nothing changes
    for event in (deleted(ts(7), thread_ts=ts(1)), deleted(ts(8), thread_ts=ts(1), bot_id="B1")):
        assert (await slack.a.event(event, team=team)).status == 200
    await slack.settle()
    assert len(await texts(memory, here)) == 4

    event = deleted(ts(2), thread_ts=ts(1))
    assert (await slack.a.event(event, team=team, event_id="EvDel")).status == 200
    await slack.settle()
    assert await texts(memory, here) == [
        "when do walruses migrate", "Walruses migrate north.", "The budget is fine."
    ]  # fmt: skip
    grave = (await memory.conversation.all(here, forgotten=True))[2]
    assert grave.forgotten and (grave.content, grave.author, grave.metadata) == ("", "", {})
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))
    assert "when do walruses migrate" in await found(memory, here, "walruses migrate")

    # redelivered, on the other process too: harmless
    await slack.b.event(event, team=team, event_id="EvDel", retry=1)
    await slack.a.event(event, team=team)
    await slack.settle()
    assert len(await memory.conversation.all(here, forgotten=True)) == 4
    assert len(await texts(memory, here)) == 3

    # the thread's first message: Slack keeps a parent with replies as a tombstone
    await slack.a.event(tombstoned(ts(1)), team=team)
    await slack.settle()
    assert await texts(memory, here) == ["Walruses migrate north.", "The budget is fine."]
    assert await memory.turn_records.of_thread(team, here.thread) == []  # their turns went too
    assert len(slack.world.model_requests()) == 2  # nothing was answered again


async def test_a_deletion_run_again_after_failing_half_way_finishes_the_clean_up(slack):
    """The erasure failed after the message became a tombstone (which keeps no source) and
    before its episodic entry and turn record went: run again, it still finds the message by
    the id its note kept, and finishes."""
    team, memory, here = await walrus_thread(slack)
    source = slack_source("C1", ts(2))
    stored = await memory.conversation.all(here)
    asked = next(m for m in stored if m.metadata.get("source") == source)
    assert "what about the zebra budget" in await found(memory, here, "zebra budget")

    # the first run's state when it failed: the note has the id, the message is a tombstone,
    # its episodic entry and its turn's record are still there
    await memory.governance.note_deleted(team, source, [asked.id])
    raw = (await memory.conversation.raw_threads(team, [here.thread]))[here.thread]
    grave = asked.tombstone().to_json()
    assert (
        await memory.conversation.replace(team, {here.thread: [(asked.seq, raw[asked.seq], grave)]})
        == {}
    )
    assert "what about the zebra budget" in await found(memory, here, "zebra budget")
    assert len(await memory.turn_records.of_thread(team, here.thread)) == 2

    await memory.governance.forget_deleted(team, [here.thread], source)  # the task, again
    await memory.governance.settle()
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))
    assert len(await memory.turn_records.of_thread(team, here.thread)) == 1


async def test_slack_dm_message_deleted_is_forgotten(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    slack.world.model.script(text("Noted."), text("Also noted."))
    dm = Scope(team, thread_id(team, "D1", "dm"), channel="D1", visibility=Visibility.DM)
    for n, said in ((1, "my secret plan"), (2, "my public plan")):
        event = message(said, ts(n), channel="D1", channel_type="im")
        await slack.a.event(event, team=team)
        await slack.settle()
    gone = deleted(ts(1), channel="D1") | {"channel_type": "im"}
    await slack.a.event(gone, team=team)
    await slack.settle()
    assert await texts(memory, dm) == ["Noted.", "my public plan", "Also noted."]


async def test_slack_deletion_of_a_queued_message_means_it_is_never_stored_nor_answered(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    here = thread(team, ts(1))
    entered, release = held_model(slack.world, "first answer")
    await slack.a.event(mention("first question", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # the first turn is at the model
    # queued behind it, then deleted before its turn comes
    await slack.b.event(message("second question", ts(2), thread_ts=ts(1)), team=team)
    await slack.a.event(deleted(ts(2), thread_ts=ts(1)), team=team)
    await slack.world.runtime.harness.drain()  # the deletion runs while the first turn waits
    release.set()
    await slack.settle()
    assert await texts(memory, here) == ["first question", "first answer"]
    assert slack.api.thread_texts("C1", ts(1)) == ["first answer"]
    assert len(slack.world.model_requests()) == 1
    # its vector, fetched ahead when it was queued, is not kept either
    assert not await memory.redis.exists(memory.embedder._key("second question"))


async def test_slack_deletion_while_its_turn_runs_forgets_it_once_stored(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    here = thread(team, ts(1))
    entered, release = held_model(slack.world, "an answer about otters")
    await slack.a.event(mention("tell me about otters", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # stored, and being answered
    await slack.a.event(tombstoned(ts(1)), team=team)
    await slack.world.runtime.harness.drain()
    release.set()
    await slack.settle()
    assert await texts(memory, here) == ["an answer about otters"]
    # the turn's record (it holds the question) was written after the erasure: it went too
    assert await memory.turn_records.of_thread(team, here.thread) == []
    assert not any("tell me" in hit for hit in await found(memory, here, "otters"))


# -- Discord -------------------------------------------------------------------------------------

world = test_discord.world  # its fixture: a world whose model echoes the question


def deletion(
    message_id: int, channel_id: int, guild_id: int | None
) -> discord.RawMessageDeleteEvent:
    data: dict[str, str] = {"id": str(message_id), "channel_id": str(channel_id)}
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
    return discord.RawMessageDeleteEvent(data)  # type: ignore[arg-type]


@dataclass
class DiscordWalrus:
    """A Discord server thread the bot opened from a mention, with a follow-up in it."""

    guild: Any
    channel: Any  # where the mention was
    user: Any
    asked: Any  # the mention, "when do walruses migrate"
    opened: Any  # the thread
    follow_up: Any  # "what about the zebra budget"
    here: Scope  # the thread's memory


async def discord_walrus_thread(world, fake: FakeDiscord, adapter) -> DiscordWalrus:
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    asked = fake.mention(channel, user, "when do walruses migrate")
    await adapter.handle_message(asked)
    await settle(world, adapter)
    opened = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    follow_up = fake.message(opened, user, "what about the zebra budget")
    await adapter.handle_message(follow_up)
    await settle(world, adapter)
    here = Scope(str(guild.id), f"discord:{guild.id}:{opened.id}")
    return DiscordWalrus(guild, channel, user, asked, opened, follow_up, here)


async def test_discord_deleted_messages_are_forgotten(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    walrus = await discord_walrus_thread(world, fake, adapter)
    guild, channel, asked = walrus.guild, walrus.channel, walrus.asked
    opened, follow_up, here = walrus.opened, walrus.follow_up, walrus.here
    tenant = str(guild.id)
    stored = await memory.conversation.all(here)
    assert stored[2].metadata == {"source": discord_source(follow_up.id)}
    assert "what about the zebra budget" in await found(memory, here, "zebra budget")

    # a message never stored: nothing changes
    await adapter.client.on_raw_message_delete(deletion(fake.snowflake(), opened.id, guild.id))
    await settle(world, adapter)
    assert len(await texts(memory, here)) == 4

    for _ in range(2):  # the gateway may deliver it twice: harmless
        await adapter.client.on_raw_message_delete(deletion(follow_up.id, opened.id, guild.id))
    await settle(world, adapter)
    assert await texts(memory, here) == [
        "when do walruses migrate", "Answer: when do walruses migrate",
        "Answer: what about the zebra budget",
    ]  # fmt: skip
    assert "what about the zebra budget" not in await found(memory, here, "zebra budget")

    # the mention, in the channel: its turn is in the thread opened from it (same id)
    await adapter.client.on_raw_message_delete(deletion(asked.id, channel.id, guild.id))
    await settle(world, adapter)
    assert await texts(memory, here) == [
        "Answer: when do walruses migrate", "Answer: what about the zebra budget"
    ]  # fmt: skip
    assert await memory.turn_records.of_thread(tenant, here.thread) == []


async def test_discord_dm_deletion_finds_the_person_of_the_dm(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    user = fake.user()
    dm = fake.dm_channel(user)
    said = [fake.message(dm, user, "my secret plan"), fake.message(dm, user, "my public plan")]
    for message_ in said:
        await adapter.handle_message(message_)
        await settle(world, adapter)
    here = Scope(f"dm-{user.id}", f"discord:dm:{dm.id}")
    assert len(await texts(memory, here)) == 4

    # a DM channel Discord does not know (fetching it fails): skipped, nothing breaks
    await adapter.client.on_raw_message_delete(deletion(said[0].id, fake.snowflake(), None))
    await adapter.client.on_raw_message_delete(deletion(said[0].id, dm.id, None))
    await settle(world, adapter)
    assert await texts(memory, here) == [
        "Answer: my secret plan", "my public plan", "Answer: my public plan"
    ]  # fmt: skip


async def test_discord_deletion_of_a_queued_message_means_it_is_never_answered(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    entered, release = held_model(world, "first answer")
    await adapter.handle_message(fake.mention(channel, user, "first question"))
    await asyncio.wait_for(entered.wait(), WAIT)
    opened = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    second = fake.message(opened, user, "second question")
    await adapter.handle_message(second)  # queued behind the first
    await adapter.client.on_raw_message_delete(deletion(second.id, opened.id, guild.id))
    await world.runtime.harness.drain()
    release.set()
    await settle(world, adapter)
    here = Scope(str(guild.id), f"discord:{guild.id}:{opened.id}")
    assert await texts(memory, here) == ["first question", "first answer"]
    assert fake.texts(opened.id) == ["first answer"]


async def test_discord_deletion_while_memory_is_down_is_kept_and_done_when_back(tmp_path):
    """Discord sends a deletion once: the adapter keeps it until Redis is back."""
    fake = FakeDiscord()
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        user = fake.user()
        dm = fake.dm_channel(user)
        said = fake.message(dm, user, "my secret plan")
        await adapter.handle_message(said)
        await settle(world, adapter)
        here = Scope(f"dm-{user.id}", f"discord:dm:{dm.id}")
        server.stop()
        await adapter.client.on_raw_message_delete(deletion(said.id, dm.id, None))
        await back_and_taken(server, world, adapter)
        assert await texts(world.runtime.memory, here) == ["Answer: my secret plan"]


async def test_discord_bulk_deletion_forgets_each_message(world):
    """A moderator's purge (MESSAGE_DELETE_BULK) forgets every stored message it names."""
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "when do walruses migrate"))
    await settle(world, adapter)
    opened = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    purged = []
    for question in ("the zebra budget", "the okapi grant"):
        purged.append(fake.message(opened, user, question))
        await adapter.handle_message(purged[-1])
        await settle(world, adapter)
    here = Scope(str(guild.id), f"discord:{guild.id}:{opened.id}")
    assert len(await texts(memory, here)) == 6

    ids = [str(m.id) for m in purged]
    data = {"ids": ids, "channel_id": str(opened.id), "guild_id": str(guild.id)}
    payload = discord.RawBulkMessageDeleteEvent(data)  # type: ignore[arg-type]
    await adapter.client.on_raw_bulk_message_delete(payload)
    await settle(world, adapter)
    assert await texts(memory, here) == [
        "when do walruses migrate", "Answer: when do walruses migrate",
        "Answer: the zebra budget", "Answer: the okapi grant",
    ]  # fmt: skip
