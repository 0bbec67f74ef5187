"""What a deleted place leaves behind, and whom it tells: a Discord thread forgotten whole (Forget
thread, retention) leaves its channel's record of threads, so the record does not grow forever,
and the channel's deletion later still erases the threads that remain; a watch removed with
its deleted channel is told to its creator in one direct message, however often the deletion
runs."""

from __future__ import annotations

import contextlib
import time

from memory.governance_places import DeletedPlace
from memory.keys import (
    place_threads_key,
    thread_channels_key,
    turn_queue_key,
    turn_running_key,
)
from memory.scope import Scope
from memory.stores.watches import DAY, WatchStore
from tests import test_discord, test_watches_discord
from tests.support.discord_api import snowflake
from tests.support.discord_fakes import FakeDiscord
from tests.test_discord import new_adapter, settle
from tests.test_platform_place_deletions import LATER, ask_in, scope_of, stored_threads

world = test_discord.world  # its fixture: a world whose model echoes the question
api, env = test_watches_discord.api, test_watches_discord.env  # a bot against Discord's REST mock


async def recorded(memory, tenant: str, channel) -> set[str]:
    """The threads recorded under `channel`, and those the thread -> channel map puts there."""
    members = await memory.redis.smembers(place_threads_key(tenant, str(channel.id)))
    mapped = await memory.redis.hgetall(thread_channels_key(tenant))
    assert {t.decode() for t, c in mapped.items() if c.decode() == str(channel.id)} == {
        m.decode() for m in members
    }
    return {m.decode() for m in members}


async def test_forgotten_thread_leaves_its_channel_record_and_the_channel_still_goes(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory, guild, user = world.runtime.memory, fake.guild(), fake.user()
    channel, tenant = fake.text_channel(guild), str(guild.id)
    walrus = await ask_in(world, adapter, fake, channel, user, "when do walruses migrate")
    seals = await ask_in(world, adapter, fake, channel, user, "where do seals sleep")
    assert await recorded(memory, tenant, channel) == {str(walrus.id), str(seals.id)}

    await memory.governance.forget_thread(tenant, scope_of(walrus).thread)  # the memory page's
    assert await recorded(memory, tenant, channel) == {str(seals.id)}
    assert await stored_threads(memory, tenant) == {scope_of(seals).thread}

    for gone in (channel, seals):  # deleted on Discord: the thread that remains goes with it
        fake.channels.pop(gone.id)
    await adapter.client.on_guild_channel_delete(channel)
    await settle(world, adapter)
    assert await stored_threads(memory, tenant) == set()
    assert await memory.conversation.all(scope_of(seals), forgotten=True) == []
    assert await recorded(memory, tenant, channel) == set()
    assert await memory.redis.hgetall(thread_channels_key(tenant)) == {}


async def test_retention_drops_threads_from_their_channel_record(world):
    """A thread recorded before the thread -> channel map existed (its channel's set alone)
    stays there as an id, which the channel's deletion finds with nothing left to erase."""
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory, guild, user = world.runtime.memory, fake.guild(), fake.user()
    channel, tenant = fake.text_channel(guild), str(guild.id)
    walrus = await ask_in(world, adapter, fake, channel, user, "when do walruses migrate")
    old = snowflake()  # recorded and stored by an earlier version: no map entry
    await memory.redis.sadd(place_threads_key(tenant, str(channel.id)), str(old))
    await memory.conversation.append(
        Scope(tenant, f"discord:{tenant}:{old}"), "user", "are otters social", timestamp=1.0
    )
    members = await memory.redis.smembers(place_threads_key(tenant, str(channel.id)))
    assert {m.decode() for m in members} == {str(walrus.id), str(old)}

    erasure = await memory.governance.sweep_retention(tenant, time.time() + 60)
    assert erasure.threads == 2 and await stored_threads(memory, tenant) == set()
    members = await memory.redis.smembers(place_threads_key(tenant, str(channel.id)))
    assert {m.decode() for m in members} == {str(old)}
    assert await memory.redis.hgetall(thread_channels_key(tenant)) == {}


async def test_a_thread_with_memory_or_a_turn_to_come_stays_recorded(world):
    """Forgotten whole, but stored again since, or with a turn queued or running (it stores its
    answer after the erasure), or being erased by its place's deletion (a run of it again must
    find the thread): its channel's deletion must still find it."""
    memory, tenant, channel = world.runtime.memory, "g-stays", "100"
    places = memory.governance.places
    stored, queued, running, deleting, idle = "201", "202", "203", "204", "205"
    for thread in (stored, queued, running, deleting, idle):
        await places.note_thread(tenant, channel, thread)
    scope = Scope(tenant, f"discord:{tenant}:{stored}")
    await memory.conversation.append(scope, "user", "hi")
    await memory.redis.rpush(turn_queue_key(tenant, f"discord:{tenant}:{queued}"), "{}")
    await memory.redis.set(turn_running_key(tenant, f"discord:{tenant}:{running}"), "{}")
    await places.note(tenant, [f"discord:{tenant}:{deleting}"])
    threads = [f"discord:{tenant}:{t}" for t in (stored, queued, running, deleting, idle)]
    assert await places.unlist(tenant, threads) == 1
    members = await memory.redis.smembers(place_threads_key(tenant, channel))
    assert {m.decode() for m in members} == {stored, queued, running, deleting}


async def test_watch_in_a_deleted_channel_tells_its_creator_once(env):
    world, fake, adapter, api = env
    memory, watches = world.runtime.memory, world.runtime.watches
    guild, user = fake.guild(), snowflake()
    tenant = str(guild.id)

    async def watch_in(channel, topic: str):
        scope = Scope(tenant, channel=str(channel.id), user=str(user))
        return await WatchStore(memory.redis).create(
            scope, topic, 7 * DAY, platform="discord", channel=str(channel.id), now=LATER
        )

    async def deleted(channel) -> None:
        fake.channels.pop(channel.id)
        for _ in range(2):  # delivered twice: harmless
            await adapter.client.on_guild_channel_delete(channel)
        await settle(world, adapter)
        await watches.workers["discord"].drain()

    def told() -> list[str]:
        return [p.content for p in api.posted.values() if p.channel_id == api.dms.get(user)]

    first = fake.text_channel(guild)
    ssm = await watch_in(first, "state-space models")
    await deleted(first)
    assert await WatchStore(memory.redis).all(tenant) == []
    [said] = told()
    assert "“state-space models”" in said and f"posted to <#{first.id}>, which was deleted" in said
    assert ssm.id in said and "removed the watch" in said and "`/watch add`" in said

    # a run that queued the notice, then crashed before the watch went: the run again queues
    # it too, and it is said once
    second = fake.text_channel(guild)
    moe = await watch_in(second, "mixture of experts")
    place = DeletedPlace(tenant, "discord", str(second.id))
    await watches.removing([moe], place)
    await deleted(second)
    assert await WatchStore(memory.redis).all(tenant) == []
    assert len(told()) == 2 and "“mixture of experts”" in told()[1]

    await world.runtime.harness.upkeep.forget_deleted_places([place.to_dict()])  # once more
    await watches.workers["discord"].drain()
    assert len(told()) == 2


async def test_a_deletion_run_again_after_failing_still_finds_its_threads_watches(world):
    """The run that erased a channel's thread failed before its watches went (the notices could
    not be queued): the run again still finds the thread, and the watch posting in it."""
    memory, tenant, channel, thread = world.runtime.memory, "g-again", "300", "301"
    here = f"discord:{tenant}:{thread}"
    await memory.governance.places.note_thread(tenant, channel, thread)
    await memory.conversation.append(Scope(tenant, here), "user", "watch otters here")
    scope = Scope(tenant, here, channel=thread, user="U1")
    await WatchStore(memory.redis).create(
        scope, "otters", 7 * DAY, platform="discord", channel=thread, now=LATER
    )
    place, handed = DeletedPlace(tenant, "discord", channel), []

    async def unreachable(watches) -> None:
        raise ConnectionError("the notices' stream is unreachable")

    async def noted(watches) -> None:
        handed.extend(w.query for w in watches)

    with contextlib.suppress(ConnectionError):
        await memory.governance.forget_place(place, unreachable)
    assert await stored_threads(memory, tenant) == set()  # the thread went before the failure
    await memory.governance.forget_place(place, noted)
    assert handed == ["otters"] and await WatchStore(memory.redis).all(tenant) == []
