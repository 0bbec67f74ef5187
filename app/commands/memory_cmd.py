"""`arxivscout memory ...` shows what a tenant's memory holds; `arxivscout reindex` re-embeds it."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from app.commands.common import add_json, add_tenant, memory_session, print_json, tenant_scope
from app.runtime import open_memory
from app.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "memory", help="inspect a tenant's threads, papers, workflows, entities"
    )
    views = parser.add_subparsers(dest="view", required=True, metavar="VIEW")
    for name, help_text in (
        ("threads", "list the tenant's threads, most recent first"),
        ("papers", "list the papers in the tenant's knowledge base"),
        ("workflows", "list the tenant's stored workflows"),
        ("entities", "list the tenant's entities"),
    ):
        view = views.add_parser(name, help=help_text)
        add_tenant(view)
        add_json(view)
        view.set_defaults(handler=run)
    thread = views.add_parser("thread", help="show a thread's messages, summaries and tool logs")
    thread.add_argument("thread_id")
    add_tenant(thread)
    add_json(thread)
    thread.set_defaults(handler=run)

    reindex = sub.add_parser("reindex", help="re-embed every index with the configured embeddings")
    reindex.set_defaults(handler=run_reindex)


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


async def run(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        data = await VIEWS[args.view](memory, args)
    if args.json:
        print_json(data)
    else:
        print(TEXT[args.view](data))
    return 0


async def _threads(memory, args):
    return [
        {"thread_id": t, "last_active": _when(ts)}
        for t, ts in await memory.conversation.threads(args.tenant)
    ]


async def _thread(memory, args):
    scope = tenant_scope(args, args.thread_id)
    return {
        "thread_id": args.thread_id,
        "messages": [asdict(m) for m in await memory.conversation.all(scope)],
        "summaries": [asdict(s) for s in await memory.summaries.for_thread(scope)],
        "tool_logs": [asdict(e) for e in await memory.tool_logs.for_thread(scope)],
    }


async def _papers(memory, args):
    return await memory.knowledge_base.papers(tenant_scope(args))


async def _workflows(memory, args):
    return await memory.workflows.all(tenant_scope(args), everywhere=True)


async def _entities(memory, args):
    return [asdict(e) for e in await memory.entities.all(tenant_scope(args), everywhere=True)]


VIEWS = {
    "threads": _threads,
    "thread": _thread,
    "papers": _papers,
    "workflows": _workflows,
    "entities": _entities,
}


def _section(title: str, rows: list[str]) -> list[str]:
    return ["", f"{title}:", *(rows or ["  (none)"])]


def _thread_text(data) -> str:
    messages = [
        f"  {_when(m['timestamp'])} {m['role']}"
        f"{' [summary ' + m['summary_id'] + ']' if m['summary_id'] else ''}: {m['content']}"
        for m in data["messages"]
    ]
    summaries = [
        f"  [Summary ID: {s['id']}] {s['description']} ({len(s['message_ids'])} messages)\n"
        f"    {s['text']}"
        for s in data["summaries"]
    ]
    logs = [
        f"  {e['id']} {e['tool_name']} {e['status']} {e['duration_ms']:.0f} ms: {e['output'][:120]!r}"
        for e in data["tool_logs"]
    ]
    lines = [f"Thread {data['thread_id']}"]
    lines += _section("Messages", messages) + _section("Summaries", summaries)
    lines += _section("Tool logs", logs)
    return "\n".join(lines)


def _papers_text(papers) -> str:
    if not papers:
        return "(no papers in this knowledge base)"
    return "\n".join(
        f"{p['arxiv_id']}  {p['title']}  ({', '.join(p['authors'][:3])}"
        f"{' et al.' if len(p['authors']) > 3 else ''}; {p['published'][:4]}; {p['chunks']} chunks)"
        for p in papers
    )


TEXT = {
    "threads": lambda rows: (
        "\n".join(f"{r['last_active']}  {r['thread_id']}" for r in rows) or "(no threads)"
    ),
    "thread": _thread_text,
    "papers": _papers_text,
    "workflows": lambda rows: "\n\n".join(rows) or "(no workflows)",
    "entities": lambda rows: (
        "\n".join(f"{e['name']} ({e['type']}): {e['description']}" for e in rows) or "(no entities)"
    ),
}


async def run_reindex(args: argparse.Namespace) -> int:
    memory = await open_memory(Settings.from_env(), check_indexes=False)
    try:
        for name, count in (await memory.reindex()).items():
            print(f"{name}: {count} records re-embedded with {memory.embedder.model_name}")
    finally:
        await memory.close()
    return 0
