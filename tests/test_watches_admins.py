"""A tenant's admins manage every channel's watches (bot/watch_commands.py): through the Slack
adapter over real HTTP (users.info says who is a workspace admin or owner) and Discord's command
tree (the member's Manage Server), `/watch remove|pause|resume <id>` works from another channel
for an admin, and answers "not here" for anyone else, leaving the watch as it was."""

from __future__ import annotations

import json
import time

import discord

from adapters.discord import DiscordAdapter
from adapters.memory_page.access import Admins
from memory.keys import watches_due_key
from memory.stores.watches import WatchStore
from tests.support.discord_api import BOT_TOKEN
from tests.test_discord_feedback import answered
from tests.test_slack import slack  # noqa: F401  (the fixture)
from tests.test_watches_discord import VIEW, api, env, watch_command  # noqa: F401  (the fixtures)

MANAGE_SERVER = 1 << 5


async def slash(slack, text: str, team: str, channel: str, user: str) -> str:  # noqa: F811
    response = await slack.a.command(
        "/watch", text, slack.api.response_url + f"{time.time_ns()}", team=team,
        channel=channel, user=user,
    )  # fmt: skip
    return json.loads(await response.text())["text"]


async def test_a_slack_admin_manages_a_watch_from_another_channel(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    store: WatchStore = slack.world.runtime.watches.store
    slack.api.users.update({"U3": "Hedy", "U4": "Alan"})
    slack.api.admins.add("U3")
    slack.api.owners.add("U4")
    try:
        made = await slash(slack, "quokka sleep weekly", team, "C1", "U1")
        assert made.startswith("Watching “quokka sleep”, weekly here")
        [watch] = await store.all(team)
        await slash(slack, "list", team, "C1", "U2")  # U2's users.info (is a guest?): cached
        asked = len(slack.api.of("users.info"))
        same_place = await slash(slack, f"pause {watch.id}", team, "C1", "U2")
        assert same_place.startswith("Paused") and "<#C1>" not in same_place
        assert len(slack.api.of("users.info")) == asked  # no admin check where it posts
        assert await slash(slack, f"resume {watch.id}", team, "C1", "U2") == (
            f"Resumed “quokka sleep”, weekly (`{watch.id}`): a digest comes within a few minutes."
        )

        # not an admin, elsewhere: "not here", and the watch stays as it was
        for verb in ("remove", "pause", "resume"):
            refused = await slash(slack, f"{verb} {watch.id}", team, "C2", "U2")
            assert refused.startswith(f"No watch `{watch.id}` posts here"), verb
        assert (await store.get(team, watch.id)).paused == ""

        # Slack cannot say who is an admin: said so, nothing changed
        slack.api.fail("users.info", "ratelimited", times=2)  # U3's guest status, admin check
        unknown = await slash(slack, f"pause {watch.id}", team, "C2", "U3")
        assert unknown.startswith("Slack did not say in time whether you are an admin")
        assert (await store.get(team, watch.id)).paused == ""

        # an admin, elsewhere: paused, resumed and removed, told where it posts
        paused = await slash(slack, f"pause {watch.id}", team, "C2", "U3")
        assert paused.startswith("Paused “quokka sleep”, weekly in <#C1>")
        assert (await store.get(team, watch.id)).paused == "paused by U3"
        assert await store.redis.zscore(watches_due_key(), f"{team}|{watch.id}") is None
        resumed = await slash(slack, f"resume {watch.id}", team, "C2", "U3")
        assert resumed.startswith("Resumed “quokka sleep”, weekly in <#C1>")
        assert (await store.get(team, watch.id)).paused == ""
        assert await store.redis.zscore(watches_due_key(), f"{team}|{watch.id}") is not None
        removed = await slash(slack, f"remove {watch.id}", team, "D99", "U4")  # an owner, in a DM
        assert removed.startswith("Stopped watching “quokka sleep”, weekly in <#C1>")
        assert await store.all(team) == []
        missing = await slash(slack, f"remove {watch.id}", team, "C2", "U3")
        assert missing.startswith(f"No watch `{watch.id}` posts here")
    finally:
        for left in await store.all(team):
            await store.remove(team, left.id)


async def test_a_discord_member_with_manage_server_manages_a_watch_from_another_channel(env):  # noqa: F811
    world, fake, adapter, api = env  # noqa: F811
    store: WatchStore = world.runtime.watches.store
    guild = fake.guild()
    channel, elsewhere = fake.text_channel(guild), fake.text_channel(guild, muted=True)
    tenant, state = str(guild.id), adapter.client._connection
    member, manager = 1001, 1002

    def command(where, user: int, sub: str, admin: bool = False, **options: str) -> None:
        payload = watch_command(guild.id, where.id, user, sub, **options)
        if admin:
            payload["member"]["permissions"] = str(
                int(payload["member"]["permissions"]) | MANAGE_SERVER
            )
        state.parse_interaction_create(payload)

    try:
        command(channel, member, "add", topic="quokka sleep", period="weekly")
        await answered(api, 1)
        [watch] = await store.all(tenant)
        command(elsewhere, member, "pause", watch_id=watch.id)
        refused = (await answered(api, 2))[1]["data"]["content"]
        assert refused.startswith(f"No watch `{watch.id}` posts here")
        assert (await store.get(tenant, watch.id)).paused == ""
        command(elsewhere, manager, "pause", admin=True, watch_id=watch.id)
        paused = (await answered(api, 3))[2]["data"]["content"]
        assert paused.startswith(f"Paused “quokka sleep”, weekly in <#{channel.id}>")
        assert (await store.get(tenant, watch.id)).paused == f"paused by {manager}"
        command(elsewhere, member, "remove", watch_id=watch.id)
        assert (await answered(api, 4))[3]["data"]["content"].startswith("No watch")
        command(elsewhere, manager, "remove", admin=True, watch_id=watch.id)
        removed = (await answered(api, 5))[4]["data"]["content"]
        assert removed.startswith("Stopped watching “quokka sleep”, weekly in <#")
        assert await store.all(tenant) == []
    finally:
        for left in await store.all(tenant):
            await store.remove(tenant, left.id)


async def test_a_discord_user_named_in_arxivscout_admins_manages_every_watch(env):  # noqa: F811
    """ARXIVSCOUT_ADMINS counts on Discord as on the memory page: a named user without Manage
    Server pauses a watch of another channel; the same person unnamed is refused. Resuming it
    from a channel where the bot may not post works: what counts is where the watch posts, and
    there the bot losing Send Messages refuses the resume."""
    world, fake, _, api = env  # noqa: F811
    named = 1003
    adapter = DiscordAdapter(world.runtime.turns(), sync=False, admins=Admins(str(named)))
    fake.attach(adapter.client)
    await adapter.client._async_setup_hook()
    await adapter.client.http.static_login(BOT_TOKEN)
    store: WatchStore = world.runtime.watches.store
    guild = fake.guild()
    channel, elsewhere = fake.text_channel(guild), fake.text_channel(guild, muted=True)
    tenant, state = str(guild.id), adapter.client._connection
    try:
        state.parse_interaction_create(
            watch_command(guild.id, channel.id, 1001, "add", topic="quokka sleep")
        )
        await answered(api, 1)
        [watch] = await store.all(tenant)
        state.parse_interaction_create(
            watch_command(guild.id, elsewhere.id, 1004, "pause", watch_id=watch.id)
        )
        assert (await answered(api, 2))[1]["data"]["content"].startswith("No watch")
        state.parse_interaction_create(
            watch_command(guild.id, elsewhere.id, named, "pause", watch_id=watch.id)
        )
        assert (await answered(api, 3))[2]["data"]["content"].startswith("Paused “quokka sleep”")
        assert (await store.get(tenant, watch.id)).paused == f"paused by {named}"

        channel.permissions_for.side_effect = lambda target, /: discord.Permissions(
            view_channel=True
        )  # the bot can no longer send where the watch posts
        state.parse_interaction_create(
            watch_command(guild.id, elsewhere.id, named, "resume", VIEW, watch_id=watch.id)
        )
        refused = (await answered(api, 4))[3]["data"]["content"]
        assert refused.startswith(f"I cannot send messages in <#{channel.id}>, ")  # not here
        assert (await store.get(tenant, watch.id)).paused == f"paused by {named}"
        channel.permissions_for.side_effect = None  # allowed again
        channel.permissions_for.return_value = discord.Permissions(
            view_channel=True, send_messages=True
        )
        state.parse_interaction_create(
            watch_command(guild.id, elsewhere.id, named, "resume", VIEW, watch_id=watch.id)
        )
        resumed = (await answered(api, 5))[4]["data"]["content"]
        assert resumed.startswith("Resumed “quokka sleep”")
        assert (await store.get(tenant, watch.id)).paused == ""
    finally:
        for left in await store.all(tenant):
            await store.remove(tenant, left.id)
        await adapter.client.http.close()
