"""A public channel shared with another organisation after the fact (Slack Connect): Slack's
`channel_shared` event makes the adapter ask Slack about it again at once, not when its cached
walls expire (adapters/slack_walls.py), and `channel_unshared` likewise; a topic watch made there
before names only what a walled place may read in its next digest (adapters/slack_watch.py
`walled`, bot/watch_digest.py `PlaceWalls`), whatever audience the watch was made with.

Through the Slack adapter over real HTTP (Slack's answers cached as in production), a real
Redis, the scripted model and the replayed arXiv."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from bot.watches import WatchPlace
from memory.scope import PUBLIC, Scope
from memory.stores.knowledge_base import Chunk, Paper
from tests.support.arxiv_replay import MEMGPT_TITLE, memgpt_entry
from tests.support.slack_api import mention
from tests.test_slack_walls import (
    QUESTION,
    asks_team_memory,
    sent_to_model,
    stored,
    team_memory,
    ts,
    walled_world,
)
from tests.test_watches_slack import iso

# a PDF shared in another public channel: the team's to read, not another organisation's
TEAM_ONLY = Paper("pdf-0123456789abcdef", "Internal memo on operating system memory paging",
                  source="pdf")  # fmt: skip


@contextlib.asynccontextmanager
async def world(redis_url: str, tmp_path, cache_seconds: float) -> AsyncIterator:
    """`walled_world`; the watches made in it go with it (the scheduler's tick finds every
    tenant's due watches: none may be left for the next test)."""
    async with walled_world(redis_url, tmp_path, cache_seconds) as env:
        env.teams = []
        try:
            yield env
        finally:
            store = env.world.runtime.watches.store
            for team in env.teams:
                for watch in await store.all(team):
                    await store.remove(team, watch.id)


@pytest.fixture
async def cached(redis_url, tmp_path):
    """Slack's answers about channels kept for 5 minutes, as in production."""
    async with world(redis_url, tmp_path, 300) as env:
        yield env


@pytest.fixture
async def uncached(redis_url, tmp_path):
    async with world(redis_url, tmp_path, 0) as env:
        yield env


def sharing(channel: str, shared: bool) -> dict:
    """Slack's `channel_shared` (another organisation joined) or `channel_unshared` event."""
    now = f"{time.time():.6f}"
    if shared:
        return {"type": "channel_shared", "connected_team_id": "TPARTNER", "channel": channel,
                "event_ts": now}  # fmt: skip
    return {"type": "channel_unshared", "previously_connected_team_id": "TPARTNER",
            "channel": channel, "is_ext_shared": False, "event_ts": now}  # fmt: skip


async def test_a_mention_after_channel_shared_is_walled_without_waiting_for_the_cache(cached):
    team = await team_memory(cached)
    cached.world.model.script(*asks_team_memory() * 3)

    async def member_asks(n: int) -> str:
        before = len(cached.world.model_requests())
        await cached.a.event(mention(QUESTION, ts(n), channel="C1", user="U2"), team=team)
        await cached.settle()
        return sent_to_model(cached, before)

    assert "7 million" in await member_asks(70)  # public C1: Slack's answer is cached now
    cached.api.shared_channels.add("C1")  # another organisation joins
    assert (await cached.a.event(sharing("C1", True), team=team)).status == 200
    assert "7 million" not in await member_asks(71)
    assert await stored(cached, team, "C1", ts(71)) == {"private:C1"}

    cached.api.shared_channels.discard("C1")  # and leaves again
    assert (await cached.a.event(sharing("C1", False), team=team)).status == 200
    assert "7 million" in await member_asks(72)
    assert await stored(cached, team, "C1", ts(72)) == {PUBLIC}


async def a_watch_in_public_c1(env, by_command: bool = True) -> str:
    """The team's PDF, a new arXiv paper much like it, a member's watch made in public C1 (by
    `/watch`, which asks Slack about C1; or straight through the service, which does not)."""
    team = f"T{time.time_ns()}"
    env.teams.append(team)
    memory = env.memory
    text = f"{TEAM_ONLY.title}: how an operating system pages memory."
    await memory.knowledge_base.add_paper(Scope(team), TEAM_ONLY, [Chunk(text)],
                                          await memory.embedder.embed([text]), audience=PUBLIC)  # fmt: skip
    env.world.arxiv.add_feed([replace(memgpt_entry(), published=iso(time.time() - 3600))])
    topic, watches = "operating systems memory weekly", env.world.runtime.watches
    if by_command:
        response = await env.a.command("/watch", topic,
                                       env.api.response_url + f"{time.time_ns()}", team=team)  # fmt: skip
        assert json.loads(await response.text())["text"].startswith("Watching ")
    else:
        member = Scope(team, channel="C1", user="U1")
        await watches.create(member, topic, WatchPlace("slack", "C1"))
    [watch] = await watches.store.all(team)
    assert watch.audience == PUBLIC
    return team


async def digest_posted(env, team: str) -> str:
    """The scheduler's tick and the digest task: the digest message posted, as sent."""
    watches = env.world.runtime.watches
    # the suite's Redis is shared: another test's overdue watch may be claimed too
    claimed = [tenant for tenant, _ in await watches.check() if tenant == team]
    assert claimed == [team]
    await watches.workers["slack"].drain()
    posts = env.api.of("chat.postMessage")
    [posted] = [p for p in posts if "New papers" in p["text"] and p.get("channel") == "C1"]
    assert MEMGPT_TITLE in posted["text"]
    return json.dumps(posted)


async def test_a_digest_after_channel_shared_names_no_team_only_paper(cached):
    team = await a_watch_in_public_c1(cached)  # Slack said C1 is public and not shared
    cached.api.shared_channels.add("C1")
    assert (await cached.a.event(sharing("C1", True), team=team)).status == 200
    assert TEAM_ONLY.title not in await digest_posted(cached, team)


async def test_a_digest_follows_what_slack_says_of_the_channel_now(uncached):
    """Shared without an event reaching this process: the digest asks Slack (its cache
    expired) and is walled all the same."""
    team = await a_watch_in_public_c1(uncached)
    uncached.api.shared_channels.add("C1")
    assert TEAM_ONLY.title not in await digest_posted(uncached, team)


async def test_a_digest_where_slack_cannot_say_is_walled(uncached):
    team = await a_watch_in_public_c1(uncached, by_command=False)  # Slack never described C1
    uncached.api.fail("conversations.info", "internal_error")
    assert TEAM_ONLY.title not in await digest_posted(uncached, team)


async def test_a_digest_in_a_public_channel_still_names_the_team_s_papers(uncached):
    team = await a_watch_in_public_c1(uncached)
    assert TEAM_ONLY.title in await digest_posted(uncached, team)
