"""Topic watches' loose ends: a place's Slack refusals no retry changes pause the watch and
tell its creator what to do for the reason (app-wide or shape errors pause nothing); a channel made
private since the watch was made is walled (Slack and Discord); a watch whose indexing crashed
is indexed when made again; `/watch resume` of a running watch changes nothing; an erased
person's id leaves the pauses they made; Discord's `/watch add` refuses a period it cannot read
and notes a thread's watch under its parent; the first digest's span reads as words; the
terminal's `watch add --platform` needs the tenant that owns the channel.

Against the real Redis, the mock Slack Web API, the local Discord API and fakes, and the
replayed arXiv, with the fixtures of the watch tests these extend."""

from __future__ import annotations

import contextlib
import time

import pytest

from bot.watches import WatchPlace, WatchService
from memory.governance import NotFound
from memory.governance_places import DeletedPlace
from memory.scope import Scope
from memory.stores.watches import DAY, Watch, WatchStore
from tests.test_cli_memory import arxivscout
from tests.test_discord_feedback import answered, interaction
from tests.test_slack_channel_shared import (  # noqa: F401 (fixtures)
    TEAM_ONLY,
    a_watch_in_public_c1,
    digest_posted,
    uncached,
)
from tests.test_watches import ON_TOPIC, T0, entry, place, watch_world  # noqa: F401
from tests.test_watches_cli import new_papers  # noqa: F401 (a fixture)
from tests.test_watches_discord import (  # noqa: F401 (fixtures)
    APPLICATION_COMMAND,
    CHAT_INPUT,
    STRING,
    SUB_COMMAND,
    api,
    env,
    watch_command,
)

# -- Slack: refusals that no retry changes ------------------------------------------------------


async def a_due_digest(world, tenant: str) -> tuple[WatchService, Watch, dict]:
    """A Slack watch in C8 with a paper to show, its period claimed: (service, watch, payload)."""
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    watch = await service.create(
        place(tenant, "C8"), "state space models", WatchPlace("slack", "C8")
    )
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    return service, watch, payload


@pytest.mark.parametrize(
    ("error", "advice"),
    [
        ("restricted_action", "ask an admin of the channel to let me post in it"),
        ("restricted_action_read_only_channel", "ask an admin of the channel to let me post"),
        ("not_in_channel", "invite me to the channel or give me permission"),
    ],
)
async def test_a_digest_slack_refuses_for_good_pauses_the_watch_and_tells_its_creator(
    watch_world,  # noqa: F811
    tenant,
    error,
    advice,
):
    world = watch_world
    service, watch, payload = await a_due_digest(world, tenant)
    world.api.fail("chat.postMessage", error)  # e.g. only admins may post there now
    assert await service.digest(payload) == "failed"  # not raised: no retry, no dead letter
    stored = await service.store.get(tenant, watch.id)
    assert stored.paused.endswith(error) and await service.store.due(T0 + 9 * DAY) == []
    [told] = [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"]
    assert "I paused it" in told["text"] and error in told["text"]
    assert advice in told["text"] and f"`/watch resume {watch.id}` there" in told["text"]
    if error.startswith("restricted_action"):  # inviting the bot would change nothing
        assert "invite" not in told["text"].lower(), told["text"]


@pytest.mark.parametrize("error", ["token_revoked", "invalid_auth", "missing_scope"])
async def test_an_app_wide_error_of_slack_pauses_no_watch(
    watch_world,  # noqa: F811
    tenant,
    error,
):
    """A revoked token or a missing scope is every watch's, fixed once for all of them (and
    `tell` would need the same token): it pauses no watch, the task fails (retried, then
    dead-lettered) and its papers stay new."""
    from slack_sdk.errors import SlackApiError

    world = watch_world
    service, watch, payload = await a_due_digest(world, tenant)
    world.api.fail("chat.postMessage", error)
    with pytest.raises(SlackApiError):
        await service.digest(payload)
    stored = await service.store.get(tenant, watch.id)
    assert stored.paused == "" and stored.since == watch.since
    assert [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"] == []
    assert await service.digest(payload) == "posted"  # fixed: the retry posts the digest


@pytest.mark.parametrize("error", ["invalid_blocks", "msg_too_long"])
async def test_a_digest_whose_shape_slack_refuses_is_posted_as_text_and_pauses_no_watch(
    watch_world,  # noqa: F811
    tenant,
    error,
):
    """A digest Slack will not take is the bot's bug, not the watch's: no pause, nobody told
    by DM, and the digest is posted once more as plain text (adapters/slack_watch.py)."""
    world = watch_world
    service, watch, payload = await a_due_digest(world, tenant)
    world.api.fail("chat.postMessage", error)
    assert await service.digest(payload) == "posted"
    stored = await service.store.get(tenant, watch.id)
    assert stored.paused == ""
    assert [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"] == []
    [*_, plain] = world.api.of("chat.postMessage")
    assert not plain.get("blocks") and plain["text"]


# -- a channel made private since the watch was made --------------------------------------------


async def test_a_digest_in_a_slack_channel_made_private_names_no_team_only_pdf(uncached):  # noqa: F811
    team = await a_watch_in_public_c1(uncached)  # public C1: the team's PDF may be named there
    uncached.api.private_channels.add("C1")  # an admin converts it to private
    assert TEAM_ONLY.title not in await digest_posted(uncached, team)


async def test_a_discord_channel_hidden_from_everyone_since_is_walled(env):  # noqa: F811
    world, fake, _, _ = env
    guild = fake.guild()
    channel = fake.text_channel(guild)
    tenant = str(guild.id)
    watches = world.runtime.watches
    watch = await watches.create(Scope(tenant, channel=str(channel.id), user="1"),
                                 "operating systems memory", WatchPlace("discord", str(channel.id)))  # fmt: skip
    poster = watches.posters["discord"]
    try:
        assert await poster.walled(watch) is False
        public = channel.permissions_for.side_effect

        def hidden(target, /):  # @everyone loses View Channel
            found = public(target)
            if target is guild.default_role:
                found.view_channel = False
            return found

        channel.permissions_for.side_effect = hidden
        assert await poster.walled(watch) is True
    finally:
        await watches.store.remove(tenant, watch.id)


async def test_a_digest_for_a_gone_discord_channel_is_refused_before_arxiv_is_asked(env):  # noqa: F811
    world, fake, adapter, _ = env
    guild = fake.guild()
    channel = fake.text_channel(guild)
    tenant = str(guild.id)
    watches = world.runtime.watches
    watch = await watches.create(Scope(tenant, channel=str(channel.id), user="1"),
                                 "state space models", WatchPlace("discord", str(channel.id)))  # fmt: skip
    try:
        until = time.time() + 1
        world.arxiv.add_feed([entry(*ON_TOPIC[0], until - 3600)])  # a paper to post
        del fake.channels[channel.id]  # deleted while no process heard of it
        due = await watches.store.claim(watch, until, "tok")
        payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": until,
                   "next": watch.next_due, "token": "tok"}  # fmt: skip
        asked, fetched = len(world.arxiv.api_paths()), adapter.client.fetch_channel.call_count
        assert await watches.digest(payload) == "failed"
        assert len(world.arxiv.api_paths()) == asked  # no arXiv query for a place that is gone
        assert adapter.client.fetch_channel.call_count == fetched + 1  # nor asked twice
        assert (await watches.store.get(tenant, watch.id)).paused.endswith("is gone or hidden")
    finally:
        await watches.store.remove(tenant, watch.id)


# -- the due index, resume, erasure ---------------------------------------------------------------


async def test_a_watch_made_again_after_a_crash_before_its_indexing_is_indexed(memory, tenant):
    store = WatchStore(memory.redis)
    scope = Scope(tenant, channel="C1", user="U1")
    try:
        made = await store.create(scope, "sea otters", DAY, platform="slack", channel="C1",
                                  now=T0, watch_id="w-crash")  # fmt: skip
        await store.reindex(None, tenant, made.id)  # as if the process died before ZADD
        assert (tenant, made.id) not in await store.due(T0)
        again = await store.create(scope, "sea otters", DAY, platform="slack", channel="C1",
                                   now=T0 + 60, watch_id="w-crash")  # fmt: skip
        assert again.next_due == made.next_due and (tenant, made.id) in await store.due(T0)

        await store.pause(again, "paused by someone")  # a paused one stays off the index
        await store.create(scope, "sea otters", DAY, platform="slack", channel="C1",
                           now=T0 + 120, watch_id="w-crash")  # fmt: skip
        assert (tenant, made.id) not in await store.due(T0 + 9 * DAY)
    finally:
        await store.remove(tenant, "w-crash")


async def test_resuming_a_watch_that_is_not_paused_changes_nothing(watch_world, tenant):  # noqa: F811
    service = watch_world.process()
    here = WatchPlace("slack", "C6")
    watch = await service.create(place(tenant, "C6"), "state space models weekly", here)
    claimed = await service.store.claim(watch, T0 + 1, "tok")  # its first digest ran
    assert claimed is not None
    before = await service.store.get(tenant, watch.id)
    watch_world.clock.now = T0 + DAY
    answer = await service.command(place(tenant, "C6"), f"resume {watch.id}", here)
    assert answer.startswith(f"`{watch.id}` is not paused") and "next digest" in answer
    after = await service.store.get(tenant, watch.id)
    assert after.next_due == before.next_due > T0 + DAY  # no extra digest now
    assert (tenant, watch.id) not in await service.store.due(T0 + DAY)


async def test_erasing_a_person_takes_their_id_out_of_the_pauses_they_made(
    watch_world,  # noqa: F811
    tenant,
    memory,
):
    service = watch_world.process()
    here = WatchPlace("slack", "C6")
    watch = await service.create(place(tenant, "C6", "U1"), "state space models", here)
    other = await service.create(place(tenant, "C6", "U1"), "sea otters", here)
    await service.command(place(tenant, "C6", "U27"), f"pause {watch.id}", here)
    await service.command(place(tenant, "C6", "U2"), f"pause {other.id}", here)
    assert (await service.store.get(tenant, watch.id)).paused == "paused by U27"
    with contextlib.suppress(NotFound):
        await memory.governance.forget_person(tenant, "U27")
    assert (await service.store.get(tenant, watch.id)).paused == "paused by someone"
    assert (await service.store.get(tenant, other.id)).paused == "paused by U2"  # not theirs
    assert "U27" not in await service.command(place(tenant, "C6"), "list", here)


# -- Discord's `/watch add` ----------------------------------------------------------------------


async def test_discord_watch_add_refuses_a_period_it_cannot_read(env):  # noqa: F811
    world, fake, adapter, api_ = env
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.snowflake()
    adapter.client._connection.parse_interaction_create(watch_command(
        guild.id, channel.id, user, "add", topic="state space models", period="monthly",
    ))  # fmt: skip
    [refused] = await answered(api_, 1)
    assert refused["data"]["content"].startswith("I cannot read the period 'monthly'")
    assert "every N days" in refused["data"]["content"] and refused["data"]["flags"] & 64
    assert await world.runtime.watches.store.all(str(guild.id)) == []


@pytest.mark.parametrize(
    ("period", "days"), [("3 days", 3), ("every day", 1), ("every week", 7), ("every 3d", 3)]
)
async def test_discord_watch_add_keeps_the_period_it_read_out_of_the_topic(env, period, days):  # noqa: F811
    world, fake, adapter, api_ = env
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.snowflake()
    adapter.client._connection.parse_interaction_create(watch_command(
        guild.id, channel.id, user, "add", topic="state space models", period=period,
    ))  # fmt: skip
    [made] = await answered(api_, 1)
    assert made["data"]["content"].startswith("Watching “state space models”"), made
    store = world.runtime.watches.store
    [watch] = await store.all(str(guild.id))
    try:
        assert (watch.query, watch.period) == ("state space models", days * DAY)
    finally:
        await store.remove(str(guild.id), watch.id)


async def test_a_discord_watch_made_in_a_thread_goes_with_its_deleted_parent(env):  # noqa: F811
    world, fake, adapter, api_ = env
    guild = fake.guild()
    user = fake.snowflake()
    thread = fake.thread(guild, user)
    parent, tenant = thread.parent_id, str(guild.id)
    data = {"id": str(fake.snowflake()), "name": "watch", "type": CHAT_INPUT, "options": [
        {"name": "add", "type": SUB_COMMAND, "options": [
            {"name": "topic", "type": STRING, "value": "state space models"}]}]}  # fmt: skip
    payload = interaction(APPLICATION_COMMAND, guild.id, thread.id, user, data,
                          app_permissions=str(1 << 10 | 1 << 11 | 1 << 38))  # fmt: skip
    payload["channel"]["parent_id"] = str(parent)  # a thread of that channel, as Discord says
    adapter.client._connection.parse_interaction_create(payload)
    [made] = await answered(api_, 1)
    assert made["data"]["content"].startswith("Watching “state space models”")
    watches = world.runtime.watches
    [watch] = await watches.store.all(tenant)
    assert watch.channel == str(thread.id)
    handed: list[Watch] = []

    async def removing(found: list[Watch]) -> None:
        handed.extend(found)

    try:  # the parent channel is deleted (the thread archived, so no event of its own)
        await world.runtime.memory.governance.forget_place(
            DeletedPlace(tenant, "discord", str(parent)), removing
        )
        assert [w.id for w in handed] == [watch.id]
        assert await watches.store.all(tenant) == []
    finally:
        await watches.store.remove(tenant, watch.id)


# -- words ---------------------------------------------------------------------------------------


async def test_a_new_watch_says_the_span_its_first_digest_covers_in_words(watch_world, tenant):  # noqa: F811
    service = watch_world.process()
    here = WatchPlace("slack", "C6")
    for topic, span in (("otters", "day"), ("otters weekly", "week"),
                        ("otters every 3 days", "3 days")):  # fmt: skip
        made = await service.command(place(tenant, "C6"), topic, here)
        assert f"covers the last {span};" in made, made


# -- the terminal ------------------------------------------------------------------------------


async def test_watch_add_with_a_platform_needs_the_tenant_owning_the_channel(
    memory,
    tenant,
    capsys,
    new_papers,  # noqa: F811
):
    store = WatchStore(memory.redis)
    local_before = {w.id for w in await store.all("local")}
    code, _, err = await arxivscout(capsys, "watch", "add", "otters", "--platform", "slack",
                                    "--channel", "C0123")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "--platform needs --tenant" in err
    assert {w.id for w in await store.all("local")} == local_before
    for platform, channel, owner in (("slack", "C0123", "123456789012345678"),
                                     ("discord", "C0123", tenant), ("discord", "42", tenant)):  # fmt: skip
        code, _, err = await arxivscout(capsys, "watch", "add", "otters", "--platform", platform,
                                        "--channel", channel, "--tenant", owner)  # fmt: skip
        assert code == 2 and "cannot be of tenant" in err, (platform, owner)
    assert await store.all(tenant) == []
    code, out, _ = await arxivscout(capsys, "watch", "add", "otters", "--platform", "slack",
                                    "--channel", "C0123", "--tenant", tenant)  # fmt: skip
    assert code == 0 and "posting to slack C0123" in out
    for watch in await store.all(tenant):
        await store.remove(tenant, watch.id)
