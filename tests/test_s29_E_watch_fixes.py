"""Audit s29, group E: a Discord digest found in its channel's history after a nonce has
lapsed, its footer never cut; a Slack resume that names the watch's channel; an archived Slack
channel's own advice; a removal notice whose command reads back whole."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import discord

from adapters.discord_watch import LIMIT, DiscordWatches, digest_message
from bot.watch_commands import WatchCommands
from bot.watch_removals import removed_text
from bot.watches import WatchPlace, parse_watch
from memory.digest import Digest, DigestItem
from memory.governance_places import DeletedPlace
from memory.ingest.arxiv_source import Candidate
from memory.scope import Scope, Visibility
from memory.stores.watches import DAY, Watch, WatchStore
from tests.support.discord_fakes import FakeDiscord, spec
from tests.test_watches import ON_TOPIC, T0, entry, place, watch_world  # noqa: F401

WEEK = 7 * DAY
PRIVATE = Visibility.PRIVATE


def discord_watch(guild: int, channel: int) -> Watch:
    return Watch("w1", str(guild), "state space models", WEEK, "discord", str(channel))


def digest_of(watch: Watch, papers: int = 1, long: bool = False) -> Digest:
    title = "A very long title " * 12 if long else "A title"
    why = "Why it matters, at length. " * 60 if long else "Close to the topic."
    items = [
        DigestItem(Candidate(f"2501.0000{n}", f"{title}{n}", ["Albert Gu", "Tri Dao"]), 0.9, why)
        for n in range(papers)
    ]
    return Digest(watch, T0 - WEEK, T0, items, found=papers)


def held_by(channel: Any, messages: list[Any]) -> None:
    """What Discord keeps in `channel`: `history` gives the messages after `after` (a time, as
    a snowflake's), oldest first, at most `limit`."""

    async def history(*, limit: int = 100, after: Any = None, **kw: Any):
        since = discord.utils.time_snowflake(after) if after is not None else 0
        for message in [m for m in messages if m.id > since][:limit]:
            yield message

    channel.history.side_effect = history


def kept(author: Any, content: str, at: float) -> Any:
    moment = datetime.fromtimestamp(at, tz=UTC)
    return spec(discord.Message, id=discord.utils.time_snowflake(moment), author=author,
                content=content)  # fmt: skip


async def test_a_discord_digest_posted_before_an_outage_is_found_in_the_channels_history():
    fake = FakeDiscord()
    client = discord.Client(intents=discord.Intents.none())
    fake.attach(client)
    guild = fake.guild()
    channel = fake.text_channel(guild)

    async def channel_of(channel_id: int) -> Any:
        return fake.channels.get(channel_id)

    poster = DiscordWatches(None, client, channel_of)
    watch = discord_watch(guild.id, channel.id)
    posting_since = time.time() - 3600  # "posting" an hour ago: Discord's nonce is long gone
    await poster.post(watch, digest_of(watch), f"{watch.id}:{int(T0)}")
    [sent] = fake.texts(channel.id)
    someone = fake.user()
    ours = kept(fake.bot, sent, posting_since + 5)
    held_by(channel, [
        kept(fake.bot, "an older digest " + sent, posting_since - 3600),  # before "posting"
        kept(someone, sent, posting_since + 1),  # a person quoting it is not the digest
        ours,
    ])  # fmt: skip
    assert await poster.find(watch, f"{watch.id}:{int(T0)}", posting_since) == str(ours.id)
    assert await poster.find(watch, f"{watch.id}:{int(T0 + WEEK)}", posting_since) is None


async def test_a_discord_watch_made_in_the_thread_of_a_mention_posts_to_its_channel(memory):
    fake = FakeDiscord()
    client = discord.Client(intents=discord.Intents.none())
    fake.attach(client)
    guild = fake.guild()
    channel = fake.text_channel(guild, private=True)
    opened = fake.thread(guild, fake.bot.id, parent_id=channel.id)  # for a mention
    opened.type = discord.ChannelType.public_thread
    theirs = fake.thread(guild, fake.snowflake(), parent_id=channel.id)  # a person's own

    async def channel_of(channel_id: int) -> Any:
        return fake.channels.get(channel_id)

    store, tenant = WatchStore(memory.redis), str(guild.id)
    commands = WatchCommands(
        store, {"discord": DiscordWatches(None, client, channel_of)}, time.time
    )

    def said_in(thread: Any) -> Scope:  # a private channel's: seen only there
        return Scope(tenant, f"discord:{tenant}:{thread.id}", str(thread.id), PRIVATE, "42")

    try:
        made = await commands.message(said_in(opened), "watch state space models weekly")
        assert made is not None and made.startswith("Watching")
        [watch] = await store.all(tenant)
        assert watch.channel == str(channel.id)  # not the thread, which archives when quiet
        in_channel = Scope(tenant, channel=str(channel.id), visibility=PRIVATE)
        listed = await commands.list_text(in_channel, WatchPlace("discord", str(channel.id)))
        assert watch.id in listed  # where it posts, and by the channel's audience
        await commands.message(said_in(theirs), "watch diffusion models weekly")
        assert {w.channel for w in await store.all(tenant)} == {str(channel.id), str(theirs.id)}
    finally:
        for made_watch in await store.all(tenant):
            await store.remove(tenant, made_watch.id)


async def test_a_discord_digest_of_five_long_papers_keeps_its_whole_footer():
    watch = discord_watch(1, 2)
    text = digest_message(digest_of(watch, papers=5, long=True), f"{watch.id}:{int(T0)}")
    assert len(text) <= LIMIT
    assert text.endswith(f"`/watch remove {watch.id}` stops it. (digest {watch.id}:{int(T0)})")


async def test_a_slack_resume_from_another_channel_names_the_channel_that_dropped_the_bot(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    service = world.process()
    watch = await service.create(
        place(tenant, "C8"), "state space models", WatchPlace("slack", "C8")
    )
    await service.command(place(tenant, "C8"), f"pause {watch.id}", WatchPlace("slack", "C8"))
    world.api.not_joined.add("C8")  # the bot was removed from the watch's channel

    async def admin() -> bool:
        return True

    refused = await service.command(
        place(tenant, "C9"), f"resume {watch.id}", WatchPlace("slack", "C9"), admin=admin
    )
    assert "<#C8>" in refused and "invite me" in refused
    assert (await service.store.get(tenant, watch.id)).paused  # stays paused


async def test_a_slack_digest_refused_as_archived_advises_unarchiving(watch_world, tenant):  # noqa: F811
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    watch = await service.create(
        place(tenant, "C7"), "state space models", WatchPlace("slack", "C7")
    )
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    world.api.fail("chat.postMessage", "is_archived")
    assert await service.digest(payload) == "failed"
    [told] = [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"]
    assert "archived: unarchive it" in told["text"] and "invite me" not in told["text"]
    assert f"/watch resume {watch.id}" in told["text"]


async def test_no_slack_watch_is_made_in_an_archived_channel(watch_world, tenant):  # noqa: F811
    world = watch_world
    answer = world.api._conversation  # the mock's conversations.info, with C6 archived

    def archived(channel: str) -> dict[str, Any]:
        found = answer(channel)
        found["channel"]["is_archived"] = channel == "C6"
        return found

    world.api._conversation = archived
    service = world.process()
    refused = await service.command(
        place(tenant, "C6"), "state space models", WatchPlace("slack", "C6")
    )
    assert refused.startswith("<#C6> is archived") and "unarchive it" in refused
    assert await service.store.all(tenant) == []


async def test_a_removal_notices_command_reads_back_as_the_same_watch():
    watch = Watch("w2", "T1", "state space models", WEEK, "slack", "C3",
                  categories=["cs.LG"], authors=["Albert Gu"])  # fmt: skip
    text = removed_text(watch, DeletedPlace("T1", "slack", "C3"))
    command = text.split("`/watch ", 1)[1].split("` there", 1)[0]
    again = parse_watch(command)
    assert (again.query, again.period) == (watch.query, watch.period)
    assert (again.categories, again.authors) == (["cs.LG"], ["Albert Gu"])
