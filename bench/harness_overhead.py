"""Harness overhead per turn, with no model time: what ArxivScout itself adds to a turn.

Starts a throwaway embedded Redis and an in-process scripted OpenAI-compatible server that answers
at once with a plain text answer (no tool call), builds the real agent with
`app.runtime.open_agent`, fills one tenant's knowledge base with real unarXive papers (chunked and
embedded with the local MiniLM model, as ingestion does), then runs sequential turns round-robin
over several threads. Every question is distinct, so the question embedding (part of the
harness: it is computed in `assemble_context`) is a real MiniLM pass, not a cache hit.

Per turn it times `Agent.run_turn` end to end and, by wrapping the objects of the running agent
(no code outside bench/ is changed), the time inside the model calls (`LLMClient.chat`: the SDK,
HTTP on loopback and the scripted server) and the harness phases. Overhead = turn - model time.
Background work (entity extraction) is drained after each turn, outside the timed window, as a
user's think time would let it finish; `--no-drain` lets it overlap the next turn instead.

Usage: python bench/harness_overhead.py [--turns 300] [--threads 30] [--papers 3]
                                        [--sample path/to/unarXive.tar.gz] [--no-drain]
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import inspect
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.support (the scripted model server)

from common import sample_path, temporary_redis  # noqa: E402

import bot.harness  # noqa: E402
import memory.context  # noqa: E402
from app.runtime import AgentRuntime, open_agent  # noqa: E402
from app.settings import Settings  # noqa: E402
from bot.harness import ENTITY_INSTRUCTIONS  # noqa: E402
from memory.ingest.chunking import chunk_paragraphs  # noqa: E402
from memory.ingest.unarxive import read_unarxive  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.tokens import encoding_for  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAI, text  # noqa: E402

TENANT = "bench-tenant"
TARGET_OVERHEAD_MS = 20.0

TOPICS = [
    "retrieval-augmented generation", "KV cache compression", "mixture-of-experts routing",
    "long-context attention", "speculative decoding", "instruction tuning",
    "reinforcement learning from human feedback", "chain-of-thought prompting",
    "tool use by language models", "agent memory architectures", "vector database indexing",
    "HNSW graph search", "contrastive sentence embeddings", "knowledge distillation",
    "quantization of transformer weights", "low-rank adaptation (LoRA)",
    "diffusion models for images", "graph neural networks", "neural scaling laws",
    "in-context learning", "hallucination detection", "code generation benchmarks",
    "multilingual machine translation", "protein structure prediction",
    "federated learning privacy", "adversarial robustness", "self-supervised speech models",
    "tabular deep learning", "causal inference with observational data",
    "reward hacking in RL", "state space models such as Mamba", "vision-language models",
    "curriculum learning", "model editing of factual knowledge", "dense passage retrieval",
    "sparse attention patterns", "evaluation with LLM-as-a-judge", "neural architecture search",
    "continual learning and catastrophic forgetting", "dataset contamination",
]  # fmt: skip
TEMPLATES = [
    "What does the literature say about {t}?",
    "Summarise the key results on {t} from the papers I saved.",
    "Which papers in my knowledge base discuss {t}, and what do they claim?",
    "How does {t} compare with the usual baseline approaches?",
    "What are the main limitations of {t} reported so far?",
    "Explain the method behind {t} in simple terms.",
    "Which datasets and metrics are used to evaluate {t}?",
    "Who are the main authors working on {t}?",
    "What open problems remain in {t}?",
    "Give me a short reading list on {t}, most important first.",
]
ANSWER = (
    "Here is what the saved papers say. The main approach trades a small amount of accuracy "
    "for a large reduction in memory and latency; the authors report consistent gains over "
    "strong baselines on standard benchmarks, with ablations showing that most of the benefit "
    "comes from the retrieval step. Limitations: evaluation is mostly on English data, and "
    "the cost of building the index is not measured. I can pull up the exact passages if you "
    "want the numbers."
)


def questions(threads: int, per_thread: int) -> list[list[str]]:
    """`threads` lists of distinct questions; thread i stays on one topic, as a user would."""
    out = []
    for i in range(threads):
        topic = TOPICS[i % len(TOPICS)]
        suffix = f" (case {i // len(TOPICS) + 1})" if i >= len(TOPICS) else ""
        out.append(
            [TEMPLATES[j % len(TEMPLATES)].format(t=topic) + suffix
             + (f" Part {j // len(TEMPLATES) + 1}." if j >= len(TEMPLATES) else "")
             for j in range(per_thread)]
        )  # fmt: skip
    return out


# -- statistics -------------------------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


# -- timing of the running agent's parts ------------------------------------------------------

CURRENT: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "bench_turn", default=None
)


@dataclass
class Probe:
    """Wraps attributes of live objects so each call adds its duration to the current turn."""

    undo: list[Callable[[], None]] = field(default_factory=list)

    def wrap(self, owner: Any, attr: str, label: str,
             skip: Callable[..., bool] | None = None) -> None:  # fmt: skip
        original = getattr(owner, attr)
        had_own = isinstance(owner, type) or attr in getattr(owner, "__dict__", {})

        def add(started: float) -> None:
            record = CURRENT.get()
            # Background tasks spawned by a turn inherit its record: count only until it ends.
            if record is not None and not record.get("_closed"):
                record[label] += time.perf_counter() - started
                record[label + " #"] += 1

        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def timed(*args, **kwargs):
                if skip is not None and skip(*args, **kwargs):
                    return await original(*args, **kwargs)
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    add(started)
        else:

            @functools.wraps(original)
            def timed(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    add(started)

        setattr(owner, attr, timed)
        if had_own:
            self.undo.append(lambda: setattr(owner, attr, original))
        else:
            self.undo.append(lambda: delattr(owner, attr))

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()


def is_entity_call(messages, *args, **kwargs) -> bool:
    return bool(messages) and messages[0].get("content") == ENTITY_INSTRUCTIONS


def instrument(runtime: AgentRuntime) -> Probe:
    """Time the model calls and the harness phases of this runtime's agent."""
    probe = Probe()
    harness, mem = runtime.harness, runtime.memory
    # The agent loop's model calls (entity extraction runs in the background: not counted).
    probe.wrap(runtime.llm, "chat", "model (LLMClient.chat)", skip=is_entity_call)
    probe.wrap(harness, "before", "harness.before")
    probe.wrap(bot.harness, "assemble_context", "  assemble_context")
    probe.wrap(mem.embedder, "embed", "    question embedding")
    probe.wrap(mem.embedder.inner, "embed", "      MiniLM pass (cache miss)")
    for store, method in (
        ("conversation", "unsummarized"), ("knowledge_base", "search"),
        ("workflows", "similar"), ("entities", "similar"), ("summaries", "descriptions"),
    ):  # fmt: skip
        probe.wrap(getattr(mem, store), method, f"    read {store}.{method} (concurrent)")
    probe.wrap(mem.episodes, "find", "    read episodes.find (concurrent)")
    probe.wrap(mem.episodes, "pick_rendered", "    read episodes.pick_rendered (after the reads)")
    probe.wrap(memory.context, "count_tokens_many", "    count_tokens (segments)")
    probe.wrap(harness, "usage_percent", "  usage_percent (tiktoken)")
    probe.wrap(harness, "select_tools", "  select_tools")
    probe.wrap(mem.conversation, "append", "conversation.append (user+assistant)")
    probe.wrap(harness, "after", "harness.after")
    probe.wrap(harness, "run_tool", "harness.run_tool")
    return probe


# -- the world ----------------------------------------------------------------------------------


@asynccontextmanager
async def bench_world(redis_url: str, responder, model_url: str | None = None, **settings: Any):
    """The real agent over `redis_url`, talking to a scripted model served from another thread
    (or, with `model_url`, to a model served elsewhere)."""
    model = ScriptedOpenAI(responder=responder)

    def route(body: dict[str, Any]):
        messages = body.get("messages") or []
        if messages and messages[0].get("content") == ENTITY_INSTRUCTIONS:
            return text("[]")
        return None

    model.router = route
    if model_url is None:
        model_url = model.start_in_thread()  # its own loop and thread
    with tempfile.TemporaryDirectory(prefix="arxivscout-bench-data-") as data_dir:
        config = Settings(
            redis_url=redis_url, data_dir=Path(data_dir), openai_api_key="bench-key",
            openai_base_url=model_url, arxiv_api_url="http://127.0.0.1:9/unused",
            arxiv_delay_seconds=0.0, **settings,
        )  # fmt: skip
        runtime = await open_agent(config)
        try:
            yield runtime, model
        finally:
            await runtime.close()
            model.stop()


async def fill_knowledge_base(runtime: AgentRuntime, sample: Path, papers: int) -> int:
    """Chunk and embed the first `papers` unarXive papers into TENANT's knowledge base."""
    mem = runtime.memory
    encoding = encoding_for(runtime.llm.model)
    total = 0
    items = read_unarxive(sample, on_error=lambda exc: None)
    for _ in range(papers):
        item = await asyncio.to_thread(next, items, None)
        if item is None:
            break
        paper, paragraphs = item
        chunks = await asyncio.to_thread(chunk_paragraphs, paragraphs, encoding)
        vectors = await mem.embedder.inner.embed([c.text for c in chunks])  # uncached
        total += await mem.knowledge_base.add_paper(Scope(TENANT), paper, chunks, vectors)
    return total


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Also prints the load average before and after: other processes skew these figures."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    print(f"cpus: {os.cpu_count()}, load average at start: {load()}")
    yield
    print(f"load average at end: {load()}")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def timed_turn(runtime: AgentRuntime, thread: str, question: str) -> dict[str, float]:
    """One run_turn with its phases recorded; 'turn' is the end-to-end wall time."""
    scope = Scope(TENANT, thread)  # built before the clock starts, as an adapter does
    record: dict[str, float] = defaultdict(float)
    token = CURRENT.set(record)
    try:
        started = time.perf_counter()
        result = await runtime.agent.run_turn(scope, question)
        record["turn"] = time.perf_counter() - started
    finally:
        record["_closed"] = 1.0
        CURRENT.reset(token)
    record["_iterations"] = result.iterations
    record["_final"] = float(result.stop_reason == "final")
    return record


# -- the benchmark -------------------------------------------------------------------------------


async def bare_round_trip(runtime: AgentRuntime, messages: list[dict], n: int) -> list[float]:
    """`LLMClient.chat` alone, with a turn's real message list: the model-call cost by itself."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await runtime.llm.chat(messages)
        out.append(time.perf_counter() - started)
    return out


async def run(args: argparse.Namespace, redis_url: str) -> None:
    async def responder(body: dict[str, Any]):
        return text(ANSWER)

    async with bench_world(redis_url, responder) as (runtime, _model):
        started = time.perf_counter()
        chunks = await fill_knowledge_base(runtime, sample_path(args.sample), args.papers)
        print(f"knowledge base: {chunks} chunks from {args.papers} unarXive papers "
              f"(embedded in {time.perf_counter() - started:.1f} s incl. model load)")  # fmt: skip

        # Warm-up: MiniLM, tiktoken, the HTTP connection, Redis connections (not measured).
        for i in range(args.warmup):
            await runtime.agent.run_turn(Scope(TENANT, "warmup"), f"Warm-up question number {i}?")
        await runtime.harness.drain()

        probe = instrument(runtime)
        per_thread = math.ceil(args.turns / args.threads)
        qs = questions(args.threads, per_thread)
        records: list[dict[str, float]] = []
        try:
            for j in range(per_thread):
                for i in range(args.threads):
                    if len(records) >= args.turns:
                        break
                    records.append(await timed_turn(runtime, f"thread-{i:03d}", qs[i][j]))
                    if not args.no_drain:
                        await runtime.harness.drain()
        finally:
            probe.restore()
        await runtime.harness.drain()

        # The model call by itself, with a real turn's messages (last thread, full history).
        prepared = await runtime.harness.before(Scope(TENANT, "bare-call"), qs[0][0])
        bare = await bare_round_trip(runtime, prepared.messages, args.bare_calls)
        # MiniLM on one distinct question, called directly (no event loop hop, no cache).
        local = runtime.memory.embedder.inner
        raw = []
        for k in range(args.bare_calls):
            started = time.perf_counter()
            local.encode_sync([f"{qs[k % len(qs)][0]} reference {k}"])
            raw.append(time.perf_counter() - started)

    report(args, records, bare, raw)


def report(
    args: argparse.Namespace, records: list[dict[str, float]], bare: list[float], raw: list[float]
) -> None:
    turns = [r["turn"] for r in records]
    model = [r["model (LLMClient.chat)"] for r in records]
    overhead = [t - m for t, m in zip(turns, model, strict=True)]
    finals = sum(r["_final"] for r in records)
    print(f"\n{len(records)} sequential turns over {args.threads} threads "
          f"({finals:.0f} final answers, 1 model call each; "
          f"background {'overlapping' if args.no_drain else 'drained between turns'})")  # fmt: skip
    print(f"  run_turn             p50 {ms(pct(turns, 50))}   p95 {ms(pct(turns, 95))}")
    print(
        f"  model round-trip     p50 {ms(pct(model, 50))}   p95 {ms(pct(model, 95))}"
        "   (LLMClient.chat inside the turn: SDK + loopback HTTP + scripted server)"
    )
    print(f"  bare LLMClient.chat  p50 {ms(pct(bare, 50))}   p95 {ms(pct(bare, 95))}"
          f"   ({len(bare)} calls alone, same-size messages)")  # fmt: skip
    p50 = pct(overhead, 50)
    verdict = "MET" if p50 * 1000 <= TARGET_OVERHEAD_MS else "MISSED"
    print(f"  harness overhead     p50 {ms(p50)}   p95 {ms(pct(overhead, 95))}"
          f"   target p50 <= {TARGET_OVERHEAD_MS:.0f} ms: {verdict}")  # fmt: skip
    alt = [t - pct(bare, 50) for t in turns]
    print(f"  (turn - bare-call p50: p50 {ms(pct(alt, 50))})")

    labels = [k for k in records[0] if not k.endswith(" #") and not k.startswith("_")
              and k not in ("turn", "model (LLMClient.chat)")]  # fmt: skip
    seen = {k for r in records for k in r}
    labels += sorted(k for k in seen if k not in labels and not k.endswith(" #")
                     and not k.startswith("_") and k not in ("turn", "model (LLMClient.chat)"))  # fmt: skip
    order = [
        "harness.before", "  assemble_context", "    question embedding",
        "      MiniLM pass (cache miss)",
    ]  # fmt: skip
    order += sorted(k for k in labels if k.startswith("    read "))
    order += ["    count_tokens (segments)", "  usage_percent (tiktoken)", "  select_tools",
              "conversation.append (user+assistant)", "harness.after", "harness.run_tool"]  # fmt: skip
    print("\nharness phases per turn (sum of calls in the turn; indented = inside the one above):")
    print(f"  {'phase':52s} {'p50':>11s} {'p95':>11s} {'calls/turn':>11s}")
    for label in order:
        values = [r.get(label, 0.0) for r in records]
        calls = statistics.mean(r.get(label + " #", 0.0) for r in records)
        if calls == 0:
            continue
        print(f"  {label:52s} {ms(pct(values, 50))} {ms(pct(values, 95))} {calls:11.2f}")
    rest = [r["turn"] - r["model (LLMClient.chat)"] - r.get("harness.before", 0.0)
            - r.get("harness.after", 0.0) for r in records]  # fmt: skip
    print(f"  {'rest of run_turn (citations, loop glue)':52s} {ms(pct(rest, 50))} "
          f"{ms(pct(rest, 95))}")  # fmt: skip
    threads = torch_threads()
    print(f"\nreference: MiniLM encode_sync of 1 question, called directly: p50 {ms(pct(raw, 50))}"
          f"  p95 {ms(pct(raw, 95))}  (torch threads: {threads})")  # fmt: skip


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def add_world_args(parser: argparse.ArgumentParser) -> None:
    """Options every agent benchmark shares."""
    parser.add_argument("--papers", type=int, default=10, help="unarXive papers in the KB")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sample", help="unarXive .tar.gz/.jsonl (default: the shared sample)")


def run_in_world(run, args: argparse.Namespace) -> int:
    """Run `run(args, redis_url)` against a throwaway embedded Redis, quietly."""
    with quiet_logs(), temporary_redis() as url:
        asyncio.run(run(args, url))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--threads", type=int, default=30)
    parser.add_argument("--bare-calls", type=int, default=100)
    parser.add_argument("--no-drain", action="store_true",
                        help="let background entity extraction overlap the next turn")  # fmt: skip
    add_world_args(parser)
    return run_in_world(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
