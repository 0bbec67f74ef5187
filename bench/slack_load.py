"""Slack under load: 500 events over 100 threads, 20 % delivered twice as Slack retries.

The bot is two app instances sharing one Redis, in this process. Everything outside the bot
runs in a second process, as it would in production: the scripted model (`--delay` s per
reply), the Slack Web API (a recording server), and "Slack" itself, which sends every event as
a signed HTTP request (a retry lands on the other instance). Reports whether every event was
answered exactly once and in order per thread, the wall time, and events per second.
Target: all of it, within 10 s of wall time.

With `--faults`, the two instances are `arxivscout slack` processes, and the run is made twice:
once clean, once with one instance SIGKILLed at a random moment and Redis restarted once
mid-run; "Slack" redelivers what was refused or unanswered (503, connection refused), as it
does. Target: every event answered exactly once (0 lost, 0 duplicated), all within 30 s of the
last fault.

Usage: python bench/slack_load.py [--events 500] [--threads 100] [--retries 0.2] [--delay 1.0]
                                  [--faults] [--seed 1]
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
from bench.common import free_port, temporary_redis
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


# -- with faults: the bot as two processes ------------------------------------------------


async def slack_delivers(session, urls, root_event, retry_of: int = 0) -> int:
    """One event as Slack delivers it: refused or unanswered deliveries are retried (Slack
    waits a minute; here 0.5-4 s), alternating instances. The number of deliveries made."""
    _, _, event_id, event = root_event
    for attempt in range(8):
        sender = SlackSender(urls[(retry_of + attempt) % 2], SECRET, session)
        try:
            reply = await asyncio.wait_for(
                sender.event(event, team=TEAM, event_id=event_id, retry=retry_of + attempt), 3
            )
            if reply.status == 200:
                return attempt + 1
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(min(4.0, 0.5 * 2**attempt))
    raise RuntimeError(f"event {event_id} was never acknowledged")


async def faulty_run(args: argparse.Namespace, faults: bool) -> dict:
    from memory.redis_server import EmbeddedRedis
    from tests.support.bot_process import BotProcess, bot_env

    rng = random.Random(args.seed)
    server = ScriptedOpenAI(responder=model(args.delay))
    await server.start()
    api = MockSlackApi(team_id=TEAM)
    await api.start()
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis", preferred_port=free_port(),
                              server_binary=settings.redis_server, modules=settings.redis_modules)  # fmt: skip
        env = bot_env(redis.ensure_running(), server.base_url, api.base_url, Path(tmp), SECRET)
        bots = [BotProcess(env, free_port(), Path(tmp) / f"bot{i}.log") for i in range(2)]
        await asyncio.gather(*(bot.start() for bot in bots))
        urls = [bot.url for bot in bots]
        events, retried, roots = plan(args.events, args.threads, args.retries)
        expected = {
            root: [f"answer to {q}" for r, q, _, _ in events if r == root] for root in roots
        }
        started = time.perf_counter()
        fault_times: list[float] = []

        async def inject() -> None:
            kill_at, restart_at = rng.uniform(0.5, 4.0), rng.uniform(1.0, 5.0)
            for at, what in sorted([(kill_at, "kill"), (restart_at, "redis")]):
                await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
                if what == "kill":
                    bots[rng.randrange(2)].kill()
                else:
                    redis.stop()
                    redis.ensure_running()
                fault_times.append(time.perf_counter() - started)
                print(f"  fault at {fault_times[-1]:.2f} s: {what}", flush=True)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            injector = asyncio.create_task(inject()) if faults else None
            deliveries = 0
            per_round = len(events) // (args.events // args.threads)
            for n in range(0, len(events), per_round):
                batch = range(n, n + per_round)
                made = await asyncio.gather(
                    *(slack_delivers(session, urls, events[i], i % 2) for i in batch),
                    *(slack_delivers(session, urls, events[i], 1 + i % 2) for i in batch if i in retried),
                )  # fmt: skip
                deliveries += sum(made)
            if injector:
                await injector

            def answered() -> dict[str, list[str]]:
                return {r: [t for t in api.thread_texts("C1", r) if t.startswith("answer to")]
                        for r in roots}  # fmt: skip

            deadline = time.perf_counter() + 120
            while answered() != expected and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)
            wall = time.perf_counter() - started
        got = answered()
        for bot in bots:
            await bot.stop()
        redis.stop()
    await api.close()
    await server.close()
    lost = sum(len(set(expected[r]) - set(got[r])) for r in roots)
    duplicated = sum(len(got[r]) - len(set(got[r])) for r in roots)
    in_order = all(got[r] == expected[r] for r in roots)
    return {"wall": wall, "lost": lost, "duplicated": duplicated, "in_order": in_order,
            "deliveries": deliveries, "events": len(events), "faults": fault_times}  # fmt: skip


async def faults_main(args: argparse.Namespace) -> int:
    ok = True
    for faults in (False, True):
        print(f"{'with faults' if faults else 'without faults'}:", flush=True)
        r = await faulty_run(args, faults)
        since = r["wall"] - max(r["faults"]) if r["faults"] else r["wall"]
        print(f"  {r['events']} events, {r['deliveries']} deliveries (Slack's retries included)")
        print(f"  lost {r['lost']}, duplicated {r['duplicated']}, in order per thread: "
              f"{'yes' if r['in_order'] else 'NO'}")  # fmt: skip
        print(f"  wall time {r['wall']:.2f} s" + (
            f"; last answer {since:.2f} s after the last fault (target: at most 30 s)"
            if faults else ""))  # fmt: skip
        ok = ok and r["lost"] == 0 and r["duplicated"] == 0 and (not faults or since <= 30)
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--retries", type=float, default=0.2)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument(
        "--faults", action="store_true", help="bot processes; a clean and a faulty run"
    )
    parser.add_argument("--seed", type=int, default=1, help="when the faults strike")
    parser.add_argument("--outside", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.outside:
        asyncio.run(outside_world(arguments))
    elif arguments.faults:
        sys.exit(asyncio.run(faults_main(arguments)))
    else:
        sys.exit(asyncio.run(main(arguments)))
