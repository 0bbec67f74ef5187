"""Faults injected into the running bot, as separate processes: the bot killed mid-turn (and a
second instance taking over), Redis killed mid-turn, a failing and a hanging model, poison
input in a burst. Every acknowledged message is answered exactly once, or gets a reply saying
what went wrong; no stored message is lost.

Slow by nature (a dead process's lease must lapse: 15 s), so each scenario is one test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from adapters.spine import LEASE_MS, MEMORY_DOWN
from bot.harness import ENTITY_INSTRUCTIONS
from memory.redis_server import EmbeddedRedis
from tests.conftest import free_port, redis_options
from tests.support.bot_process import BotProcess, bot_env
from tests.support.scripted_openai import ScriptedOpenAI, error, text
from tests.support.slack_api import MockSlackApi, SlackSender, mention

SECRET = "fault-secret"
TEAM = "TFAULT"
TAKEOVER_SECONDS = LEASE_MS / 1000 + 15  # lease lapse + a recovery scan + a turn, with slack


def model_for(requests: list[str]):
    """Answers "answer to <question>"; the question's words choose a fault."""

    async def respond(body: dict):
        messages = body["messages"]
        if messages[0]["content"] == ENTITY_INSTRUCTIONS:
            return text("[]")
        question = messages[1]["content"].split("\n")[1]
        requests.append(question)
        if "fails" in question:
            return error(500, "scripted outage")
        if "rate limited" in question:
            return error(429, "Rate limit reached", headers={"Retry-After": "0.1"})
        if "hangs" in question:
            return text("too late", delay=30)
        slow = 5.0 if "outage" in question else 3.0  # outlasts the wait before Redis is killed
        delay = slow if "slow" in question and requests.count(question) == 1 else 0.0
        return text(f"answer to {question}", delay=delay)

    return respond


class Scene:
    """Redis, the model and the Slack Web API in this process; bots as their own processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.redis = EmbeddedRedis(tmp / "redis", preferred_port=free_port(), **redis_options())
        self.requests: list[str] = []
        self.model = ScriptedOpenAI(responder=model_for(self.requests))
        self.api = MockSlackApi(team_id=TEAM)
        self.bots: list[BotProcess] = []
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Scene:
        self.redis_url = self.redis.ensure_running()
        await self.model.start()
        await self.api.start()
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        for bot in self.bots:
            bot.kill()
            if bot.process is not None:
                await bot.process.wait()
        await self.session.close()
        await self.api.close()
        await self.model.close()
        self.redis.stop()

    async def bot(self, **env: str) -> BotProcess:
        environment = bot_env(self.redis_url, self.model.base_url, self.api.base_url,
                              self.tmp / "data", SECRET)  # fmt: skip
        environment.update(env)
        bot = BotProcess(environment, free_port(), self.tmp / f"bot{len(self.bots)}.log")
        self.bots.append(bot)
        return await bot.start()

    async def ask(self, bot: BotProcess, question: str, root: str) -> int:
        sender = SlackSender(bot.url, SECRET, self.session)
        reply = await sender.event(mention(question, root), team=TEAM, event_id=f"Ev{root}")
        return reply.status

    def shown(self, root: str) -> list[str]:
        return self.api.thread_texts("C1", root)

    async def until(self, condition, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                logs = "\n".join(b.log.read_text()[-1500:] for b in self.bots)
                raise AssertionError(f"timed out; Slack shows {self.api.calls[-6:]}\n{logs}")
            await asyncio.sleep(0.1)

    async def stored(self, root: str) -> list[str]:
        import redis.asyncio as aredis

        from memory.keys import messages_key

        client = aredis.from_url(self.redis_url)
        try:
            rows = await client.lrange(messages_key(TEAM, f"slack:{TEAM}:C1:{root}"), 0, -1)
        finally:
            await client.aclose()
        return [json.loads(r)["content"] for r in rows]


@pytest.fixture
async def scene(tmp_path):
    async with Scene(tmp_path) as scene:
        yield scene


async def test_a_killed_bots_turn_is_answered_once_by_the_other_and_after_a_restart(scene):
    a, b = await scene.bot(), await scene.bot()
    # killed mid-turn: the other instance takes the thread over
    assert await scene.ask(a, "slow question one", "100.1") == 200
    await scene.until(lambda: "slow question one" in scene.requests, 20)
    a.kill()
    await scene.until(lambda: scene.shown("100.1") == ["answer to slow question one"],
                      TAKEOVER_SECONDS)  # fmt: skip
    # restarted, it takes over its peer's turn in turn
    await a.start()
    assert await scene.ask(b, "slow question two", "100.2") == 200
    await scene.until(lambda: "slow question two" in scene.requests, 20)
    b.kill()
    await scene.until(lambda: scene.shown("100.2") == ["answer to slow question two"],
                      TAKEOVER_SECONDS)  # fmt: skip
    await asyncio.sleep(1)  # nothing more arrives: each answered once, in its placeholder
    assert scene.shown("100.1") == ["answer to slow question one"]
    assert scene.shown("100.2") == ["answer to slow question two"]
    assert await scene.stored("100.1") == ["slow question one", "answer to slow question one"]
    assert await scene.stored("100.2") == ["slow question two", "answer to slow question two"]


async def test_redis_killed_mid_turn_is_said_then_answered_when_back(scene):
    a = await scene.bot()
    assert await scene.ask(a, "slow question during an outage", "200.1") == 200
    await scene.until(lambda: "slow question during an outage" in scene.requests, 20)
    # the appendonly file is synced every second; a busy disk postpones its write up to 2 s
    await asyncio.sleep(2.5)
    pid = int(scene.redis.pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    await scene.until(lambda: scene.shown("200.1") == [MEMORY_DOWN], 20)
    # a message while memory is down: refused (503) so Slack redelivers, and the person told
    assert await scene.ask(a, "question while down", "200.2") >= 500
    scene.redis.ensure_running()
    await scene.until(
        lambda: scene.shown("200.1") == ["answer to slow question during an outage"],
        TAKEOVER_SECONDS,
    )
    assert await scene.ask(a, "question while down", "200.2") == 200  # Slack's redelivery
    await scene.until(lambda: scene.shown("200.2")[-1:] == ["answer to question while down"], 20)
    assert await scene.stored("200.1") == [
        "slow question during an outage", "answer to slow question during an outage",
    ]  # fmt: skip


async def test_a_failing_a_rate_limited_and_a_hanging_model_and_poison_input_get_replies(scene):
    a = await scene.bot(ARXIVSCOUT_LLM_TIMEOUT="2")
    questions = {
        "300.1": "this one fails",
        "300.2": "this one hangs",
        "300.3": "a lone surrogate \ud800 here",
        "300.9": "this one is rate limited",
        **{f"300.{i}": f"plain question {i}" for i in range(4, 9)},
    }
    statuses = await asyncio.gather(*(scene.ask(a, q, root) for root, q in questions.items()))
    assert set(statuses) == {200}

    def settled() -> bool:
        return all(len(scene.shown(root)) == 1 and "Thinking" not in scene.shown(root)[0]
                   for root in questions)  # fmt: skip

    await scene.until(settled, 60)
    assert "language model" in scene.shown("300.1")[0]
    assert "language model" in scene.shown("300.2")[0]
    assert "language model" in scene.shown("300.9")[0]
    assert scene.shown("300.3")[0].startswith("answer to a lone surrogate")
    for i in range(4, 9):
        assert scene.shown(f"300.{i}") == [f"answer to plain question {i}"]


async def test_a_stopped_bot_finishes_its_turn_before_it_exits(scene):
    """SIGTERM (a deploy, a scale-down): a turn that finishes within the grace period is
    answered by the stopping process, once; what would not finish is handed back
    (tests/test_turn_recovery.py covers that in-process, without a 25 s wait)."""
    a, b = await scene.bot(), await scene.bot()
    assert await scene.ask(a, "slow question at a deploy", "400.1") == 200
    await scene.until(lambda: "slow question at a deploy" in scene.requests, 20)
    assert await a.stop() == 0
    await scene.until(lambda: scene.shown("400.1") == ["answer to slow question at a deploy"], 20)
    assert await scene.stored("400.1") == [
        "slow question at a deploy", "answer to slow question at a deploy",
    ]  # fmt: skip
    assert b.process.returncode is None
