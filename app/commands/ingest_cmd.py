"""`arxivscout ingest`: add arXiv papers, PDFs and unarXive JSONL files to a knowledge base."""

from __future__ import annotations

import argparse
import sys

from app.commands.common import add_tenant, memory_session, tenant_scope
from app.runtime import arxiv_source
from app.settings import Settings
from memory.tokens import encoding_for


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "ingest",
        help="save papers (arXiv ids, PDF files, unarXive .jsonl files) to a knowledge base",
    )
    add_tenant(parser)
    parser.add_argument(
        "sources", nargs="+", help="arXiv id, path to a PDF, or path to a .jsonl/.tar.gz"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    from memory.ingest.pipeline import ingest

    settings = Settings.from_env()
    async with memory_session(settings) as memory:
        arxiv = arxiv_source(settings, memory.redis)
        report = await ingest(
            args.sources,
            tenant_scope(args),
            memory.knowledge_base,
            memory.embedder,
            encoding_for(settings.openai_model),
            arxiv,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    for arxiv_id, title, chunks in report.ingested:
        print(f"ingested {arxiv_id}: {title} ({chunks} chunks)")
    for arxiv_id, why in report.skipped:
        print(f"skipped {arxiv_id}: {why}")
    for source, message in report.failed:
        print(f"failed {source}: {message}", file=sys.stderr)
    print(
        f"{len(report.ingested)} ingested, {len(report.skipped)} skipped, {len(report.failed)} failed "
        f"({report.chunks} chunks in {report.seconds:.1f} s)"
    )
    return 1 if report.failed else 0
