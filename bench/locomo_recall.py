"""Evidence recall of episodic memory on LoCoMo's development split, per token budget.

Each conversation is replayed as one thread of a single tenant (every turn an episode by its
speaker, dated by its session), through `EpisodicStore.add`. For each question of categories
1-4 the context the agent would see is laid out for a budget B: the thread's last messages up
to 20% of B (the recent window, `[date speaker] text` lines), and the episodic recall in the
rest, never repeating the window's messages. Recall is the share of the question's evidence
turns whose text appears in that context; LoCoMo's README gives the definition.

Turn and question vectors (all-MiniLM-L6-v2) are cached in .bench/ under a hash of the texts.
`--synthetic N` also times recall in a second tenant of N messages (the LoCoMo turns reused
across threads, channels and audiences, their vectors slightly perturbed so HNSW indexes
distinct points).

Usage: python bench/locomo_recall.py [locomo-dev.json] [--budgets 1000 2000 4000]
                                     [--synthetic 100000] [--model gpt-5-mini]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from common import ROOT, SHARED, temporary_redis

from memory.connection import connect
from memory.embeddings import LocalEmbedder
from memory.scope import Scope, Visibility
from memory.stores.episodic import Episode, EpisodicStore
from memory.tokens import count_tokens

DATA = SHARED / "benchmarks" / "locomo" / "locomo-dev.json"
CACHE = ROOT / ".bench"
TENANT = "locomo"
CHANNEL = "locomo"
RECENT_SHARE = 0.2
DAY = 86400
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


@dataclass
class Question:
    text: str
    category: int
    evidence: list[str]  # dia ids


@dataclass
class Conversation:
    thread: str
    turns: list[tuple[str, Episode]]  # (dia id, episode), in order
    questions: list[Question]


def load(path: Path) -> list[Conversation]:
    out = []
    for sample in json.loads(path.read_text()):
        talk, thread = sample["conversation"], sample["sample_id"]
        sessions = sorted(
            (int(k.split("_")[1]) for k in talk if re.fullmatch(r"session_\d+", k)),
        )
        turns: list[tuple[str, Episode]] = []
        for n in sessions:
            when = datetime.strptime(talk[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y")
            start = when.replace(tzinfo=UTC).timestamp()
            for i, turn in enumerate(talk[f"session_{n}"]):
                text = turn["text"]
                if turn.get("blip_caption"):
                    text += f" [shares an image: {turn['blip_caption']}]"
                episode = Episode(
                    id=f"m-{thread}-{turn['dia_id']}", thread=thread, channel=CHANNEL,
                    author=turn["speaker"].lower(), author_name=turn["speaker"], text=text,
                    ts=start + 30 * i, seq=len(turns),
                )  # fmt: skip
                turns.append((turn["dia_id"], episode))
        known = {dia for dia, _ in turns}
        questions = []
        for qa in sample["qa"]:
            evidence = [e for e in re.findall(r"D\d+:\d+", " ".join(qa["evidence"])) if e in known]
            if qa["category"] in CATEGORIES and evidence:
                questions.append(Question(qa["question"], qa["category"], evidence))
        out.append(Conversation(thread, turns, questions))
    return out


def vectors(texts: list[str], embedder: LocalEmbedder) -> np.ndarray:
    """MiniLM vectors of `texts`, from .bench/ when these very texts were embedded before."""
    digest = hashlib.sha1("\x00".join([embedder.model_name, *texts]).encode()).hexdigest()[:16]
    path = CACHE / f"locomo-{digest}.npy"
    if path.exists():
        return np.load(path)
    started = time.perf_counter()
    out = np.concatenate(
        [embedder.encode_sync(texts[i : i + 256]) for i in range(0, len(texts), 256)]
    )
    CACHE.mkdir(exist_ok=True)
    np.save(path, out)
    print(f"embedded {len(texts)} texts in {time.perf_counter() - started:.1f} s -> {path}")
    return out


class Precomputed:
    """An embedder answering from vectors computed (and cached) beforehand, so that writing
    the turns, parts included, costs no model time; unknown texts go to the model."""

    def __init__(self, inner: LocalEmbedder, texts: list[str], table: np.ndarray) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.table = {t: v for t, v in zip(texts, table, strict=True)}

    async def embed(self, texts: list[str]) -> np.ndarray:
        if all(t in self.table for t in texts):
            return np.array([self.table[t] for t in texts]).reshape(len(texts), self.dims)
        return await self.inner.embed(texts)


def recent_window(turns: list[Episode], budget: int, model: str) -> tuple[list[Episode], str]:
    """The thread's last messages, as many as fit `budget` tokens."""
    lines: list[str] = []
    shown: list[Episode] = []
    for e in reversed(turns):
        line = f"[{e.date} {e.speaker}] {e.text}\n"
        if count_tokens("".join([line, *lines]), model) > budget:
            break
        lines.insert(0, line)
        shown.insert(0, e)
    return shown, "".join(lines)


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def evaluate(
    store: EpisodicStore,
    talks: list[Conversation],
    qvecs: list[np.ndarray],
    budgets: list[int],
    model: str,
) -> dict[int, dict[str, list[float]]]:
    """Per budget: recall per question (keyed by category), context tokens, latency (s)."""
    out: dict[int, dict[str, list[float]]] = {}
    for budget in budgets:
        stats: dict[str, list[float]] = {"tokens": [], "latency": []}
        stats.update({str(c): [] for c in CATEGORIES})
        await store.redis.execute_command("CONFIG", "RESETSTAT")
        k = 0
        for talk in talks:
            scope = Scope(TENANT, talk.thread, channel=CHANNEL)
            episodes = [e for _, e in talk.turns]
            shown, recent = recent_window(episodes, int(RECENT_SHARE * budget), model)
            rest = budget - count_tokens(recent, model)
            text_of = {dia: e.text for dia, e in talk.turns}
            for question in talk.questions:
                started = time.perf_counter()
                found = await store.recall(
                    scope, question.text, qvecs[k], rest, model,
                    exclude_ids=frozenset(e.id for e in shown),
                )  # fmt: skip
                stats["latency"].append(time.perf_counter() - started)
                k += 1
                context = recent + store.render(found)
                stats["tokens"].append(count_tokens(context, model))
                hits = sum(text_of[dia].strip() in context for dia in question.evidence)
                stats[str(question.category)].append(hits / len(question.evidence))
        stats["server"] = [await redis_ms(store.redis) / k]
        out[budget] = stats
    return out


def report(results: dict[int, dict[str, list[float]]]) -> float:
    head = f"{'budget':>7} {'overall':>8} " + " ".join(f"{n:>12}" for n in CATEGORIES.values())
    print(head + f" {'tok p50':>8} {'tok max':>8} {'ms p50':>7} {'ms p95':>7} {'redis':>6}")
    for budget, stats in results.items():
        per = [stats[str(c)] for c in CATEGORIES]
        overall = statistics.fmean([x for xs in per for x in xs])
        cats = " ".join(f"{statistics.fmean(xs):12.3f}" for xs in per)
        lat = [1000 * x for x in stats["latency"]]
        print(
            f"{budget:>7} {overall:8.3f} {cats} {p(stats['tokens'], 0.5):8.0f} "
            f"{max(stats['tokens']):8.0f} {p(lat, 0.5):7.2f} {p(lat, 0.95):7.2f} "
            f"{stats['server'][0]:6.2f}"
        )
    return overall


class Perturbed:
    """Known vectors with a little noise, renormalised: copies of a text become distinct
    points, as distinct messages are, so HNSW is timed on a realistic graph."""

    def __init__(self, inner: Precomputed, sigma: float = 0.02) -> None:
        self.inner, self.model_name, self.dims = inner, inner.model_name, inner.dims
        self.rng, self.sigma = np.random.default_rng(7), sigma

    async def embed(self, texts: list[str]) -> np.ndarray:
        vectors = await self.inner.embed(texts)
        vectors = vectors + self.rng.normal(0, self.sigma, vectors.shape).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def redis_ms(redis) -> float:
    """Milliseconds the server spent in FT.SEARCH since the last reset of its statistics."""
    stats = await redis.execute_command("INFO", "commandstats")
    return stats.get("cmdstat_FT.SEARCH", {}).get("usec", 0) / 1000


async def synthetic(
    store: EpisodicStore, talks: list[Conversation], qvecs: list[np.ndarray], n: int
) -> None:
    """Recall latency in a tenant of `n` messages: the LoCoMo turns again and again, in threads
    of 400 over 40 channels (one thread in ten a DM, one channel in forty private); questions
    asked from a public channel's thread and from a DM."""
    writer = EpisodicStore(store.redis, Perturbed(store.embedder))
    base = [e for t in talks for _, e in t.turns]
    tenant = "synthetic"
    started = time.perf_counter()
    for start in range(0, n, 2000):
        batch = []
        for i in range(start, min(n, start + 2000)):
            e, thread = base[i % len(base)], i // 400
            channel = f"C{thread % 40:03d}"
            audience = "public"
            if thread % 10 == 3:
                channel, audience = f"D{thread:05d}", f"dm:D{thread:05d}"
            elif thread % 40 == 7:
                audience = f"private:{channel}"
            batch.append(
                replace(
                    e, id=f"s{i}", thread=f"T{thread:05d}", channel=channel, audience=audience,
                    ts=e.ts + 400 * DAY * (i // len(base)), seq=i % 400,
                )
            )  # fmt: skip
        await writer.add(Scope(tenant), batch)
    while float((await store.info(tenant)).get("percent_indexed", 1)) < 1:
        await asyncio.sleep(0.5)
    print(f"\nsynthetic tenant: {n} messages written in {time.perf_counter() - started:.0f} s")
    places = {
        "public channel": Scope(tenant, "T00001", channel="C001"),
        "DM": Scope(tenant, "T00003", channel="D00003", visibility=Visibility.DM),
    }
    questions = [q.text for t in talks for q in t.questions]
    for label, scope in places.items():
        for budget in (800, 1600, 3200):
            for question, vec in list(zip(questions, qvecs, strict=True))[:20]:  # warm-up
                await store.recall(scope, question, vec, budget, "gpt-5-mini")
            await store.redis.execute_command("CONFIG", "RESETSTAT")
            lat = []
            for question, vec in zip(questions, qvecs, strict=True):
                began = time.perf_counter()
                await store.recall(scope, question, vec, budget, "gpt-5-mini")
                lat.append(1000 * (time.perf_counter() - began))
            server = await redis_ms(store.redis) / len(lat)
            print(
                f"recall at {n} messages, {label}, {budget} tokens: p50 {p(lat, 0.5):.2f} ms, "
                f"p95 {p(lat, 0.95):.2f} ms (Redis server {server:.2f} ms a recall)"
            )


async def run(args: argparse.Namespace) -> None:
    talks = load(Path(args.data))
    embedder = LocalEmbedder()
    turns = [e for t in talks for _, e in t.turns]
    texts = [e.embedding_text for e in turns] + [p for e in turns for p in e.part_texts()]
    tvecs = vectors(texts, embedder)
    qvecs = list(vectors([q.text for t in talks for q in t.questions], embedder))
    with temporary_redis() as url:
        redis = await connect(url)
        store = EpisodicStore(redis, Precomputed(embedder, texts, tvecs))
        await store.open()
        k = 0
        for talk in talks:
            n = len(talk.turns)
            await store.add(
                Scope(TENANT, talk.thread), [e for _, e in talk.turns], tvecs[k : k + n]
            )
            k += n
        questions = sum(len(t.questions) for t in talks)
        print(f"{len(talks)} conversations, {k} turns, {questions} questions (categories 1-4)")
        results = await evaluate(store, talks, qvecs, args.budgets, args.model)
        report(results)
        if args.synthetic:
            await synthetic(store, talks, qvecs, args.synthetic)
        await redis.aclose()
    at = 2000 if 2000 in results else args.budgets[0]
    recall = statistics.fmean(
        x for c in CATEGORIES for x in results[at][str(c)]
    )  # the same mean as the table's overall column
    print(f"recall {recall:.3f} over {questions} questions at {at} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", default=str(DATA))
    parser.add_argument("--budgets", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--synthetic", type=int, default=0, help="messages of a timing tenant")
    parser.add_argument("--model", default="gpt-5-mini", help="whose tokenizer counts")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
