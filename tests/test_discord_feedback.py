"""👍 / 👎 in Discord: the answer's last part is sent with the two buttons, and interactions in
Discord's gateway format (INTERACTION_CREATE: a button press, a modal submitted) go through
discord.py's own dispatch to our handlers, which answer at the REST mock's callback route."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest

from adapters.discord import DiscordAdapter
from bot.feedback import NOT_HERE, SORRY, THANKS
from tests.agent_world import close_world, open_world
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi, serving_discord_api, snowflake
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import text

MESSAGE_COMPONENT, MODAL_SUBMIT = 3, 5
CHANNEL_MESSAGE, DEFERRED, MODAL = 4, 5, 9


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
    await adapter.client._async_setup_hook()  # the loop, as `start` sets it (events use it)
    await adapter.client.http.static_login(BOT_TOKEN)  # the session interactions answer with
    yield world, fake, adapter, api
    await adapter.client.http.close()
    await close_world(world)


def user_payload(user_id: int, name: str) -> dict[str, Any]:
    return {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name,
            "avatar": None, "public_flags": 0}  # fmt: skip


def interaction(kind: int, guild: int, channel: int, user: int, data: dict, **extra) -> dict:
    """An INTERACTION_CREATE as the gateway delivers it (a server member's)."""
    return {
        "id": str(snowflake()), "application_id": str(snowflake()), "type": kind,
        "token": f"tok-{snowflake()}", "version": 1, "guild_id": str(guild),
        "channel_id": str(channel),
        "channel": {"id": str(channel), "type": 11, "guild_id": str(guild), "name": "q",
                    "parent_id": str(snowflake()), "owner_id": str(snowflake()),
                    "last_message_id": None, "rate_limit_per_user": 0, "flags": 0,
                    "message_count": 2, "member_count": 2, "total_message_sent": 2,
                    "permissions": "1024",
                    "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                        "archive_timestamp": "2024-01-01T00:00:00+00:00",
                                        "locked": False}},
        "member": {"user": user_payload(user, "grace"), "roles": [], "joined_at": "2024-01-01T00:00:00+00:00",
                   "deaf": False, "mute": False, "flags": 0, "permissions": "1024"},
        "app_permissions": "1024", "locale": "en-US", "guild_locale": "en-US",
        "entitlements": [], "authorizing_integration_owners": {"0": str(guild)}, "context": 0,
        "attachment_size_limit": 8_388_608, "data": data, **extra,
    }  # fmt: skip


def pressed(guild: int, channel: int, user: int, custom_id: str, components: list) -> dict:
    message = {
        "id": str(snowflake()), "channel_id": str(channel), "author": user_payload(snowflake(), "bot"),
        "content": "an answer", "timestamp": "2024-01-01T00:00:00+00:00", "edited_timestamp": None,
        "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [],
        "attachments": [], "embeds": [], "pinned": False, "type": 0, "flags": 0,
        "components": components,
    }  # fmt: skip
    data = {"custom_id": custom_id, "component_type": 2}
    return interaction(MESSAGE_COMPONENT, guild, channel, user, data, message=message)


async def answered(api: MockDiscordApi, count: int) -> list[dict[str, Any]]:
    """The interaction callbacks, once `count` arrived (discord.py runs callbacks as tasks)."""
    deadline = time.monotonic() + 10
    while len(api.callbacks) < count:
        assert time.monotonic() < deadline, f"only {len(api.callbacks)} callbacks"
        await asyncio.sleep(0.02)
    return api.callbacks


async def told(api: MockDiscordApi, count: int) -> list[str]:
    """What the deferred answers (a 👍, a form) said, once `count` follow-ups arrived."""
    deadline = time.monotonic() + 10
    while len(api.followups) < count:
        assert time.monotonic() < deadline, f"only {len(api.followups)} follow-ups"
        await asyncio.sleep(0.02)
    assert all(f["flags"] & 64 for f in api.followups)  # ephemeral: only the voter sees it
    return [f["content"] for f in api.followups]


async def test_answer_has_buttons_and_presses_and_the_modal_are_recorded(env):
    world, fake, adapter, api = env
    world.model.script(text("MemGPT pages memory."))
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "what is MemGPT"))
    await adapter.pipeline.wait_idle()
    await world.runtime.harness.drain()
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    sent = thread.send.await_args_list[-1]
    assert sent.args == ("MemGPT pages memory.",)
    view = sent.kwargs["view"]
    memory, tenant = world.runtime.memory, str(guild.id)
    [turn] = await memory.turn_records.ids(tenant)
    assert [item.custom_id for item in view.children] == [
        f"feedback:up:{turn}", f"feedback:down:{turn}"
    ]  # fmt: skip
    components = view.to_components()

    state, voter = adapter.client._connection, snowflake()
    state.parse_interaction_create(pressed(guild.id, thread.id, voter, f"feedback:up:{turn}",
                                           components))  # fmt: skip
    [up] = await answered(api, 1)
    assert up["type"] == DEFERRED and up["data"]["flags"] & 64  # ephemeral: the voter's only
    assert await told(api, 1) == [THANKS]
    assert (await memory.turn_records.get(tenant, turn)).feedback[str(voter)].rating == 1

    down = pressed(guild.id, thread.id, voter, f"feedback:down:{turn}", components)
    state.parse_interaction_create(down)
    modal = (await answered(api, 2))[1]
    assert modal["type"] == MODAL and modal["interaction"] == down["id"]
    assert modal["data"]["custom_id"] == f"feedback:why:{turn}:{voter}"
    record = await memory.turn_records.get(tenant, turn)
    assert record.feedback[str(voter)].rating == -1  # replaced the 👍
    assert record.feedback[str(voter)].name == "grace"

    [row] = modal["data"]["components"]
    field_id = row["components"][0]["custom_id"]
    submit = {"custom_id": f"feedback:why:{turn}:{voter}", "components": [
        {"type": 1, "components": [{"type": 4, "custom_id": field_id,
                                    "value": "It cited the wrong paper"}]}]}  # fmt: skip
    state.parse_interaction_create(interaction(MODAL_SUBMIT, guild.id, thread.id, voter, submit))
    done = (await answered(api, 3))[2]
    assert done["type"] == DEFERRED and (await told(api, 2))[1] == SORRY
    vote = (await memory.turn_records.get(tenant, turn)).feedback[str(voter)]
    assert (vote.rating, vote.comment) == (-1, "It cited the wrong paper")


async def test_buttons_work_for_a_message_sent_before_a_restart(env, redis_url):
    """A fresh adapter (a restarted process) knows nothing of the message; the custom id is
    enough."""
    world, fake, adapter, api = env
    world.model.script(text("An answer."))
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "a question"))
    await adapter.pipeline.wait_idle()
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    components = thread.send.await_args_list[-1].kwargs["view"].to_components()
    [turn] = await world.runtime.memory.turn_records.ids(str(guild.id))

    restarted = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(restarted.client)
    await restarted.client._async_setup_hook()
    await restarted.client.http.static_login(BOT_TOKEN)
    try:
        restarted.client._connection.parse_interaction_create(
            pressed(guild.id, thread.id, snowflake(), f"feedback:up:{turn}", components)
        )
        assert await told(api, 1) == [THANKS]
    finally:
        await restarted.client.http.close()


def form(turn: str, user: int, said: str) -> dict[str, Any]:
    """A 👎 form's submission as the gateway sends it: its custom id and the typed text."""
    return {"custom_id": f"feedback:why:{turn}:{user}", "components": [
        {"type": 1, "components": [{"type": 4, "custom_id": "x", "value": said}]}]}  # fmt: skip


async def test_two_forms_on_one_answer_both_kept_by_a_restarted_process(env):
    """Two people press 👎 on the same answer; their forms are submitted after a restart (to a
    fresh adapter that never sent them): both comments are kept, each as its author's."""
    world, fake, adapter, api = env
    world.model.script(text("An answer."))
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "a question"))
    await adapter.pipeline.wait_idle()
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    components = thread.send.await_args_list[-1].kwargs["view"].to_components()
    memory, tenant = world.runtime.memory, str(guild.id)
    [turn] = await memory.turn_records.ids(tenant)
    state, a, b = adapter.client._connection, snowflake(), snowflake()
    for voter in (a, b):
        state.parse_interaction_create(
            pressed(guild.id, thread.id, voter, f"feedback:down:{turn}", components)
        )
    modals = await answered(api, 2)
    assert {m["data"]["custom_id"] for m in modals} == {
        f"feedback:why:{turn}:{a}", f"feedback:why:{turn}:{b}"
    }  # fmt: skip

    restarted = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(restarted.client)
    await restarted.client._async_setup_hook()
    await restarted.client.http.static_login(BOT_TOKEN)
    try:
        fresh = restarted.client._connection
        fresh.parse_interaction_create(
            interaction(MODAL_SUBMIT, guild.id, thread.id, b, form(turn, b, "Wrong paper"))
        )
        fresh.parse_interaction_create(
            interaction(MODAL_SUBMIT, guild.id, thread.id, a, form(turn, a, "Too long"))
        )
        assert await told(api, 2) == [SORRY, SORRY]
    finally:
        await restarted.client.http.close()
    votes = (await memory.turn_records.get(tenant, turn)).feedback
    assert {u: (v.rating, v.comment) for u, v in votes.items()} == {
        str(a): (-1, "Too long"), str(b): (-1, "Wrong paper")
    }  # fmt: skip


async def test_a_vote_from_another_channel_is_refused(env):
    world, fake, adapter, api = env
    world.model.script(text("An answer."))
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "a question"))
    await adapter.pipeline.wait_idle()
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    components = thread.send.await_args_list[-1].kwargs["view"].to_components()
    memory, tenant = world.runtime.memory, str(guild.id)
    [turn] = await memory.turn_records.ids(tenant)
    elsewhere, voter = snowflake(), snowflake()
    state = adapter.client._connection
    state.parse_interaction_create(
        pressed(guild.id, elsewhere, voter, f"feedback:up:{turn}", components)
    )
    state.parse_interaction_create(
        interaction(MODAL_SUBMIT, guild.id, elsewhere, voter, form(turn, voter, "bad"))
    )
    assert await told(api, 2) == [NOT_HERE, NOT_HERE]
    assert (await memory.turn_records.get(tenant, turn)).feedback == {}
