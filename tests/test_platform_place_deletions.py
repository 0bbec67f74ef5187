"""A channel or thread deleted in Slack or Discord is forgotten by the bot too: the adapter
queues a durable background task that erases each of its threads whole (as the memory page's
Forget thread does) and removes the watches posting there; other places stay. A turn queued or
running there when it goes stores nothing that survives."""

from __future__ import annotations

import asyncio
import time

import discord

from memory.governance import Erasure
from memory.governance_places import DeletedPlace
from memory.keys import deleted_thread_key, forgetting_key, tenant_key
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope
from memory.stores.watches import DAY, WatchStore
from tests import test_discord, test_platform_deletions
from tests.conftest import free_port, redis_options
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import text
from tests.support.slack_api import mention, message
from tests.test_discord import back_and_taken, new_adapter, settle, stoppable
from tests.test_platform_deletions import WAIT, found, held_model, texts, walrus_thread
from tests.test_slack import slack_world, thread, ts

slack = test_platform_deletions.slack  # its fixture: two bot processes and a local Slack
world = test_discord.world  # its fixture: a world whose model echoes the question
LATER = time.time() + 1000 * DAY  # watches made here are never due while the tests run


def channel_deleted(channel: str, kind: str = "channel_deleted") -> dict:
    """Slack's `channel_deleted` (a private channel: `group_deleted`) event."""
    return {"type": kind, "channel": channel, "event_ts": f"{time.time():.6f}"}


def thread_deleted(thread: discord.Thread) -> discord.RawThreadDeleteEvent:
    data = {"id": str(thread.id), "type": discord.ChannelType.public_thread.value,
            "guild_id": str(thread.guild.id), "parent_id": str(thread.parent_id)}  # fmt: skip
    return discord.RawThreadDeleteEvent(data)  # type: ignore[arg-type]


async def watch_in(memory, tenant: str, platform: str, channel: str) -> str:
    scope = Scope(tenant, channel=channel, user="U1")
    made = await WatchStore(memory.redis).create(
        scope, "memory", 7 * DAY, platform=platform, channel=channel, now=LATER
    )
    return made.id


async def watches(memory, tenant: str) -> set[str]:
    return {w.id for w in await WatchStore(memory.redis).all(tenant)}


async def stored_threads(memory, tenant: str) -> set[str]:
    return {t for t, _ in await memory.conversation.threads(tenant)}


# -- Slack ---------------------------------------------------------------------------------------


async def test_slack_channel_deleted_forgets_its_threads_and_keeps_the_others(slack):
    team, memory, walrus = await walrus_thread(slack)  # in C1
    slack.world.model.script(text("Okapis got the grant."), text("Walruses are loud."))
    await slack.a.event(mention("did the okapi grant come", ts(3), channel="C2"), team=team)
    await slack.a.event(mention("are walruses loud", ts(4)), team=team)  # a second C1 thread
    await slack.settle()
    okapi = thread(team, ts(3), channel="C2")
    c1_watch, c2_watch = [await watch_in(memory, team, "slack", c) for c in ("C1", "C2")]
    assert await watches(memory, team) == {c1_watch, c2_watch}
    assert "when do walruses migrate" in await found(memory, okapi, "walruses migrate")
    assert await memory.presence.last_thread(Scope(team, channel="C1", user="U1")) == ts(4)

    slack.api.missing_channels.add("C1")  # deleted in Slack
    assert (await slack.a.event(channel_deleted("C1"), team=team)).status == 200
    await slack.settle()
    assert await stored_threads(memory, team) == {okapi.thread}
    assert await memory.conversation.all(walrus, forgotten=True) == []
    assert await memory.turn_records.of_thread(team, walrus.thread) == []
    assert not await memory.presence.joined(walrus)
    assert await memory.presence.last_thread(Scope(team, channel="C1", user="U1")) is None
    assert not any("walrus" in hit.lower() for hit in await found(memory, okapi, "walruses"))
    assert await watches(memory, team) == {c2_watch}
    kept = ["did the okapi grant come", "Okapis got the grant."]
    assert await texts(memory, okapi) == kept
    assert "did the okapi grant come" in await found(memory, okapi, "okapi grant")

    # redelivered, on the other process, and as a private channel's event: harmless
    await slack.b.event(channel_deleted("C1"), team=team, retry=1)
    await slack.a.event(channel_deleted("C1", "group_deleted"), team=team)
    await slack.settle()
    assert await stored_threads(memory, team) == {okapi.thread}
    assert await texts(memory, okapi) == kept
    assert await watches(memory, team) == {c2_watch}


async def test_slack_turns_running_or_queued_in_a_deleted_channel_leave_nothing(slack):
    """The channel goes while a turn of its thread is at the model and another is queued: the
    running one stores its answer after the erasure, and forgets its thread again when it
    ends; the queued one is neither run nor stored."""
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    here = thread(team, ts(1))
    entered, release = held_model(slack.world, "an answer about otters")
    await slack.a.event(mention("tell me about otters", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # stored, and being answered
    await slack.b.event(message("and sea otters", ts(2), thread_ts=ts(1)), team=team)
    slack.api.missing_channels.add("C1")
    await slack.a.event(channel_deleted("C1"), team=team)
    await slack.world.runtime.harness.drain()  # the erasure runs while the turn waits
    assert await memory.conversation.all(here, forgotten=True) == []
    release.set()
    await slack.settle()
    assert await memory.conversation.all(here, forgotten=True) == []
    assert here.thread not in await stored_threads(memory, team)
    assert await memory.turn_records.of_thread(team, here.thread) == []
    assert not any("otter" in hit for hit in await found(memory, here, "otters"))
    assert len(slack.world.model_requests()) == 1  # the queued one was not answered


async def test_slack_channel_deletion_while_memory_is_down_is_refused_then_done(tmp_path):
    """Memory down: answered 503, so Slack sends the event again; then it is done."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    try:
        async with slack_world(server.ensure_running(), tmp_path) as env:
            team, memory, walrus = await walrus_thread(env)
            server.stop()
            assert (await env.a.event(channel_deleted("C1"), team=team)).status == 503
            server.ensure_running()
            assert (await env.a.event(channel_deleted("C1"), team=team, retry=1)).status == 200
            await env.settle()
            assert await memory.conversation.all(walrus, forgotten=True) == []
    finally:
        server.stop()


# -- Discord -------------------------------------------------------------------------------------


async def ask_in(world, adapter, fake, channel, user, question: str) -> discord.Thread:
    """A mention in `channel`, answered in the thread it opens (returned)."""
    before = set(fake.channels)
    await adapter.handle_message(fake.mention(channel, user, question))
    await settle(world, adapter)
    return next(c for i, c in fake.channels.items() if i not in before)


def scope_of(opened: discord.Thread) -> Scope:
    return Scope(str(opened.guild.id), f"discord:{opened.guild.id}:{opened.id}")


async def test_discord_channel_deleted_forgets_its_threads_and_keeps_the_others(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    guild, user = fake.guild(), fake.user()
    doomed, other = fake.text_channel(guild), fake.text_channel(guild)
    walrus = await ask_in(world, adapter, fake, doomed, user, "when do walruses migrate")
    await adapter.handle_message(fake.message(walrus, user, "what about the zebra budget"))
    seals = await ask_in(world, adapter, fake, doomed, user, "where do seals sleep")
    okapi = await ask_in(world, adapter, fake, other, user, "did the okapi grant come")
    await settle(world, adapter)
    tenant = str(guild.id)
    gone = [await watch_in(memory, tenant, "discord", str(c.id)) for c in (doomed, walrus)]
    kept = await watch_in(memory, tenant, "discord", str(other.id))
    assert await watches(memory, tenant) == {*gone, kept}
    assert "what about the zebra budget" in await found(memory, scope_of(okapi), "zebra budget")

    for channel in (doomed, walrus, seals):  # gone on Discord; its threads with it
        fake.channels.pop(channel.id)
    for _ in range(2):  # delivered twice: harmless
        await adapter.client.on_guild_channel_delete(doomed)
    await settle(world, adapter)
    assert await stored_threads(memory, tenant) == {scope_of(okapi).thread}
    for opened in (walrus, seals):
        assert await memory.conversation.all(scope_of(opened), forgotten=True) == []
        assert await memory.turn_records.of_thread(tenant, scope_of(opened).thread) == []
    assert await texts(memory, scope_of(okapi)) == [
        "did the okapi grant come", "Answer: did the okapi grant come"
    ]  # fmt: skip
    hits = await found(memory, scope_of(okapi), "zebra budget walruses seals")
    assert not any(word in hit for hit in hits for word in ("zebra", "walrus", "seals"))
    assert await watches(memory, tenant) == {kept}


async def test_discord_thread_deleted_forgets_only_that_thread(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    guild, user = fake.guild(), fake.user()
    channel = fake.text_channel(guild)
    walrus = await ask_in(world, adapter, fake, channel, user, "when do walruses migrate")
    seals = await ask_in(world, adapter, fake, channel, user, "where do seals sleep")
    tenant = str(guild.id)
    in_walrus = await watch_in(memory, tenant, "discord", str(walrus.id))
    in_channel = await watch_in(memory, tenant, "discord", str(channel.id))
    assert await watches(memory, tenant) == {in_walrus, in_channel}

    fake.channels.pop(walrus.id)
    for _ in range(2):  # delivered twice: harmless
        await adapter.client.on_raw_thread_delete(thread_deleted(walrus))
    await settle(world, adapter)
    assert await stored_threads(memory, tenant) == {scope_of(seals).thread}
    assert await memory.conversation.all(scope_of(walrus), forgotten=True) == []
    assert not any("walrus" in hit for hit in await found(memory, scope_of(seals), "walruses"))
    assert await texts(memory, scope_of(seals)) == [
        "where do seals sleep", "Answer: where do seals sleep"
    ]  # fmt: skip
    assert await watches(memory, tenant) == {in_channel}

    # its channel deleted later: the other thread goes too
    fake.channels.pop(channel.id)
    await adapter.client.on_guild_channel_delete(channel)
    await settle(world, adapter)
    assert await stored_threads(memory, tenant) == set()
    assert await watches(memory, tenant) == set()


async def test_discord_deletion_of_a_thread_the_bot_never_used_takes_no_lock(world):
    """Every thread deletion of a server arrives: one the bot never took part in (nor has a
    watch posting there) is settled by a few lookups, leaving every key as it was and taking
    no erasure lock: here another erasure holds it, for which one taking it would wait and
    then give up (Busy)."""
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory, guild = world.runtime.memory, fake.guild()
    channel, tenant = fake.text_channel(guild), str(guild.id)
    walrus = await ask_in(world, adapter, fake, channel, fake.user(), "when do walruses migrate")
    unused = fake.thread(guild, fake.user().id, parent_id=channel.id)
    watched = fake.thread(guild, fake.user().id, parent_id=channel.id)
    in_watched = await watch_in(memory, tenant, "discord", str(watched.id))
    governance = memory.governance

    def deleted(thread: discord.Thread) -> DeletedPlace:
        return DeletedPlace(tenant, "discord", str(thread.id), parent=str(channel.id))

    assert await memory.redis.set(forgetting_key(tenant), "another erasure", px=600_000)
    try:
        keys = set(await memory.redis.keys(tenant_key(tenant, "*")))
        for _ in range(2):
            assert await governance.forget_place(deleted(unused)) == Erasure()
        noted = deleted_thread_key(tenant, f"discord:{tenant}:{unused.id}")  # a day, cheap
        assert set(await memory.redis.keys(tenant_key(tenant, "*"))) == keys | {noted.encode()}
    finally:
        await memory.redis.delete(forgetting_key(tenant))
    assert await watches(memory, tenant) == {in_watched}
    assert await governance.forget_place(deleted(watched)) == Erasure()  # its watch went
    assert await watches(memory, tenant) == set()
    assert (await governance.forget_place(deleted(walrus))).threads == 1
    assert await stored_threads(memory, tenant) == set()
    assert await governance.forget_place(deleted(walrus)) == Erasure()  # run again: nothing


async def test_discord_thread_deletion_while_memory_is_down_is_kept_and_done_when_back(tmp_path):
    """Discord sends a deletion once: the adapter keeps it until Redis is back."""
    fake = FakeDiscord()
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        guild = fake.guild()
        opened = await ask_in(
            world, adapter, fake, fake.text_channel(guild), fake.user(), "where do seals sleep"
        )
        server.stop()
        await adapter.client.on_raw_thread_delete(thread_deleted(opened))
        await back_and_taken(server, world, adapter)
        memory = world.runtime.memory
        assert await memory.conversation.all(scope_of(opened), forgotten=True) == []
