"""A topic watch's digest over 500 candidate papers: the time from arXiv's replies being in hand
to the message posted, arXiv's own delays left out.

Starts a throwaway embedded Redis, a local replayed arXiv serving 500 generated new papers per
run (new texts each run: no embedding is cached from the run before) and a mock Slack Web API;
the team's knowledge base holds 50 saved papers. Each run fetches the candidates from the
replay (timed apart, with ARXIV_DELAY_SECONDS at 0), then times what the digest task does with
them: drop the known and the already posted, embed every candidate with the topic and the saved
papers in one call, rank, record "posting", post the Block Kit message with its Save buttons,
record the period. The local MiniLM is loaded before the first run (a running bot has it).

Usage: python bench/digest.py [--runs 5] [--candidates 500] [--saved 50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import temporary_redis  # noqa: E402
from slack_sdk.web.async_client import AsyncWebClient  # noqa: E402

from adapters.slack_watch import SlackWatches  # noqa: E402
from bot.watches import WatchService  # noqa: E402
from memory.connection import connect  # noqa: E402
from memory.embeddings import CachedEmbedder, LocalEmbedder, background_embedding  # noqa: E402
from memory.ingest.arxiv_source import ArxivSource  # noqa: E402
from memory.manager import MemoryManager  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.stores.knowledge_base import Chunk, Paper  # noqa: E402
from memory.tokens import encoding_for  # noqa: E402
from tests.support.arxiv_replay import ArxivReplay, AtomEntry  # noqa: E402
from tests.support.slack_api import MockSlackApi  # noqa: E402

TARGET_SECONDS = 2.0
DAY = 86_400
TOPICS = [
    "state space models", "diffusion models", "retrieval augmented generation",
    "graph neural networks", "reinforcement learning", "speech recognition",
    "protein structure", "federated learning", "vision transformers", "code generation",
]  # fmt: skip
WORDS = [
    "scalable",
    "efficient",
    "robust",
    "sparse",
    "linear",
    "recurrent",
    "attention",
    "memory",
    "context",
    "benchmark",
    "training",
    "inference",
    "latency",
    "dataset",
    "evaluation",
    "hardware",
    "kernel",
    "theory",
    "analysis",
    "long",
    "sequence",
    "tokens",
    "layers",
    "convolution",
    "spectral",
    "stable",
    "selective",
    "gating",
    "parallel",
    "scan",
    "language",
    "vision",
    "audio",
    "agents",
    "planning",
    "reward",
    "policy",
    "molecule",
    "graph",
    "node",
    "edge",
    "privacy",
    "clients",
    "retrieval",
    "index",
    "documents",
    "queries",
    "generation",
    "decoding",
    "alignment",
    "safety",
]


def sentence(rng: random.Random, topic: str) -> str:
    words = rng.sample(WORDS, 9)
    return f"We study {topic} with {' '.join(words[:4])} and show {' '.join(words[4:])}."


def papers(rng: random.Random, count: int, run: int, start: float) -> list[AtomEntry]:
    out = []
    for i in range(count):
        topic = rng.choice(TOPICS)
        title = f"{rng.choice(WORDS).title()} {topic} for {rng.choice(WORDS)} {rng.choice(WORDS)}"
        abstract = " ".join(sentence(rng, topic) for _ in range(4)) + f" (run {run}, {i})"
        authors = [f"Author {rng.randrange(1000)}" for _ in range(rng.randrange(1, 7))]
        submitted = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + i * 60))
        out.append(AtomEntry(f"{2600 + run}.{i:05d}", title, abstract, authors, submitted,
                             ["cs.LG"]))  # fmt: skip
    return out


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    replay = ArxivReplay().start()
    slack = MockSlackApi()
    await slack.start()
    with temporary_redis() as url:
        client = await connect(url)
        memory = await MemoryManager(client, CachedEmbedder(LocalEmbedder(), client)).open()
        try:
            tenant, team = "bench", Scope("bench", channel="C1", user="U1")
            for i, entry in enumerate(papers(rng, args.saved, 0, time.time() - 400 * DAY)):
                paper = Paper(f"2400.{i:05d}", entry.title, entry.authors, "2024-01-01",
                              ["cs.LG"], entry.summary, source="arxiv")  # fmt: skip
                vector = await memory.embedder.embed([entry.summary])
                await memory.knowledge_base.add_paper(
                    Scope(tenant), paper, [Chunk(entry.summary, "Abstract", 0)], vector
                )
            with background_embedding():
                await memory.embedder.embed(["warm up the model"])  # loaded, as in a bot
            service = WatchService(memory, ArxivSource(replay.api_url, 0.0),
                                   encoding_for("gpt-5-mini"))  # fmt: skip
            poster = SlackWatches(service, AsyncWebClient(token="xoxb-b", base_url=slack.base_url))
            timings, fetches = [], []
            for run in range(1, args.runs + 1):
                now = time.time()
                replay.feed = []
                replay.add_feed(papers(rng, args.candidates, run, now - 2 * DAY))
                watch = await service.store.create(
                    team, "state space models for long sequences", 7 * DAY, platform="slack",
                    channel="C1", now=now,
                )  # fmt: skip
                began = time.perf_counter()
                found = await service.arxiv.submitted(
                    watch.query, watch.since - 3 * DAY, now, [], [], args.candidates
                )
                fetched = time.perf_counter()
                with background_embedding():
                    digest = await service.builder.rank(watch, found, watch.since, now)
                due = str(watch.next_due)
                await service.store.posting(tenant, watch.id, due, time.time(), digest.arxiv_ids)
                ref = await poster.post(watch, digest, f"{watch.id}:{due}")
                await service.store.finish(watch, due, now, time.time(), ref, digest.arxiv_ids)
                done = time.perf_counter()
                assert len(found) == args.candidates and len(digest.items) == 5, (len(found),)
                timings.append(done - fetched)
                fetches.append(fetched - began)
                print(f"run {run}: {len(found)} candidates, digest {done - fetched:.3f} s "
                      f"(arXiv replay fetch {fetched - began:.3f} s, not counted)")  # fmt: skip
                await service.store.remove(tenant, watch.id)
            median = statistics.median(timings)
            print(f"median: {median:.3f} s from {args.candidates} candidates in hand to the "
                  f"digest posted (target ≤ {TARGET_SECONDS:.0f} s: "
                  f"{'met' if median <= TARGET_SECONDS else 'NOT met'}); "
                  f"median fetch from the replay {statistics.median(fetches):.3f} s")  # fmt: skip
        finally:
            await memory.close()
            await slack.close()
            replay.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--saved", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
