"""Audit s31: `DiscordWatches.find` against the REST mock's channel history, answering as Discord
does (pages of at most 100, newest first, `after` an id): a digest task run again after its
answer was lost and Discord's nonce has lapsed finds its digest by the footer's marker and
posts nothing; a person quoting the digest is not taken for it; a history the bot may not read
finds none (the post then says); a digest from before the lookback is not found."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import discord
import pytest

from adapters.discord_platform import DiscordPlatform
from adapters.discord_watch import FIND_SECONDS, DiscordWatches, marker_tag
from bot.watches import WatchService
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream
from memory.scope import Scope, Visibility
from memory.stores.watches import DAY, Watch, WatchStore
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.support.arxiv_replay import ArxivReplay
from tests.support.discord_api import BOT_TOKEN, Guild, MockDiscordApi, serving_discord_api
from tests.test_s29_E_watch_fixes import digest_of
from tests.test_watches import ON_TOPIC, entry

FIND_WARNING = "could not read"


async def logged_in(api: MockDiscordApi, guild: Guild) -> discord.Client:
    """A bot process's client: logged in at the mock, its server cached as the gateway's
    GUILD_CREATE gives it (channels with their overwrites, the bot's member)."""
    client = discord.Client(intents=discord.Intents.none())
    await client.login(BOT_TOKEN)
    data = await client.http.get_guild(guild.id)
    data.update({
        "channels": await client.http.get_all_guild_channels(guild.id),
        "members": [await client.http.get_member(guild.id, api.bot_id)],
        "threads": [], "member_count": len(guild.members), "large": False,
    })  # fmt: skip
    client._connection.parse_guild_create(data)
    return client


@dataclass
class Server:
    """One Discord server at the mock (its owner the watch's creator, one public channel), an
    arXiv replay, and the bot processes a test starts there (their own digest stream)."""

    api: MockDiscordApi
    guild: Guild
    channel: int
    creator: int
    replay: ArxivReplay
    prefix: str
    clients: list[discord.Client] = field(default_factory=list)  # closed after the test
    services: list[WatchService] = field(default_factory=list)  # ditto

    @property
    def tenant(self) -> str:
        return str(self.guild.id)

    async def client(self) -> discord.Client:
        client = await logged_in(self.api, self.guild)
        self.clients.append(client)
        return client

    async def process(self, memory) -> WatchService:
        """One bot process: its own client, and its watches reading the Discord digest stream
        (a task failed elsewhere is claimed after 300 ms)."""
        client = await self.client()
        service = WatchService(
            memory, ArxivSource(self.replay.api_url, 0.0), encoding_for("gpt-5-mini"),
            stream_prefix=self.prefix, claim_idle_ms=300,
        )  # fmt: skip
        service.attach("discord", DiscordWatches(service, client, DiscordPlatform(client).channel))
        self.services.append(service)
        return service

    def digests(self) -> list[str]:
        return [text for text in self.api.texts(self.channel) if "(digest " in text]


@pytest.fixture
async def server(memory) -> AsyncIterator[Server]:
    replay = ArxivReplay().start()
    async with serving_discord_api() as api:
        creator = api.user("ada")
        guild = api.guild(creator)
        channel = guild.channel("papers")
        world = Server(api, guild, channel, creator, replay, f"digests-{uuid.uuid4().hex[:8]}")
        yield world
        for service in world.services:
            await service.close()
        for client in world.clients:
            await client.close()
        store = WatchStore(memory.redis)  # the global due index keeps no test's watches
        for watch in await store.all(world.tenant):
            await store.remove(world.tenant, watch.id)
    replay.stop()
    await TaskStream(memory.redis, task_stream(f"{world.prefix}-discord")).destroy()


async def crashed_after_posting(server: Server, memory) -> Watch:
    """A due watch whose digest Discord made but whose answer was lost (a 503 after the post):
    the task failed with its period recorded as "posting", and its process stopped (the next
    process, a fresh client, runs it again)."""
    server.replay.add_feed([entry(*ON_TOPIC[0], time.time() - 3600)])
    first = await server.process(memory)
    scope = Scope(server.tenant, channel=str(server.channel), user=str(server.creator),
                  visibility=Visibility.PUBLIC)  # fmt: skip
    watch = await first.store.create(scope, "state space models", DAY, platform="discord",
                                     channel=str(server.channel))  # fmt: skip
    server.api.fail("post", 503, created=True)
    # the due index is global: other tests' watches may be due too
    assert (server.tenant, watch.id) in await first.check()
    deadline = time.monotonic() + 60
    while not server.api.of("post"):
        assert time.monotonic() < deadline, "the digest was never posted"
        await asyncio.sleep(0.05)
    await first.close()  # its batch finished, failed: the task stays pending
    assert len(server.digests()) == 1
    record = await first.store.digest(server.tenant, watch.id, str(watch.next_due))
    assert record.state == "posting"
    return watch


async def test_a_digest_task_run_again_after_its_nonce_lapsed_finds_its_digest(server, memory):
    server.api.nonce_seconds = 0.0  # an outage longer than Discord keeps a nonce
    watch = await crashed_after_posting(server, memory)
    again = await server.process(memory)
    await again.workers["discord"].drain()
    [digest] = server.digests()  # found: nothing posted again
    [message_id] = [m for m, p in server.api.posted.items() if p.content == digest]
    assert len(server.api.of("post")) == 1
    [read] = server.api.of("history")
    assert read.path.endswith(f"/channels/{server.channel}/messages") and "after" in read.query
    record = await again.store.digest(server.tenant, watch.id, str(watch.next_due))
    assert record.state == "posted" and record.ref == str(message_id)


async def test_a_person_quoting_the_digest_is_not_taken_for_it(server):
    client = await server.client()
    poster = DiscordWatches(None, client, DiscordPlatform(client).channel)
    watch = Watch("w1", server.tenant, "state space models", 7 * DAY, "discord",
                  str(server.channel))  # fmt: skip
    marker = f"{watch.id}:{int(time.time())}"
    since = time.time() - 20  # "posting" began
    person = server.api.user("grace")
    quoted = server.api.say(server.channel, f"look: {marker_tag(marker)}", person, 10)
    for n in range(150):  # more than a page of chatter before the digest
        server.api.say(server.channel, f"chatter {n}", person, 9)
    ours = await poster.post(watch, digest_of(watch), marker)
    found = await poster.find(watch, marker, since)
    assert found == ours and found != str(quoted)
    assert len(server.api.of("history")) == 2  # read a page of 100, then the rest
    assert await poster.find(watch, f"{watch.id}:0", since) is None  # another period's


async def test_a_history_the_bot_may_not_read_finds_none_and_the_post_goes_ahead(
    server, memory, caplog
):
    watch = await crashed_after_posting(server, memory)
    server.api.no_access.add(server.channel)  # hidden from the bot since
    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        again = await server.process(memory)
        await again.workers["discord"].drain()
    [refused] = [c.getMessage() for c in caplog.records if FIND_WARNING in c.getMessage()]
    assert str(server.channel) in refused and "Missing Access" in refused
    # not found: the digest was posted again, Discord refused it, the watch paused
    assert [c.route for c in server.api.calls if c.route in ("history", "post")] == [
        "post", "history", "post", "post",  # (the last: the creator told, in a DM)
    ]  # fmt: skip
    stored = await again.store.get(server.tenant, watch.id)
    assert stored is not None and stored.paused.startswith("Discord refused the digest")
    told = server.api.texts(server.api.dms[server.creator])
    assert len(told) == 1 and f"/watch resume {watch.id}" in told[0]


async def test_a_digest_posted_before_the_lookback_is_not_found(server):
    client = await server.client()
    poster = DiscordWatches(None, client, DiscordPlatform(client).channel)
    watch = Watch("w1", server.tenant, "state space models", 7 * DAY, "discord",
                  str(server.channel))  # fmt: skip
    marker = f"{watch.id}:1767600000"
    made = time.time() - 600  # the bot's digest, ten minutes ago
    old = server.api.say(server.channel, f"a digest {marker_tag(marker)}", seconds_ago=600)
    assert await poster.find(watch, marker, made + 5) == str(old)  # within the lookback
    assert await poster.find(watch, marker, made + FIND_SECONDS + 5) is None
