"""Topic watches in two real bot processes (`arxivscout slack`, each checking every half second)
on one Redis: each period's digest is posted once, and once more after one process is killed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from memory.keys import watch_key, watches_due_key
from memory.scope import Scope
from memory.stores.watches import DAY, WatchStore
from tests.conftest import free_port
from tests.support.arxiv_replay import ArxivReplay, memgpt_entry
from tests.support.bot_process import BotProcess, bot_env
from tests.support.slack_api import MockSlackApi
from tests.test_watches import ON_TOPIC, entry


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@pytest.fixture
async def two_bots(redis_url, tmp_path):
    replay = ArxivReplay().start()
    api = MockSlackApi()
    await api.start()
    env = bot_env(redis_url, "http://127.0.0.1:9/v1", api.base_url, tmp_path / "data", "s3cret")
    env.update(ARXIV_API_URL=replay.api_url, ARXIV_DELAY_SECONDS="0",
               ARXIVSCOUT_WATCH_CHECK_SECONDS="0.5")  # fmt: skip
    bots = [BotProcess(env, free_port(), tmp_path / f"bot{n}.log") for n in range(2)]
    try:
        await asyncio.gather(*(bot.start() for bot in bots))
        yield replay, api, bots
    finally:
        for bot in bots:
            bot.kill()
            if bot.process is not None:
                await bot.process.wait()
        await api.close()
        replay.stop()


def digests(api: MockSlackApi) -> list[dict]:
    return [p for p in api.of("chat.postMessage") if p.get("text", "").startswith("New papers")]


async def until(check, bots, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            logs = "\n".join(b.log.read_text()[-1500:] for b in bots)
            raise AssertionError(f"timed out\n{logs}")
        await asyncio.sleep(0.1)


async def test_two_processes_post_each_period_once(two_bots, memory, tenant):
    replay, api, bots = two_bots
    store = WatchStore(memory.redis)
    replay.add_feed([replace(memgpt_entry(), published=iso(time.time() - 3600))])
    watch = await store.create(Scope(tenant, channel="C7", user="U1"), "operating systems memory",
                               DAY, platform="slack", channel="C7")  # fmt: skip
    try:
        await until(lambda: len(digests(api)) == 1, bots)
        await asyncio.sleep(2.0)  # four more checks in each process: nothing more is due
        assert len(digests(api)) == 1

        async def next_period() -> None:
            """The day passes: the watch is due again (as its clock would make it)."""
            now = int(time.time())
            await memory.redis.hset(watch_key(tenant, watch.id), "next_due", str(now))
            await memory.redis.zadd(watches_due_key(), {f"{tenant}|{watch.id}": now})

        replay.add_feed([entry(*ON_TOPIC[0], time.time() - 60)])
        await next_period()
        await until(lambda: len(digests(api)) == 2, bots)
        await asyncio.sleep(2.0)
        assert len(digests(api)) == 2 and ON_TOPIC[0][0] in digests(api)[1]["text"]

        bots[0].kill()  # a crash: the other process carries on alone
        replay.add_feed([entry(*ON_TOPIC[1], time.time() - 60)])
        await next_period()
        await until(lambda: len(digests(api)) == 3, bots)
        await asyncio.sleep(2.0)
        assert len(digests(api)) == 3 and ON_TOPIC[1][0] in digests(api)[2]["text"]
        assert {p["channel"] for p in digests(api)} == {"C7"}
    finally:
        await store.remove(tenant, watch.id)
