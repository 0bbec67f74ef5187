"""The memory page's thread view of a 5,000-message thread (target: <= 300 ms, paged).

Starts a throwaway embedded Redis, writes one thread of 5,000 messages (questions of a line,
answers of a few paragraphs, every tenth question with a tool call and its log, the oldest 4,000
messages under 40 summaries), serves the real routes of `/memory` over HTTP on a local port,
and times GET /memory/threads/{thread} for the first page (the oldest 100 messages) and the
last (the default: the newest), as a browser would fetch them: the whole body read, through
the access middleware (`adapters/memory_page/server.py`) with a real session.

Usage: python bench/memory_page.py [--messages 5000] [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from urllib.parse import quote

import aiohttp
from aiohttp import web
from common import free_port, temporary_redis
from yarl import URL

from adapters.memory_page.access import LocalDirectory
from adapters.memory_page.auth import Links, LinkSigner
from adapters.memory_page.server import memory_page
from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder
from memory.manager import MemoryManager
from memory.scope import Scope, Visibility
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry

TENANT = "bench"
THREAD = "slack:bench:C1:1700000000.000100"
ANSWER = (
    "MemGPT treats the context window like main memory and pages older material out to "
    "archival storage, recalling it with function calls when a question needs it. "
) * 5


async def fill(memory: MemoryManager, messages: int) -> None:
    """One public thread of `messages` messages, tool logs and summaries."""
    scope = Scope(TENANT, THREAD, "C1", Visibility.PUBLIC, "U1", "Alice")
    start = time.time() - messages * 60
    batch = []
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        text = (
            f"Question {i // 2}: what does section {i % 7} say about paging?"
            if role == "user"
            else ANSWER
        )
        batch.append(memory.conversation.append(scope, role, text, timestamp=start + i * 60))
        if role == "user" and i % 20 == 0:
            entry = ToolLogEntry(THREAD, "search_knowledge_base", {"query": f"paging {i}"},
                                 ANSWER * 3, "success", created_at=start + i * 60 + 1)  # fmt: skip
            batch.append(memory.tool_logs.write(scope, entry))
        if len(batch) >= 500:
            await asyncio.gather(*batch)
            batch = []
    await asyncio.gather(*batch)
    per = 100
    for n in range(min(40, messages // per - 10)):
        first, raw = await memory.conversation.unsummarized_snapshot(scope)
        summary = Summary(THREAD, f"Turns {n * per} to {n * per + per - 1}: paging", ANSWER, [])
        await memory.summaries.save(scope, summary)
        await memory.conversation.mark_summarized(scope, first, raw[:per], summary.id)


def app_for(memory: MemoryManager) -> tuple[web.Application, str]:
    """The page behind the real access middleware, and the path of a signed link (a local
    admin's, as `arxivscout web` prints) that starts a session."""
    links = Links(LinkSigner("bench-secret"), "http://127.0.0.1")
    mounted = memory_page(memory, links, LocalDirectory())
    app = web.Application(middlewares=mounted.middlewares)
    app.add_routes(mounted.routes)
    app.on_response_prepare.append(mounted.on_prepare)
    return app, URL(links.login(TENANT, "bench", "local")).path_qs


async def timed(session: aiohttp.ClientSession, url: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        async with session.get(url) as response:
            body = await response.read()
            if response.status != 200:
                raise SystemExit(f"GET {url}: {response.status}\n{body[:500]!r}")
        times.append((time.perf_counter() - began) * 1000)
    return times


async def main(args: argparse.Namespace) -> None:
    with temporary_redis() as redis_url:
        client = await connect(redis_url)
        memory = await MemoryManager(client, CachedEmbedder(LocalEmbedder(), client)).open()
        began = time.perf_counter()
        await fill(memory, args.messages)
        print(f"wrote {args.messages:,} messages in {time.perf_counter() - began:.1f} s")
        app, login = app_for(memory)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}/memory/threads/{quote(THREAD, safe='')}"
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
                token = URL(login).query["token"]  # the link's button posts its token
                async with session.get(  # its page gives the browser the sign-in cookie
                    f"http://127.0.0.1:{port}{URL(login).path_qs}", allow_redirects=False
                ) as preview:
                    preview.raise_for_status()
                async with session.post(
                    f"http://127.0.0.1:{port}/memory/login", data={"token": token}
                ) as response:
                    if response.status != 200 or response.url.path != "/memory":
                        raise SystemExit(f"signing in failed: {response.status}")
                for name, url in (("first page", f"{base}?page=1"), ("last page", base)):
                    await timed(session, url, 3)  # warm up: templates compiled, pools open
                    times = await timed(session, url, args.runs)
                    p95 = statistics.quantiles(times, n=20)[-1]
                    print(
                        f"GET thread view, {name:10}: median {statistics.median(times):6.1f} ms, "
                        f"p95 {p95:6.1f} ms, max {max(times):6.1f} ms ({args.runs} runs; "
                        f"target <= 300 ms)"
                    )
        finally:
            await runner.cleanup()
            await memory.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
