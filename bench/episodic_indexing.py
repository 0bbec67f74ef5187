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
import os
import statistics
import sys
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
LOCOMO = SHARED / "benchmarks" / "locomo" / "locomo-dev.json"


async def redis_cpu(client) -> float:
    """Seconds of CPU the Redis server has used (user + system, all its threads)."""
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


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
    cpu_before, own_before = await redis_cpu(client), time.process_time()
    started = time.perf_counter()
    for i in range(0, len(stored), 2):  # a turn: a question and its answer
        scope = stored[i][0]
        await upkeep.after_messages(scope, [m for _, m in stored[i : i + 2]], 0)
    queued = time.perf_counter() - started
    await background.drain()
    seconds = time.perf_counter() - started
    rate = len(stored) / seconds
    redis_seconds = await redis_cpu(client) - cpu_before
    own_seconds = time.process_time() - own_before
    print(f"{len(stored)} messages queued in {queued:.2f} s, indexed in {seconds:.2f} s: "
          f"{rate:.0f} messages/s (target >= {TARGET:.0f}: {'MET' if rate >= TARGET else 'MISSED'})")  # fmt: skip
    per = 1000 / len(stored)
    print(f"  CPU per message: this process {own_seconds * per:.2f} ms (embedding, event loop), "
          f"Redis {redis_seconds * per:.2f} ms (writes, HNSW inserts); {os.cpu_count()} cores "
          f"allow at most {len(stored) * (os.cpu_count() or 1) / (own_seconds + redis_seconds):.0f} "
          "messages/s at this CPU cost")  # fmt: skip

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
