"""Audit s30, group E: a Discord thread the bot opened acts as its channel on both paths (a
mention and `/watch`), its own older watches still listed and managed there; Discord failing in
passing makes no watch in the thread; a private thread stays itself; a digest of a watch of
sixty authors keeps its whole footer."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import discord
import pytest

from adapters.discord_watch import DISCORD_SILENT, LIMIT, DiscordWatches, digest_message
from bot.watch_places import PlaceUnknown, WatchPlace
from bot.watches import WatchService
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream
from memory.scope import Scope, Visibility
from memory.stores.watches import DAY, Watch
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.support.discord_fakes import FakeDiscord
from tests.test_s29_E_watch_fixes import digest_of

UNAVAILABLE = discord.HTTPException(mock.Mock(status=503, reason="Service Unavailable"), "later")


@dataclass
class DiscordSide:
    """A server with a private channel, a public thread the bot opened there for a mention,
    and one process's watches posting to Discord."""

    fake: FakeDiscord
    service: WatchService
    poster: DiscordWatches
    tenant: str
    channel: Any
    opened: Any
    failing: list[Exception]  # what the channel lookup raises next (Discord failing)

    def said_in(self, where: Any) -> Scope:
        """A message or command there, as the adapter scopes it (the channel is private)."""
        tenant = self.tenant
        return Scope(tenant, f"discord:{tenant}:{where.id}", str(where.id), Visibility.PRIVATE,
                     "42")  # fmt: skip

    async def slash(self, where: Any, name: str, **options: str) -> str:
        """`/watch <name>` used in `where`: its answer."""
        interaction = self.fake.interaction(where, self.fake.user())
        interaction.app_permissions = discord.Permissions(
            view_channel=True, send_messages=True, send_messages_in_threads=True
        )
        await self.poster.callbacks[name].callback(interaction, **options)
        return interaction.response.send_message.await_args.args[0]


@pytest.fixture
async def side(memory) -> AsyncIterator[DiscordSide]:
    fake = FakeDiscord()
    client = discord.Client(intents=discord.Intents.none())
    fake.attach(client)
    guild = fake.guild()
    channel = fake.text_channel(guild, private=True)
    opened = fake.thread(guild, fake.bot.id, parent_id=channel.id)
    opened.type = discord.ChannelType.public_thread
    failing: list[Exception] = []

    async def channel_of(channel_id: int) -> Any:
        if failing:
            raise failing.pop()
        return fake.channels.get(channel_id)

    prefix = f"digests-{uuid.uuid4().hex[:8]}"
    service = WatchService(
        memory, ArxivSource("http://127.0.0.1:9/api/query", 0.0), encoding_for("gpt-5-mini"),
        stream_prefix=prefix,
    )  # fmt: skip
    poster = DiscordWatches(service, client, channel_of)
    service.attach("discord", poster)
    tenant = str(guild.id)

    async def scope_of(interaction: Any) -> Scope:
        return world.said_in(interaction.channel)

    poster.commands(scope_of)
    world = DiscordSide(fake, service, poster, tenant, channel, opened, failing)
    yield world
    await service.close()
    await TaskStream(memory.redis, task_stream(f"{prefix}-discord")).destroy()
    for watch in await service.store.all(tenant):
        await service.store.remove(tenant, watch.id)


async def test_a_bot_thread_is_its_channel_for_a_mention_and_for_slash_commands(side):
    made = await side.service.message(side.said_in(side.opened), "watch state space models weekly")
    assert made is not None and f"in <#{side.channel.id}>" in made  # not "here": the thread
    [watch] = await side.service.store.all(side.tenant)
    assert watch.channel == str(side.channel.id)
    assert watch.id in await side.slash(side.opened, "list")  # where the mention said it is
    stopped = await side.slash(side.opened, "remove", watch_id=watch.id)
    assert stopped.startswith("Stopped watching")
    assert await side.service.store.all(side.tenant) == []
    added = await side.slash(side.opened, "add", topic="diffusion models", period="weekly")
    assert f"in <#{side.channel.id}>" in added
    [watch] = await side.service.store.all(side.tenant)
    assert watch.channel == str(side.channel.id)  # as a mention there makes it


async def test_a_watch_made_in_the_bot_thread_before_stays_listed_and_managed_there(side):
    thread_scope = side.said_in(side.opened)  # made there before the thread moved to its channel
    older = await side.service.store.create(
        thread_scope, "state space models", 7 * DAY, platform="discord",
        channel=str(side.opened.id), now=time.time(),
    )  # fmt: skip
    listed = await side.service.message(thread_scope, "watch list")
    assert listed is not None and older.id in listed
    assert older.id in await side.slash(side.opened, "list")
    paused = await side.slash(side.opened, "pause", watch_id=older.id)
    assert paused.startswith("Paused")
    stopped = await side.service.message(thread_scope, f"watch remove {older.id}")
    assert stopped is not None and stopped.startswith("Stopped watching")
    assert await side.service.store.all(side.tenant) == []


async def test_discord_failing_in_passing_makes_no_watch_in_the_thread(side):
    side.failing.append(UNAVAILABLE)
    answer = await side.service.message(
        side.said_in(side.opened), "watch state space models weekly"
    )
    assert answer == DISCORD_SILENT
    side.failing.append(UNAVAILABLE)
    assert await side.slash(side.opened, "add", topic="diffusion models") == DISCORD_SILENT
    assert await side.service.store.all(side.tenant) == []
    gone = discord.NotFound(mock.Mock(status=404, reason="Not Found"), "Unknown Channel")
    side.failing.append(gone)  # gone or hidden: the place itself, as before
    place = WatchPlace("discord", str(side.opened.id))
    assert await side.poster.home(place) == place
    side.failing.append(UNAVAILABLE)
    with pytest.raises(PlaceUnknown):
        await side.poster.home(place)


async def test_a_private_thread_the_bot_opened_stays_itself(side):
    side.opened.type = discord.ChannelType.private_thread
    place = WatchPlace("discord", str(side.opened.id))
    assert await side.poster.home(place) == place
    made = await side.service.message(side.said_in(side.opened), "watch state space models weekly")
    assert made is not None and " here " in made
    [watch] = await side.service.store.all(side.tenant)
    assert watch.channel == str(side.opened.id)  # not widened to the parent's audience


async def test_a_digest_of_a_watch_of_sixty_authors_keeps_its_whole_footer():
    authors = [f"Author Number {n:02d} Of A Long Name" for n in range(60)]
    watch = Watch("w1", "1", "", 7 * DAY, "discord", "2", authors=authors)
    marker = "w1:1767600000"
    text = digest_message(digest_of(watch, papers=5, long=True), marker)
    assert len(text) <= LIMIT
    assert text.endswith(f"`/watch remove w1` stops it. (digest {marker})")
    assert "**1. [" in text  # the papers still shown, cut to what is left
