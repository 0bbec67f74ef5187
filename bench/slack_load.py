"""Slack under load: 500 events over 100 threads, 20 % delivered twice as Slack retries.

The bot is two app instances sharing one Redis, in this process. Everything outside the bot
runs in a second process, as it would in production: the scripted model (`--delay` s per
reply), the Slack Web API (a recording server), and "Slack" itself, which sends every event as
a signed HTTP request (a retry lands on the other instance). Reports whether every event was
answered exactly once and in order per thread, the wall time, and events per second.
Target: all of it, within 10 s of wall time.

Usage: python bench/slack_load.py [--events 500] [--threads 100] [--retries 0.2] [--delay 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.slack import SlackAdapter
from adapters.web import build_web_app
from app.runtime import open_agent
from app.settings import Settings
from bench.common import temporary_redis
from bot.harness import ENTITY_INSTRUCTIONS
from tests.support.scripted_openai import ScriptedOpenAI, text
from tests.support.slack_api import MockSlackApi, SlackSender, mention

SECRET = "bench-secret"
TEAM = "TBENCH"


# -- the outside world (second process) ------------------------------------------------------


def model(delay: float):
    async def respond(body: dict):
        messages = body["messages"]
        if messages[0]["content"] == ENTITY_INSTRUCTIONS:
            return text("[]")
        question = messages[1]["content"].split("\n")[1]
        await asyncio.sleep(delay)
        return text(f"answer to {question}")

    return respond


def plan(events: int, threads: int, retries: float) -> tuple[list[tuple], set[int], list[str]]:
    """(thread root, question, event id, event) in each thread's order, which are retried, roots."""
    per_thread = events // threads
    roots = [f"1700000000.{i:06d}" for i in range(threads)]
    planned = []
    for n in range(per_thread):
        for t, root in enumerate(roots):
            question = f"thread {t} question {n}"
            ts = f"1700000{n + 1:03d}.{t:06d}"
            event = mention(question, ts if n else root, thread_ts=root if n else None)
            planned.append((root, question, f"Ev{t}-{n}", event))
    retried = set(random.Random(7).sample(range(len(planned)), int(len(planned) * retries)))
    return planned, retried, roots


async def send_all(urls: list[str], events: list, retried: set[int], rounds: int) -> list[int]:
    """Like Slack: requests in flight together; a thread's next event after its previous one."""
    statuses: list[int] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        senders = [SlackSender(url, SECRET, session) for url in urls]

        async def deliver(i: int) -> None:
            _, _, event_id, event = events[i]
            statuses.append(
                (await senders[i % 2].event(event, team=TEAM, event_id=event_id)).status
            )
            if i in retried:  # Slack's retry of the same event, landing on the other instance
                retry = await senders[(i + 1) % 2].event(
                    event, team=TEAM, event_id=event_id, retry=1
                )
                statuses.append(retry.status)

        per_round = len(events) // rounds
        for n in range(rounds):
            await asyncio.gather(*(deliver(i) for i in range(n * per_round, (n + 1) * per_round)))
    return statuses


async def outside_world(args: argparse.Namespace) -> None:
    """Serve the model and the Web API, send the events when told, report what Slack saw."""
    server = ScriptedOpenAI(responder=model(args.delay))
    await server.start()
    api = MockSlackApi(team_id=TEAM)
    await api.start()
    print(json.dumps({"model": server.base_url, "slack_api": api.base_url}), flush=True)
    events, retried, roots = plan(args.events, args.threads, args.retries)
    loop = asyncio.get_running_loop()
    urls = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    started = time.perf_counter()
    statuses = await send_all(urls, events, retried, args.events // args.threads)
    print(json.dumps({"acked": time.perf_counter() - started, "statuses": statuses}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # the bot is idle
    answers = {root: api.thread_texts("C1", root) for root in roots}
    print(json.dumps({"answers": answers}), flush=True)
    await api.close()
    await server.close()


# -- the bot (this process) ---------------------------------------------------------------


async def read_json(process: asyncio.subprocess.Process) -> dict:
    return json.loads(await process.stdout.readline())


async def main(args: argparse.Namespace) -> int:
    world = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--outside", *sys.argv[1:],
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    peers = await read_json(world)
    with temporary_redis() as redis_url, tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(redis_url=redis_url, data_dir=Path(data_dir), openai_api_key="k",
                            openai_base_url=peers["model"])  # fmt: skip
        runtime = await open_agent(settings)
        await runtime.memory.embedder.embed(["warm up the embedding model"])
        handler = runtime.turns()
        adapters, runners, urls = [], [], []
        for _ in range(2):
            adapter = SlackAdapter(handler, "xoxb-bench", SECRET, peers["slack_api"])
            await adapter.check_token()
            runner = web.AppRunner(build_web_app(runtime.memory, adapter.app))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            adapters.append(adapter)
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/slack/events")

        started = time.perf_counter()
        world.stdin.write((json.dumps(urls) + "\n").encode())
        sent = await read_json(world)
        for _ in range(3):
            for adapter in adapters:
                await adapter.wait_idle()
        wall = time.perf_counter() - started
        world.stdin.write(b"report\n")
        answers = (await read_json(world))["answers"]
        await world.wait()

        events, retried, roots = plan(args.events, args.threads, args.retries)
        ok = True
        for root in roots:
            want = [f"answer to {q}" for r, q, _, _ in events if r == root]
            if answers[root] != want:
                ok = False
                print(
                    f"thread {root}: expected {len(want)} answers in order, got {answers[root][:6]}"
                )
        per_thread = args.events // args.threads
        statuses = sent["statuses"]
        print(f"events: {len(events)} over {args.threads} threads, plus {len(retried)} retries "
              f"({len(statuses)} requests, all HTTP 200: {set(statuses) == {200}})")  # fmt: skip
        print(f"model: {args.delay:.1f} s per reply; two app instances sharing one Redis")
        print(f"answered exactly once and in order per thread: {'yes' if ok else 'NO'} "
              f"({sum(map(len, answers.values()))} answers for {len(events)} events)")  # fmt: skip
        print(f"all requests acknowledged after {sent['acked']:.2f} s")
        print(f"wall time: {wall:.2f} s (target: at most 10 s); {len(events) / wall:.1f} events/s")
        print(f"lower bound from the model alone: {per_thread * args.delay:.1f} s "
              f"({per_thread} turns per thread, one at a time)")  # fmt: skip

        for runner, adapter in zip(runners, adapters, strict=True):
            await runner.cleanup()
            await adapter.close()
        await runtime.close()
        return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--retries", type=float, default=0.2)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--outside", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.outside:
        asyncio.run(outside_world(arguments))
    else:
        sys.exit(asyncio.run(main(arguments)))
