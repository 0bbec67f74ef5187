"""Ingestion throughput on the 49-paper unarXive sample, with the real local embedding model.

Starts a throwaway embedded Redis in a temp dir, ingests into a fresh tenant, and prints
chunks/s and how the time splits between embedding and everything else (target: the rest
<= 10%). Usage: python bench/ingest_throughput.py [path/to/unarXive.tar.gz or .jsonl]
"""

from __future__ import annotations

import asyncio
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from memory.embeddings import LocalEmbedder  # noqa: E402
from memory.ingest.pipeline import ingest  # noqa: E402
from memory.redis_server import EmbeddedRedis  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.stores.knowledge_base import KnowledgeBase  # noqa: E402
from memory.tokens import encoding_for  # noqa: E402

SAMPLE = ROOT / ".." / "shared" / "benchmarks" / "unarxive" / "unarXive_data_sample.tar.gz"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def run(source: Path, url: str) -> None:
    redis = Redis.from_url(url)
    embedder = LocalEmbedder()  # uncached on purpose: every chunk is really embedded
    started = time.perf_counter()
    await embedder.embed(["warm-up"])  # model load is not ingestion
    print(f"model loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    kb = KnowledgeBase(redis, embedder)
    await kb.open()
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    report = await ingest([str(source)], Scope(tenant), kb, embedder, encoding_for("gpt-4o"), None)
    await redis.aclose()
    other = report.seconds - report.seconds_embedding
    print(report.summary().splitlines()[0])
    print(f"papers:            {len(report.ingested)}")
    print(f"chunks:            {report.chunks}")
    print(f"total:             {report.seconds:.2f} s")
    print(f"chunks/s:          {report.chunks_per_second:.1f}")
    print(f"embedding:         {report.seconds_embedding:.2f} s ({report.embedding_share:.1%})")
    print(f"everything else:   {other:.2f} s ({other / report.seconds:.1%}; target <= 10%)")
    if report.failed:
        print(f"failed:            {report.failed}")


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE.resolve()
    if not source.is_file():
        sys.exit(f"No unarXive file at {source}: pass its path as the first argument.")
    settings = Settings.from_env()  # ARXIVSCOUT_REDIS_SERVER / _MODULES, as the app reads them
    with tempfile.TemporaryDirectory(prefix="arxivscout-bench-") as tmp:
        server = EmbeddedRedis(
            Path(tmp),
            preferred_port=_free_port(),
            server_binary=settings.redis_server,
            modules=settings.redis_modules,
        )
        url = server.ensure_running()
        try:
            asyncio.run(run(source, url))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
