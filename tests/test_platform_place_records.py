"""What a deleted place leaves behind, and whom it tells: a Discord thread forgotten whole (Forget
thread, retention) leaves its channel's record of threads, so the record does not grow forever,
and the channel's deletion later still erases the threads that remain; a watch removed with
its deleted channel is told to its creator in one direct message, however often the deletion
runs."""

from __future__ import annotations

import time

from memory.governance_places import DeletedPlace
from memory.keys import place_threads_key, thread_channels_key
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


async def test_retention_drops_threads_from_their_channel_record_old_records_too(world):
    """A thread recorded before the thread -> channel map existed (its channel's set alone) is
    found in the channels' records, and leaves its own."""
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

    erasure = await memory.governance.forget_older_than(tenant, time.time() + 60)
    assert erasure.threads == 2 and await stored_threads(memory, tenant) == set()
    assert not await memory.redis.exists(place_threads_key(tenant, str(channel.id)))
    assert await memory.redis.hgetall(thread_channels_key(tenant)) == {}


async def test_a_thread_stored_again_after_its_erasure_stays_recorded(world):
    """A turn that stored its answer after the erasure: the thread has memory again, so its
    channel's deletion must still find it."""
    memory, tenant, channel, thread = world.runtime.memory, "g-stays", "100", "200"
    places = memory.governance.places
    await places.note_thread(tenant, channel, thread)
    await memory.conversation.append(Scope(tenant, f"discord:{tenant}:{thread}"), "user", "hi")
    assert await places.unlist(tenant, [f"discord:{tenant}:{thread}"]) == 0
    assert await memory.redis.sismember(place_threads_key(tenant, channel), thread)


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
