"""Many threads at once: N concurrent turns (one per thread) against a model taking 1 s per reply.

Starts a throwaway embedded Redis and an in-process scripted OpenAI-compatible server whose every
agent-loop reply takes `--delay` seconds (`await asyncio.sleep`), builds the real agent with
`app.runtime.open_agent`, fills the tenant's knowledge base with real unarXive papers, then
launches N turns together with `asyncio.gather` (distinct threads, distinct questions, so every
question embedding is a real MiniLM pass) and reports wall time, turns/s and per-turn latency.

Variants (clearly labelled in the output):
  text: the model answers with text at once after the delay: 1 model call per turn.
        Target: all N done within 2.5 s wall (delay 1 s).
  tool: the model first asks for `search_knowledge_base`, then answers: 2 model calls per turn
        (2 x delay of pure model time) plus one real tool run.

Where the time goes is shown per phase (harness.before, model calls, tool run, after), with
when the model server saw each turn's first request (after the harness's `before` phase).
Entity extraction (the harness's own background call) is answered at once and not counted.

The app's Redis pool (memory.connection.connect: max_connections=64, non-blocking) is used as
is by default; `--redis-pool blocking|unbounded` swaps it on the live client for a what-if.

Usage: python bench/concurrent_threads.py [--turns 200] [--delay 1.0] [--variant both]
                                          [--redis-pool app] [--papers 10]
                                          [--sample path/to/unarXive.tar.gz]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import random
import sys
import time
import traceback
from itertools import product
from typing import Any

from common import sample_path
from harness_overhead import (
    ANSWER,
    CURRENT,
    TEMPLATES,
    TENANT,
    TOPICS,
    add_world_args,
    bench_world,
    fill_knowledge_base,
    instrument,
    ms,
    pct,
    run_in_world,
    timed_turn,
)
from model_server import TOOL_MARKER, start_model_process, stop_model_process
from redis.asyncio import BlockingConnectionPool

from memory.scope import Scope
from tests.support.scripted_openai import call, text, tool_calls

TARGET_WALL_S = 2.5


def distinct_questions(n: int, offset: int, seed: int = 7) -> list[str]:
    combos = [t.format(t=topic) for topic, t in product(TOPICS, TEMPLATES)]
    random.Random(seed).shuffle(combos)
    out = combos[offset : offset + n]
    k = 0
    while len(out) < n:  # more turns than combinations: make the rest distinct too
        out.append(f"{combos[k % len(combos)]} (follow-up {k // len(combos) + 1})")
        k += 1
    return out


class Model:
    """The scripted model's behaviour: sleep `delay`, then answer (or first ask for a tool)."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.use_tool = False
        self.t0 = 0.0
        self.arrivals: list[float] = []  # first agent-loop request of each turn, from t0
        self.in_flight = 0
        self.max_in_flight = 0

    async def respond(self, body: dict[str, Any]):
        messages = body.get("messages") or []
        first = not any(m.get("role") == "tool" for m in messages)
        if first:
            self.arrivals.append(time.perf_counter() - self.t0)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if self.use_tool and first:
            question = messages[1]["content"].split("\n")[1] if len(messages) > 1 else "memory"
            return tool_calls(call("search_knowledge_base", {"query": f"passages: {question}"}))
        return text(ANSWER)


async def one_variant(runtime, model: Model, label: str, questions: list[str],
                      delay: float, use_tool: bool, tag: str, profile: bool,
                      profile_out: str | None = None) -> None:  # fmt: skip
    model.delay, model.use_tool = delay, use_tool
    model.arrivals.clear()
    model.max_in_flight = 0
    probe = instrument(runtime)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    model.t0 = time.perf_counter()
    cpu0 = (time.thread_time(), time.process_time())
    try:
        outcomes = await asyncio.gather(
            *(timed_turn(runtime, f"{tag}-{i:04d}", q) for i, q in enumerate(questions)),
            return_exceptions=True,
        )
        wall = time.perf_counter() - model.t0
        loop_cpu, bot_cpu = (
            b - a for a, b in zip(cpu0, (time.thread_time(), time.process_time()), strict=False)
        )
    finally:
        if profiler is not None:
            profiler.disable()
        probe.restore()
    await runtime.harness.drain()

    records = [o for o in outcomes if isinstance(o, dict)]
    errors = collections.Counter(
        f"{type(o).__name__}: {o}"[:160] for o in outcomes if isinstance(o, BaseException)
    )
    calls = 2 if use_tool else 1
    n = len(questions)
    print(f"\n== variant {label}: {n} concurrent turns, {calls} model call(s) per turn, "
          f"{delay:g} s per model reply ==")  # fmt: skip
    target = f"target <= {TARGET_WALL_S} s" if not use_tool else (
        f"no target given; model time alone is {calls * delay:g} s, "
        f"+{TARGET_WALL_S - delay:g} s slack as in variant text = {calls * delay + TARGET_WALL_S - delay:g} s")  # fmt: skip
    limit = TARGET_WALL_S if not use_tool else calls * delay + TARGET_WALL_S - delay
    verdict = "MET" if wall <= limit and not errors else "MISSED"
    print(f"  wall time            {wall:8.3f} s     {target}: {verdict}")
    print(f"  turns per second     {len(records) / wall:8.1f}")
    print(f"  CPU during the turns {bot_cpu:8.2f} s in the bot's process, of which the event "
          f"loop {loop_cpu:.2f} s (the rest: embedding threads); {os.cpu_count()} cores")  # fmt: skip
    if errors:
        print(f"  FAILED turns         {sum(errors.values())} of {n}:")
        for message, count in errors.most_common(5):
            print(f"    {count} x {message}")
        print("  raised from (last 4 project frames, outer > inner; count):")
        for where, count in failure_sites(outcomes).most_common(4):
            print(f"    {count} x {where}")
    if not records:
        return
    finals = sum(r["_final"] for r in records)
    print(f"  completed            {len(records)} ({finals:.0f} with a final answer)")
    latency = [r["turn"] for r in records]
    print(f"  per-turn latency     p50 {ms(pct(latency, 50))}  p95 {ms(pct(latency, 95))}  "
          f"max {ms(max(latency))}")  # fmt: skip
    if model.arrivals:
        arr = model.arrivals
        print(f"  model saw 1st request of a turn at t+  p50 {ms(pct(arr, 50))}  "
              f"p95 {ms(pct(arr, 95))}  max {ms(max(arr))}")  # fmt: skip
    if model.max_in_flight:
        print(f"  max model requests in flight at once: {model.max_in_flight}")
    print("  per-turn phases (concurrent, so they include waiting for the event loop,")
    print("  the shared MiniLM batcher and the Redis connection pool):")
    for name in ("harness.before", "    question embedding", "      MiniLM pass (cache miss)",
                 "    read knowledge_base.search (concurrent)", "  select_tools",
                 "model (LLMClient.chat)", "harness.run_tool", "harness.after"):  # fmt: skip
        values = [r.get(name, 0.0) for r in records if r.get(name + " #")]
        if values:
            print(f"    {name.strip():42s} p50 {ms(pct(values, 50))}  p95 {ms(pct(values, 95))}"
                  f"  max {ms(max(values))}")  # fmt: skip
    model_time = [r["model (LLMClient.chat)"] for r in records]
    overhead = [t - m for t, m in zip(latency, model_time, strict=True)]
    print(f"    {'turn - model time':42s} p50 {ms(pct(overhead, 50))}  "
          f"p95 {ms(pct(overhead, 95))}  max {ms(max(overhead))}")  # fmt: skip
    if profiler is not None:
        print_profile(profiler, wall)
        if profile_out:
            profiler.dump_stats(f"{profile_out}.{tag}")
            print(f"  profile written to {profile_out}.{tag} (python -m pstats)")


def print_profile(profiler: cProfile.Profile, wall: float) -> None:
    """Event-loop thread CPU during the gather, grouped by where it is spent."""
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # tottime over all functions
    print(f"  event-loop thread (cProfile, main thread only): {total:.2f} s of own time "
          f"in {wall:.2f} s wall")  # fmt: skip
    groups: collections.Counter = collections.Counter()
    for (filename, _line, name), row in stats.stats.items():
        groups[_group(filename, name)] += row[2]
    for group, seconds in groups.most_common(14):
        print(f"    {group:58s} {seconds:6.2f} s  {seconds / total:6.1%}")
    print("  top functions by own time (main thread):")
    for (filename, line, name), row in sorted(
        stats.stats.items(), key=lambda kv: kv[1][2], reverse=True
    )[:20]:
        print(f"    {row[2]:6.2f} s own  {row[0]:7d} calls  {_short(filename)}:{line} {name}")
    print("  top functions by cumulative time (main thread):")
    cumulative = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)
    shown = 0
    for (filename, line, name), row in cumulative:
        where = _short(filename)
        if not any(k in where for k in ("bot/", "memory/", "redisvl", "tiktoken", "openai")):
            continue
        print(f"    {row[3]:6.2f} s cum  {row[2]:6.2f} s own  {where}:{line} {name}")
        shown += 1
        if shown >= 25:
            break


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/main/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if "/lib/python3." in filename:
        return "stdlib/" + filename.split("/lib/python3.", 1)[1].split("/", 1)[1]
    return filename


def _group(filename: str, name: str) -> str:
    short = _short(filename)
    if short.startswith(("bot/", "memory/")):
        return short.split(".py")[0]
    if filename.startswith("~") or filename == "~":
        return f"builtins ({name[:40]})"
    parts = short.split("/")
    return "/".join(parts[:2]) if parts[0] == "stdlib" else parts[0]


def failure_sites(outcomes: list[Any]) -> collections.Counter:
    """For each failed turn, the chain of project frames (bot/, memory/) it was raised through."""
    sites: collections.Counter = collections.Counter()
    for outcome in outcomes:
        if not isinstance(outcome, BaseException):
            continue
        frames = [
            f"{f.filename.split('/main/')[-1]}:{f.lineno} {f.name}"
            for f in traceback.extract_tb(outcome.__traceback__)
            if "/bot/" in f.filename or "/memory/" in f.filename
        ]
        sites[" > ".join(frames[-4:]) or "(no project frame)"] += 1
    return sites


def configure_pool(runtime, mode: str) -> str:
    """`app`: the pool memory.connection.connect built; the others are bench-only what-ifs."""
    client = runtime.memory.redis
    pool = client.connection_pool
    if mode == "unbounded":
        pool.max_connections = 100_000
    elif mode == "blocking":
        client.connection_pool = BlockingConnectionPool(
            connection_class=pool.connection_class, max_connections=pool.max_connections,
            timeout=30, **pool.connection_kwargs,
        )  # fmt: skip
    pool = client.connection_pool
    return f"{type(pool).__name__}(max_connections={pool.max_connections}) [--redis-pool {mode}]"


async def run(args: argparse.Namespace, redis_url: str) -> None:
    model = Model()
    process, model_url = (
        (await start_model_process(args.delay)) if args.model_process else (None, None)
    )
    if process is not None:
        print(f"model: a separate process at {model_url} ({args.delay:g} s per reply)")
    try:
        await run_with_model(args, redis_url, model, model_url)
    finally:
        if process is not None:
            await stop_model_process(process)


async def run_with_model(
    args: argparse.Namespace, redis_url: str, model: Model, model_url: str | None
) -> None:
    async with bench_world(redis_url, model.respond, model_url=model_url) as (runtime, _server):
        started = time.perf_counter()
        chunks = await fill_knowledge_base(runtime, sample_path(args.sample), args.papers)
        print(f"knowledge base: {chunks} chunks from {args.papers} unarXive papers "
              f"(embedded in {time.perf_counter() - started:.1f} s incl. model load)")  # fmt: skip
        print(f"redis pool: {configure_pool(runtime, args.redis_pool)}; "
              f"openai/httpx pool: {describe_http_pool(runtime)}")  # fmt: skip
        for i in range(args.warmup):  # MiniLM, tiktoken, connections (not measured)
            await runtime.agent.run_turn(Scope(TENANT, "warmup"), f"Warm-up question number {i}?")
        await runtime.harness.drain()
        if args.warm_pool:  # steady state of a busy bot: Redis and HTTP pools already open
            model.delay, model.use_tool = 0.0, False
            warm = distinct_questions(args.turns, 0, seed=99)
            outcomes = await asyncio.gather(
                *(runtime.agent.run_turn(Scope(TENANT, f"warm-{i}"), f"{q} (warm-up)")
                  for i, q in enumerate(warm)),
                return_exceptions=True,
            )  # fmt: skip
            await runtime.harness.drain()
            failed = sum(isinstance(o, BaseException) for o in outcomes)
            print(f"pools warmed by {len(warm)} concurrent zero-delay turns ({failed} failed); "
                  f"redis connections open: {len(runtime.memory.redis.connection_pool._available_connections)}")  # fmt: skip
        CURRENT.set(None)

        offset = 0
        for variant in ("text", "tool"):
            if args.variant not in (variant, "both"):
                continue
            questions = distinct_questions(args.turns, offset)
            offset += args.turns
            if (
                model_url and variant == "tool"
            ):  # the separate model reads its cue from the question
                questions = [TOOL_MARKER + q for q in questions]
            await one_variant(runtime, model, variant, questions, args.delay,
                              variant == "tool", variant, args.profile or bool(args.profile_out),
                              args.profile_out)  # fmt: skip


def describe_http_pool(runtime) -> str:
    """The SDK's HTTP transport as built by bot.llm (httpx-style limits, or aiohttp)."""
    inner = getattr(runtime.llm._client, "_client", None)
    kind = type(inner).__name__
    limits = getattr(inner, "_limits", None)
    if limits is not None:
        return f"{kind} max_connections={limits.max_connections}"
    connector = getattr(getattr(inner, "_client", None), "connector", None)
    limit = getattr(connector, "limit", None)
    return f"{kind}" + (f" (aiohttp connector limit={limit})" if limit is not None else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds per model reply")
    parser.add_argument("--variant", choices=("text", "tool", "both"), default="both")
    parser.add_argument(
        "--redis-pool", choices=("app", "blocking", "unbounded"), default="app",
        help="app: the pool the app builds (blocking, 128 connections); blocking: a fresh "
        "blocking pool of the same size; unbounded: no limit (what-ifs, bench-only)",
    )  # fmt: skip
    parser.add_argument("--warm-pool", action="store_true",
                        help="first run N concurrent zero-delay turns so the pools are open")  # fmt: skip
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the event-loop thread during the gather, print hot spots")  # fmt: skip
    parser.add_argument("--profile-out", help="also dump the cProfile stats to PATH.<variant>")
    parser.add_argument("--model-process", action="store_true",
                        help="serve the scripted model from its own process, as a remote model")  # fmt: skip
    add_world_args(parser)
    return run_in_world(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
