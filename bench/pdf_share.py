"""A 30-page PDF shared in a Slack thread: how soon the knowledge base answers from its page 27.

The real Slack adapter (signed `file_share` events over HTTP), a local Slack Web API that serves
the file to the bot token, the durable task stream and the local embedding model; a scripted
model answers the mention that brings the bot into the thread. Each run shares a new PDF (its
own phrase on page 27, so no run is a duplicate of another) and times from sending the event
until a knowledge-base search from the thread, for that phrase, returns the page-27 passage.
Target: ≤ 60 s on a 2-core machine.

Usage: python bench/pdf_share.py [--runs 3] [--pages 30]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate

from adapters.slack import SlackAdapter, thread_id
from adapters.web import build_web_app
from app.runtime import open_agent
from app.settings import Settings
from bench.common import temporary_redis
from memory.ingest.pdf import read_pdf
from memory.scope import Scope
from tests.support.scripted_openai import ScriptedOpenAI, text
from tests.support.slack_api import MockSlackApi, SlackSender, file_share, mention

SECRET = "bench-secret"
TEAM = "TBENCH"
TOKEN = "xoxb-bench"
VOCABULARY = (
    "model attention memory retrieval context window agent tool passage corpus token layer "
    "training inference benchmark dataset evaluation gradient transformer encoder decoder "
    "embedding vector index latency throughput summary citation experiment baseline ablation"
)
WORDS = VOCABULARY.split()


def paper(pages: int, phrase: str, seed: int) -> bytes:
    """`pages` pages of prose (about 500 words each), `phrase` on page 27."""
    rng = random.Random(seed)
    styles = getSampleStyleSheet()
    story: list = [Paragraph(f"Benchmark Paper {seed}", styles["Title"])]
    for page in range(1, pages + 1):
        story.append(Paragraph(f"{page} Section {page}", styles["Heading2"]))
        for n in range(6):
            words = " ".join(rng.choice(WORDS) for _ in range(80))
            extra = f" {phrase}" if page == 27 and n == 2 else ""
            story.append(Paragraph(f"{words.capitalize()}.{extra}", styles["BodyText"]))
        story.append(PageBreak())
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, title=f"Benchmark Paper {seed}").build(story)
    return buffer.getvalue()


async def run(runs: int, pages: int) -> None:
    with temporary_redis() as url, tempfile.TemporaryDirectory() as data:
        model, api = ScriptedOpenAI(), MockSlackApi(streaming=True)
        await model.start()
        await api.start()
        settings = Settings(
            redis_url=url, data_dir=Path(data), openai_api_key="bench",
            openai_base_url=model.base_url, slack_bot_token=TOKEN, slack_api_url=api.base_url,
        )  # fmt: skip
        runtime = await open_agent(settings)
        adapter = SlackAdapter(runtime.turns(), TOKEN, SECRET, api_url=api.base_url)
        await adapter.check_token()
        runner = web.AppRunner(build_web_app(runtime.memory, adapter.app))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        session = aiohttp.ClientSession()
        slack = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, session, api)
        memory, times = runtime.memory, []
        try:
            model.script(text("Hello, I am in this thread now."))
            root = "1700000000.000001"
            await slack.event(mention("hello", root), team=TEAM)  # the bot joins the thread
            await adapter.wait_idle()
            scope = Scope(TEAM, thread_id(TEAM, "C1", root), channel="C1")
            for n in range(runs):
                made = random.Random(1000 + n)  # this run's own made-up words, nowhere else
                coined = ["".join(made.choice("bcdfgklmnprstvz") + made.choice("aeiou")
                                  for _ in range(4)) for _ in range(4)]  # fmt: skip
                marker = coined[1]
                phrase = f"The {coined[0]} {marker} bounds the {coined[2]} of {coined[3]} heads."
                data_bytes = paper(pages, phrase, seed=n)
                where = {page for _, t, page in read_pdf(data_bytes).located() if marker in t}
                if where != {27}:
                    raise SystemExit(f"the phrase is on pages {where} of the PDF, not on 27")
                shared = api.add_file(f"paper-{n}.pdf", data_bytes)
                vector = (await memory.embedder.embed([phrase]))[0]
                started = time.perf_counter()
                await slack.event(
                    file_share([shared], f"1700000001.{n:06d}", thread_ts=root), team=TEAM
                )
                while True:
                    hits = await memory.knowledge_base.search(scope, phrase, vector, k=3)
                    if any(marker in h.content for h in hits):  # its chunk may start on page 26
                        break
                    if time.perf_counter() - started > 120:
                        shown = api.thread_texts("C1", root)[-1:]
                        raise SystemExit(f"run {n + 1}: not found after 120 s; shown: {shown}")
                    await asyncio.sleep(0.1)
                elapsed = time.perf_counter() - started
                times.append(elapsed)
                record = (await memory.knowledge_base.papers(scope))[-1]
                print(f"run {n + 1}: {elapsed:.1f} s ({len(data_bytes) / 1e3:.0f} kB, "
                      f"{record['pages']} pages, {record['chunks']} passages)")  # fmt: skip
                await runtime.harness.drain()
                await runtime.files.drain()  # its task acknowledged before the next run
        finally:
            await session.close()
            await runner.cleanup()
            await adapter.close()
            await runtime.close()
            await model.close()
            await api.close()
        print(f"median over {runs} runs: {statistics.median(times):.1f} s (target ≤ 60 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pages", type=int, default=30)
    args = parser.parse_args()
    if args.pages < 27:
        raise SystemExit("--pages must be at least 27 (the phrase is on page 27)")
    asyncio.run(run(args.runs, args.pages))


if __name__ == "__main__":
    main()
