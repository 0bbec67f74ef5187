"""A watch posts only in a channel of its own tenant (adapters/discord_watch.py,
adapters/slack_watch.py `post`/`can_post`/`tell`), and an import never trusts its file for one
(memory/portability_write.py): against the real Redis, a replayed arXiv, the mock Slack Web API
and discord.py's channel objects (spec'd fakes, looked up as the adapter does).

The security review's two scenarios: a Discord person, admin of their own DM tenant, imports a
hand-written export whose watch names another organisation's channel (it must not land
unpaused and due); and a paused copy resumed by the tenant's admin (refused where the channel
is not the tenant's). Then a digest due for a channel of another server or workspace is never
posted, nor its refusal told to a `created_by` who is not of the tenant, while an ordinary
watch in its own channel still posts."""

from __future__ import annotations

import time
import uuid
from typing import Any
from unittest import mock

import discord

from adapters.discord_platform import DiscordPlatform
from adapters.discord_watch import DiscordWatches
from bot.watch_commands import WatchCommands
from bot.watches import WatchPlace, WatchService
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream, watches_due_key
from memory.scope import Scope
from memory.stores.watches import DAY, Watch, WatchStore
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.support.discord_fakes import FakeDiscord
from tests.test_watches import ON_TOPIC, T0, entry, place, watch_world  # noqa: F401 (fixture)

NOT_A_MEMBER = discord.NotFound(mock.Mock(status=404, reason="Not Found"), "Unknown Member")


def exported_watch(watch_id: str, platform: str, channel: str, created_by: str) -> dict:
    """A hand-written export's watch line, unpaused and due within the hour."""
    now = time.time()
    watch = {"id": watch_id, "query": "[Reset your password](https://evil.example) urgent",
             "period": DAY, "platform": platform, "channel": channel, "thread": "",
             "audience": "public", "categories": [], "authors": [], "created_by": created_by,
             "created_at": now - 2 * DAY, "since": now - 2 * DAY, "next_due": int(now + 3600),
             "paused": ""}  # fmt: skip
    return {"kind": "watch", "watch": watch, "posted": {}}


async def due_at(memory, tenant: str, watch_id: str) -> float | None:
    return await memory.redis.zscore(watches_due_key(), f"{tenant}|{watch_id}")


async def cleared(memory, *tenants: str) -> None:
    """The due index is every tenant's: no watch of a test may be left in it."""
    store = WatchStore(memory.redis)
    for tenant in tenants:
        for watch in await store.all(tenant):
            await store.remove(tenant, watch.id)
        await memory.drop_tenant(tenant)


def discord_side() -> tuple[FakeDiscord, discord.Client]:
    """A fake Discord whose client records the DMs it opens (`create_dm`)."""
    fake = FakeDiscord()
    client = discord.Client(intents=discord.Intents.none())
    fake.attach(client)
    client.create_dm = mock.create_autospec(client.create_dm, side_effect=fake.dm_channel)
    return fake, client


def only_members(guild: Any, *members: int) -> None:
    """The server's members are these people (the cache and Discord agree)."""
    guild.get_member.side_effect = lambda user: mock.sentinel.member if user in members else None
    guild.fetch_member.side_effect = NOT_A_MEMBER


# -- the import ----------------------------------------------------------------------------------


async def test_an_imported_watch_is_never_stored_unpaused_whatever_its_header_says(memory):
    """The reviewer's first scenario: the header names the importing DM tenant itself; a Slack
    channel cannot be a Discord person's, so it is dropped; a Discord channel is kept paused
    (only Discord can say whose channel it is: `/watch resume` asks it) and off the due index."""
    tenant = f"dm-{uuid.uuid4().int % 10**18}"  # what /memory in a Discord DM opens
    header = memory.portability._exporter.header(tenant, None)
    records = [
        header,
        exported_watch("w1", "slack", "C0VICTIM", "U_ANY"),
        exported_watch("w2", "discord", "123456789012345678", "1"),
    ]
    store = WatchStore(memory.redis)
    try:
        counts = await memory.portability.import_records(tenant, records)
        [kept] = await store.all(tenant)
        assert (kept.id, kept.platform) == ("w2", "discord")
        assert kept.paused == "imported: `/watch resume w2` where it posts"
        assert await due_at(memory, tenant, "w1") is None
        assert await due_at(memory, tenant, "w2") is None
        assert tenant not in {t for t, _ in await store.due(time.time() + 10 * DAY)}
        assert (counts["watches"], counts["paused_watch_imports"]) == (1, 1)
        assert counts["dropped_watch_imports"] == 1
    finally:
        await cleared(memory, tenant)


# -- resuming ------------------------------------------------------------------------------------


async def test_resuming_a_watch_of_another_servers_channel_is_refused(memory):
    """The reviewer's second scenario, with the real Discord poster: the channel is one the bot
    may send in, but of another server (or, for a DM tenant, not its person's DM): refused with
    a clear message, the watch stays paused; the tenant's own channel resumes."""
    fake, client = discord_side()
    poster = DiscordWatches(None, client, DiscordPlatform(client).channel)
    ours, theirs = fake.guild(), fake.guild()
    victim, own = fake.text_channel(theirs), fake.text_channel(ours)
    me, stranger = fake.user(), fake.user()
    tenant, dm_tenant = str(ours.id), f"dm-{me.id}"
    header = memory.portability._exporter.header("somebody-else", None)
    store = WatchStore(memory.redis)
    commands = WatchCommands(store, {"discord": poster}, time.time)

    async def admin() -> bool:
        return True

    async def resumed(tenant: str, watch_id: str) -> str:
        return await commands.resume_text(
            Scope(tenant, channel="555", user=str(me.id)), watch_id, WatchPlace("discord", "555"),
            admin,
        )  # fmt: skip

    try:
        await memory.portability.import_records(tenant, [
            header, exported_watch("w2", "discord", str(victim.id), str(me.id)),
            exported_watch("w3", "discord", str(own.id), str(me.id)),
        ])  # fmt: skip
        said = await resumed(tenant, "w2")
        assert said == (
            f"<#{victim.id}> is not a channel of this server, so I will not post this watch's "
            "digests there: make the watch again in one of this server's channels (and "
            "`/watch remove` this one)."
        )
        assert (await store.get(tenant, "w2")).paused and await due_at(memory, tenant, "w2") is None
        assert (await resumed(tenant, "w3")).startswith("Resumed")  # its own channel
        assert await due_at(memory, tenant, "w3") is not None

        # a DM tenant: only its person's DM with the bot is theirs
        elsewhere, mine = fake.dm_channel(stranger), fake.dm_channel(me)
        await memory.portability.import_records(dm_tenant, [
            header, exported_watch("d1", "discord", str(elsewhere.id), str(me.id)),
            exported_watch("d2", "discord", str(mine.id), str(me.id)),
        ])  # fmt: skip
        refused = await resumed(dm_tenant, "d1")
        assert refused.startswith(f"<#{elsewhere.id}> is not a channel of your direct messages")
        assert await due_at(memory, dm_tenant, "d1") is None
        assert (await resumed(dm_tenant, "d2")).startswith("Resumed")
    finally:
        await cleared(memory, tenant, dm_tenant)


async def test_slack_refuses_a_channel_of_another_workspace_but_not_one_shared_with_ours(
    watch_world,  # noqa: F811
    tenant,
):
    """`can_post` with the tenant (resume, creation): a channel Slack says is of another
    workspace is refused; one hosted by another organisation and shared with the tenant's
    workspace (Slack Connect) is the tenant's too."""
    world = watch_world
    world.api.channel_teams.update(
        {"CFOREIGN": ["TOTHER"], "CPARTNER": ["TPARTNER", tenant], "COURS": [tenant]}
    )
    service = world.process()
    poster = service.posters["slack"]
    assert await poster.can_post(WatchPlace("slack", "COURS"), tenant=tenant) == ""
    assert await poster.can_post(WatchPlace("slack", "CPARTNER"), tenant=tenant) == ""
    refused = await poster.can_post(WatchPlace("slack", "CFOREIGN"), tenant=tenant)
    assert refused.startswith("<#CFOREIGN> is not a channel of this workspace")
    # a Discord tenant's watch naming a Slack channel: no workspace's memory
    assert (await poster.can_post(WatchPlace("slack", "COURS"), tenant="dm-42")).startswith(
        "<#COURS> is not a channel of this workspace"
    )

    watch = Watch(id="wf", tenant=tenant, query="state space models", period=DAY,
                  platform="slack", channel="CFOREIGN", created_by="U1",
                  paused="imported")  # fmt: skip
    await service.store.restore(watch, {}, T0)
    said = await service.command(
        place(tenant, "C1"), "resume wf", WatchPlace("slack", "C1"), admin=_yes
    )
    assert said.startswith("<#CFOREIGN> is not a channel of this workspace")
    assert (await service.store.get(tenant, "wf")).paused == "imported"


async def _yes() -> bool:
    return True


# -- digests -------------------------------------------------------------------------------------


async def claimed(service: WatchService, watch: Watch, until: float) -> dict:
    """The digest task of the watch's due period, claimed as the scheduler does."""
    due = await service.store.claim(watch, until, "tok")
    return {"tenant": watch.tenant, "watch": watch.id, "due": str(due), "until": until,
            "next": watch.next_after(until), "token": "tok"}  # fmt: skip


async def test_a_due_digest_for_another_workspaces_channel_is_not_posted(
    watch_world,  # noqa: F811
    tenant,
):
    """A watch already stored (and due) for a channel of another workspace, or in a Discord
    tenant: its digest is never posted there, the watch is paused, and its `created_by`, a
    stranger, is not written to. The tenant's own channel still gets its digest."""
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    world.api.channel_teams.update({"CFOREIGN": ["TOTHER"], "COURS": [tenant]})
    world.api.users["U7"] = "Eve"
    world.api.homes["U7"] = "TOTHER"  # of the other workspace
    service = world.process()
    store = service.store
    foreign = await store.create(place(tenant, "CFOREIGN", user="U7"), "state space models", DAY,
                                 platform="slack", channel="CFOREIGN", now=T0)  # fmt: skip
    ours = await store.create(place(tenant, "COURS"), "state space models", DAY,
                              platform="slack", channel="COURS", now=T0)  # fmt: skip
    dm_tenant = "dm-4242424242"  # what the import let in before: a Slack watch of a DM tenant
    smuggled = await store.create(place(dm_tenant, "COURS", user="U1"), "state space models",
                                  DAY, platform="slack", channel="COURS", now=T0)  # fmt: skip
    try:
        assert await service.digest(await claimed(service, foreign, T0 + 1)) == "failed"
        assert await service.digest(await claimed(service, smuggled, T0 + 1)) == "failed"
        assert await service.digest(await claimed(service, ours, T0 + 1)) == "posted"
        assert world.digests("CFOREIGN") == []
        assert world.digests("COURS") == [[world.replay.feed[0].arxiv_id]]  # ours, once
        stored = await store.get(tenant, foreign.id)
        assert stored.paused == "Slack channel CFOREIGN is of another workspace: not posted there"
        assert await due_at(world.memory, tenant, foreign.id) is None
        assert (await store.get(dm_tenant, smuggled.id)).paused.startswith("Slack channel COURS")
        opened = [call["users"] for call in world.api.of("conversations.open")]
        assert "U7" not in opened  # the stranger named as its creator is not written to
        assert "U1" not in opened  # nor a person of this workspace, for a Discord tenant's watch
    finally:
        await cleared(world.memory, dm_tenant)


async def test_a_due_digest_for_another_servers_channel_is_not_posted(
    watch_world,  # noqa: F811
    tenant,
    memory,
):
    """Discord: the channel's server must be the watch's. A watch of server A naming a channel
    of server B is paused unposted and its stranger creator not DM'd; a member creator is told;
    the watch in A's own channel posts."""
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    fake, client = discord_side()
    ours, theirs = fake.guild(), fake.guild()
    own, victim = fake.text_channel(ours), fake.text_channel(theirs)
    member, stranger = fake.user(), fake.user()
    only_members(ours, member.id)
    guild_tenant = str(ours.id)
    service = WatchService(
        memory, ArxivSource(world.replay.api_url, 0.0), encoding_for("gpt-5-mini"),
        now=world.clock, stream_prefix=world.prefix, claim_idle_ms=300,
    )  # fmt: skip
    world.services.append(service)
    service.attach("discord", DiscordWatches(service, client, DiscordPlatform(client).channel))
    store = service.store

    async def made(channel: Any, creator: Any) -> Watch:
        scope = Scope(guild_tenant, channel=str(channel.id), user=str(creator.id))
        return await store.create(scope, "state space models", DAY, platform="discord",
                                  channel=str(channel.id), now=T0)  # fmt: skip

    try:
        by_stranger, by_member = await made(victim, stranger), await made(victim, member)
        at_home = await made(own, member)
        assert await service.digest(await claimed(service, by_stranger, T0 + 1)) == "failed"
        assert not victim.send.await_count  # nothing posted in the other server
        assert not client.create_dm.await_count  # nor a DM to a stranger to the server
        paused = (await store.get(guild_tenant, by_stranger.id)).paused
        assert paused == f"Discord channel {victim.id} is not of this server: not posted there"

        assert await service.digest(await claimed(service, by_member, T0 + 1)) == "failed"
        assert not victim.send.await_count
        [told] = [sent.text for sent in fake.sent if sent.channel_id != own.id]
        assert "make it again in one of your own channels" in told  # its member creator

        assert await service.digest(await claimed(service, at_home, T0 + 1)) == "posted"
        [digest] = fake.texts(own.id)
        assert ON_TOPIC[0][0] in digest
    finally:
        await world.stop(service)
        await cleared(memory, guild_tenant)
        await TaskStream(memory.redis, task_stream(f"{world.prefix}-discord")).destroy()


async def test_a_process_without_the_watchs_platform_does_not_resume_it(memory, tenant):
    """No poster here to ask whose the channel is (a worker, the terminal): it stays paused."""
    store = WatchStore(memory.redis)
    watch = Watch(id="wp", tenant=tenant, query="quokkas", period=DAY, platform="slack",
                  channel="C0VICTIM", created_by="U1", paused="imported")  # fmt: skip
    await store.restore(watch, {}, time.time())
    try:
        said = await WatchCommands(store, {}, time.time).resume_text(
            Scope(tenant, channel="C0VICTIM", user="U1"), "wp", WatchPlace("slack", "C0VICTIM")
        )
        assert said == (
            "I cannot check this watch's slack channel from here, so it stays paused: resume it "
            "from slack, where it posts."
        )
        assert (await store.get(tenant, "wp")).paused == "imported"
    finally:
        await cleared(memory, tenant)
