"""Discord failing in passing while an answer is sent (503 Service Unavailable at once; 500,
502 and 504 once discord.py's own retries are spent): the job stays queued and runs again, so
the answer is delivered, not lost behind a failure notice that Discord may refuse as well."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from unittest import mock

import pytest

from adapters.discord import DiscordAdapter
from adapters.discord_catchup import turn_job_id
from adapters.platform_ids import discord_source
from adapters.spine import Job
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi, serving_discord_api, snowflake
from tests.test_discord import echo


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as api:
        yield api


@pytest.fixture
async def adapter(redis_url, tmp_path, api) -> AsyncIterator[DiscordAdapter]:
    """An adapter whose channels are Discord's over REST (the mock): every send is real HTTP."""
    world = await open_world(redis_url, tmp_path)
    world.model.responder = echo
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    client = adapter.client
    client.get_channel = mock.create_autospec(
        client.get_channel, side_effect=client.get_partial_messageable
    )
    # a re-run soon; the lease (renewed every second) outlasts a stalled event loop
    adapter.pipeline.lease_ms, adapter.pipeline.recover_every = 3000, 0.1
    await client.http.static_login(BOT_TOKEN)
    yield adapter
    await adapter.pipeline.close()
    await client.http.close()
    await close_world(world)


async def answered(api: MockDiscordApi, channel: int) -> list[str]:
    for _ in range(100):
        if api.texts(channel):
            break
        await asyncio.sleep(0.1)
    return api.texts(channel)


async def test_an_answer_refused_with_503_is_sent_again(api, adapter):
    guild, channel, message = snowflake(), snowflake(), snowflake()
    scope = Scope(str(guild), f"discord:{guild}:{channel}", str(channel), user="1")
    api.fail("post", 503)
    job = Job(
        "turn", scope, "find MemGPT", event_id=f"discord-job:{message}",
        reply={"channel_id": channel}, id=turn_job_id(message), source=discord_source(message),
    )  # fmt: skip
    assert await adapter.pipeline.submit(job, notify=False)
    assert await answered(api, channel) == ["Answer: find MemGPT"]
    await adapter.pipeline.wait_idle()
    assert api.texts(channel) == ["Answer: find MemGPT"]
    assert len(api.of("post")) == 2  # refused once, then sent by the job's second run


@pytest.mark.parametrize("status", [503, 502])
async def test_an_answer_created_but_answered_with_an_error_is_posted_once(api, adapter, status):
    """Discord created the message, then answered a server error: the send tried again (the
    job's re-run after a 503; discord.py's own retry after a 502) carries the same nonce, so
    Discord returns the message it made instead of posting the answer twice."""
    guild, channel, message = snowflake(), snowflake(), snowflake()
    scope = Scope(str(guild), f"discord:{guild}:{channel}", str(channel), user="1")
    api.fail("post", status, created=True)
    job = Job(
        "turn", scope, "find MemGPT", event_id=f"discord-job:{message}",
        reply={"channel_id": channel}, id=turn_job_id(message), source=discord_source(message),
    )  # fmt: skip
    assert await adapter.pipeline.submit(job, notify=False)
    for _ in range(100):
        if len(api.of("post")) >= 2:
            break
        await asyncio.sleep(0.1)
    await adapter.pipeline.wait_idle()
    assert len(api.of("post")) == 2  # created but refused, then sent again
    assert api.texts(channel) == ["Answer: find MemGPT"]
