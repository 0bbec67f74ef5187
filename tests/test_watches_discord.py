"""Topic watches in Discord: `/watch` as an INTERACTION_CREATE through discord.py's own command
tree, a digest posted with a Save button per paper (and a nonce naming its period), and a
pressed Save (Discord's component interaction) answered at the REST mock: "Saving …" as the
interaction's response, "Saved … (N passages)" as its follow-up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from unittest import mock

import discord
import pytest

from adapters.discord import DiscordAdapter
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID, MEMGPT_TITLE, memgpt_entry
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi, serving_discord_api, snowflake
from tests.support.discord_fakes import FakeDiscord
from tests.test_discord_feedback import answered, interaction, pressed
from tests.test_watches import ON_TOPIC, entry

APPLICATION_COMMAND, CHAT_INPUT, SUB_COMMAND, STRING = 2, 1, 1, 3
VIEW, SEND = 1 << 10, 1 << 11 | 1 << 38  # send messages (and in threads)


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as api:
        yield api


@pytest.fixture
async def env(redis_url, tmp_path, api):
    world = await open_world(redis_url, tmp_path)
    fake = FakeDiscord()
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(adapter.client)
    await adapter.client._async_setup_hook()  # the loop, as `start` sets it (commands use it)
    await adapter.client.http.static_login(BOT_TOKEN)  # the session interactions answer with
    yield world, fake, adapter, api
    await adapter.client.http.close()
    await close_world(world)


def watch_command(
    guild: int, channel: int, user: int, sub: str, perms: int = VIEW | SEND, **options: str
) -> dict:
    data = {"id": str(snowflake()), "name": "watch", "type": CHAT_INPUT, "options": [
        {"name": sub, "type": SUB_COMMAND, "options": [
            {"name": name, "type": STRING, "value": value} for name, value in options.items()
        ]},
    ]}  # fmt: skip
    return interaction(APPLICATION_COMMAND, guild, channel, user, data, app_permissions=str(perms))


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


async def test_watch_command_digest_and_save_button(env):
    world, fake, adapter, api = env
    watches = world.runtime.watches
    world.arxiv.add_feed([replace(memgpt_entry(), published=iso(time.time() - 3600))])
    guild = fake.guild()
    channel, user = fake.text_channel(guild), snowflake()
    tenant = str(guild.id)
    state = adapter.client._connection
    try:
        # where the bot may not send, Discord would refuse every digest: no watch
        state.parse_interaction_create(watch_command(
            guild.id, channel.id, user, "add", VIEW, topic="operating systems memory",
        ))  # fmt: skip
        [refused] = await answered(api, 1)
        assert refused["data"]["content"].startswith("I cannot send messages in this channel")
        assert refused["data"]["flags"] & 64 and await watches.store.all(tenant) == []
        api.callbacks.clear()
        state.parse_interaction_create(watch_command(
            guild.id, channel.id, user, "add", topic="operating systems memory", period="weekly",
            category="cs.AI",
        ))  # fmt: skip
        [made] = await answered(api, 1)
        assert made["data"]["content"].startswith(
            "Watching “operating systems memory” cat:cs.AI, weekly here"
        )
        [watch] = await watches.store.all(tenant)
        assert (watch.platform, watch.channel) == ("discord", str(channel.id))
        state.parse_interaction_create(watch_command(guild.id, channel.id, user, "list"))
        listed = (await answered(api, 2))[1]
        assert watch.id in listed["data"]["content"] and listed["data"]["flags"] & 64

        # the suite's Redis is shared: another test's overdue watch may be claimed too
        claimed = [claim for claim in await watches.check() if claim[0] == tenant]
        assert claimed == [(tenant, watch.id)]
        await watches.workers["discord"].drain()
        sent = channel.send.await_args
        assert MEMGPT_TITLE in sent.args[0] and len(sent.args[0]) <= 2000
        assert sent.kwargs["nonce"] == f"{watch.id}:{watch.next_due}"
        view = sent.kwargs["view"]
        assert [item.custom_id for item in view.children] == [f"digest:save:{MEMGPT_ID}"]
        assert view.children[0].item.label == "Save 1 to team knowledge base"

        state.parse_interaction_create(
            pressed(guild.id, channel.id, user, f"digest:save:{MEMGPT_ID}", view.to_components())
        )
        saving = (await answered(api, 3))[2]
        assert saving["data"]["content"] == f"Saving arXiv:{MEMGPT_ID} to the team knowledge base…"
        assert saving["data"]["flags"] & 64
        deadline = time.monotonic() + 60
        while not api.followups:
            assert time.monotonic() < deadline, "no follow-up"
            await asyncio.sleep(0.05)
        [saved] = api.followups
        assert saved["content"].startswith(f"Saved “{MEMGPT_TITLE}” to the team knowledge base (")
        assert saved["flags"] & 64 and saved["token"] == saving["token"]
        assert await world.runtime.memory.knowledge_base.has_paper(Scope(tenant), MEMGPT_ID)

        # another channel of the server cannot remove it (its id is in every digest)
        other = fake.text_channel(guild)
        state.parse_interaction_create(
            watch_command(guild.id, other.id, snowflake(), "remove", watch_id=watch.id)
        )
        kept = (await answered(api, 4))[3]
        assert kept["data"]["content"].startswith(f"No watch `{watch.id}` posts here")
        assert len(await watches.store.all(tenant)) == 1

        # the bot loses Send Messages: the next digest is refused, the watch paused and its
        # creator told in a DM
        channel.send.side_effect = discord.Forbidden(
            mock.Mock(status=403, reason="Forbidden"), "Missing Permissions"
        )
        world.arxiv.add_feed([entry(*ON_TOPIC[0], time.time() - 60, cats=("cs.AI",))])
        stored = await watches.store.get(tenant, watch.id)
        await asyncio.sleep(1.1)  # periods are keyed by their whole second: not the first's
        await watches.store.resume(stored, time.time())  # as if its next period were due
        # the suite's Redis is shared: another test's overdue watch may be claimed too
        claimed = [claim for claim in await watches.check() if claim[0] == tenant]
        assert claimed == [(tenant, watch.id)]
        await watches.workers["discord"].drain()
        assert (await watches.store.get(tenant, watch.id)).paused.startswith("Discord refused")
        told = [p for p in api.posted.values() if p.channel_id == api.dms[user]]
        assert len(told) == 1 and f"/watch resume {watch.id}" in told[0].content

        state.parse_interaction_create(
            watch_command(guild.id, channel.id, user, "remove", watch_id=watch.id)
        )
        removed = (await answered(api, 5))[4]
        assert removed["data"]["content"].startswith("Stopped watching")
    finally:
        for left in await watches.store.all(tenant):
            await watches.store.remove(tenant, left.id)
