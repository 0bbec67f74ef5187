"""Background indexing of messages for episodic recall: messages per second on this machine.

Starts a throwaway embedded Redis, stores real conversation turns (LoCoMo's development split,
read from the shared folder) as messages of many threads, queues their indexing exactly as a
turn does (`Upkeep.after_messages`: one durable task per turn, two messages each), and times how
long the background work (a Redis stream read by `BackgroundWork`, MiniLM embeddings, RedisVL
writes) takes to drain. Also reports how long a message takes to become searchable when
messages arrive one at a time (the steady state).

Usage: python bench/episodic_indexing.py [--messages 3000] [--data locomo.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import SHARED, temporary_redis  # noqa: E402

from app.locomo import load  # noqa: E402
from bot.background import BackgroundWork  # noqa: E402
from bot.consolidation import Consolidator  # noqa: E402
from bot.upkeep import Upkeep  # noqa: E402
from memory.connection import connect  # noqa: E402
from memory.context import ContextLimits  # noqa: E402
from memory.embeddings import CachedEmbedder, LocalEmbedder  # noqa: E402
from memory.keys import task_stream  # noqa: E402
from memory.manager import MemoryManager  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.tasks import TaskStream  # noqa: E402

TARGET = 150.0  # messages per second
QUESTION_EVERY = 0.1  # seconds between the foreground questions timed while indexing runs
LOCOMO = SHARED / "benchmarks" / "locomo" / "locomo-dev.json"


async def redis_cpu(client) -> float:
    """Seconds of CPU the Redis server has used (user + system, all its threads)."""
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def thread_cpu() -> dict[str, float]:
    """CPU seconds by thread kind (Linux): the event loop, the background lane's runners, the
    default executor's (the foreground lane, and the background lane's waits) and the rest."""
    ticks = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = names.get(int(task.name), "other (onnx, redis, ...)")
            kind = name.rstrip("_0123456789").split("-")[0] if name != "MainThread" else "loop"
            out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


async def question_latencies(memory, tag: str, count: int) -> list[float]:
    """Seconds a question's embedding takes (the foreground lane, uncached), one every
    QUESTION_EVERY: what a turn would wait while indexing runs (cancelled to stop, keeping
    what it measured in `found`)."""
    found: list[float] = []
    try:
        for i in range(count):
            started = time.perf_counter()
            await memory.embedder.embed([f"what did {tag} person {i} say about the assay?"])
            found.append(time.perf_counter() - started)
            await asyncio.sleep(QUESTION_EVERY)
    except asyncio.CancelledError:
        pass
    return found


def _ms(seconds: list[float], percentile: float) -> str:
    if not seconds:
        return "-"
    ordered = sorted(seconds)
    return f"{ordered[min(len(ordered) - 1, int(len(ordered) * percentile / 100))] * 1000:.0f} ms"


async def run(args: argparse.Namespace, url: str) -> None:
    client = await connect(url)
    memory = await MemoryManager(client, CachedEmbedder(LocalEmbedder(), client)).open()
    background = BackgroundWork(TaskStream(client, task_stream()))
    upkeep = Upkeep(memory, Consolidator(memory, None), background, ContextLimits(10**9))
    background.handle(upkeep.handlers())
    texts = [t for c in load(args.data) for t in c.turns][: args.messages]
    await memory.embedder.embed(["warm-up"])  # load the model outside the timing
    stored = []
    for i, turn in enumerate(texts):
        scope = Scope("bench", f"bench:{i // 50}", "C1", user=turn.speaker, user_name=turn.speaker)
        stored.append((scope, await memory.conversation.append(scope, "user", turn.content)))
    idle = await question_latencies(memory, "idle", 20)
    cpu_before, own_before = await redis_cpu(client), time.process_time()
    threads_before = thread_cpu()
    started = time.perf_counter()
    busy = asyncio.create_task(question_latencies(memory, "busy", 10**6))
    for i in range(0, len(stored), 2):  # a turn: a question and its answer
        scope = stored[i][0]
        await upkeep.after_messages(scope, [m for _, m in stored[i : i + 2]], 0)
    queued = time.perf_counter() - started
    await background.drain()
    seconds = time.perf_counter() - started
    busy.cancel()
    during = await asyncio.gather(busy, return_exceptions=True)
    rate = len(stored) / seconds
    redis_seconds = await redis_cpu(client) - cpu_before
    own_seconds = time.process_time() - own_before
    threads_after = thread_cpu()
    print(f"{len(stored)} messages queued in {queued:.2f} s, indexed in {seconds:.2f} s: "
          f"{rate:.0f} messages/s (target >= {TARGET:.0f}: {'MET' if rate >= TARGET else 'MISSED'})")  # fmt: skip
    per = 1000 / len(stored)
    print(f"  CPU per message: this process {own_seconds * per:.2f} ms (embedding, event loop), "
          f"Redis {redis_seconds * per:.2f} ms (writes, HNSW inserts); {os.cpu_count()} cores "
          f"allow at most {len(stored) * (os.cpu_count() or 1) / (own_seconds + redis_seconds):.0f} "
          "messages/s at this CPU cost")  # fmt: skip

    split = {k: v - threads_before.get(k, 0.0) for k, v in threads_after.items()}
    print("  this process's CPU per message by thread: " + ", ".join(
        f"{kind} {seconds * per:.2f} ms" for kind, seconds in sorted(split.items()) if seconds
    ))  # fmt: skip
    loaded = during[0] if isinstance(during[0], list) else []
    print(f"  a question's embedding (foreground lane): idle p50 {_ms(idle, 50)}, p90 "
          f"{_ms(idle, 90)}; while indexing p50 {_ms(loaded, 50)}, p90 {_ms(loaded, 90)}, "
          f"max {_ms(loaded, 100)} ({len(loaded)} questions)")  # fmt: skip

    delays = []  # steady state: one turn at a time, time until its answer is searchable
    for i in range(args.steady):
        scope = Scope("bench", "bench:steady", "C1", user="U1", user_name="Ada")
        word = f"zebrafish{i}"
        message = await memory.conversation.append(scope, "user", f"the {word} assay failed")
        started = time.perf_counter()
        await upkeep.after_messages(scope, [message], 0)
        vector = (await memory.embedder.embed([word]))[0]
        while not await memory.episodes.search(scope, word, vector, k=1):
            await asyncio.sleep(0.01)
        delays.append(time.perf_counter() - started)
        await asyncio.sleep(0.2)
    delays.sort()
    print(f"steady state, {len(delays)} turns one at a time: searchable after p50 "
          f"{statistics.median(delays) * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms "
          f"(target <= 2 s)")  # fmt: skip
    await background.close()
    await memory.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--steady", type=int, default=20)
    parser.add_argument("--data", type=Path, default=LOCOMO)
    args = parser.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"No LoCoMo file at {args.data}: pass --data.")
    with temporary_redis() as url:
        asyncio.run(run(args, url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
