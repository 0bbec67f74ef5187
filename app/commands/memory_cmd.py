"""`arxivscout memory ...` shows what a tenant's memory holds, forgets, exports, imports and sets
its retention; `arxivscout reindex` re-embeds it."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Coroutine, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.commands.common import add_json, add_tenant, memory_session, print_json, tenant_scope
from app.commands.turns_cmd import add_usage_parser
from app.runtime import open_memory
from app.settings import Settings
from memory.governance_tenants import TenantErasures
from memory.keys import validate_tenant
from memory.portability import dumps


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "memory",
        help="inspect, forget, export, import a tenant's memory; set its retention",
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
    add_governance(views)
    add_usage_parser(views)  # `memory usage`: app/commands/turns_cmd.py

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
    data = {
        "thread_id": args.thread_id,
        "messages": [asdict(m) for m in await memory.conversation.all(scope)],
        "summaries": [asdict(s) for s in await memory.summaries.for_thread(scope)],
        "tool_logs": [asdict(e) for e in await memory.tool_logs.for_thread(scope)],
    }
    if not (data["messages"] or data["summaries"] or data["tool_logs"]):
        await _must_exist(memory, args.tenant, args.thread_id)  # a typo, or a thread emptied
    return data


async def _must_exist(memory, tenant: str, thread: str) -> None:
    """`NotFound` for a thread the tenant's memory does not know, by `memory export --thread`'s
    own check (made before its first record), so both commands agree on what exists."""
    records = memory.portability.export_thread(tenant, thread)
    try:
        await anext(records)
    finally:
        await records.aclose()


async def _papers(memory, args):
    # the operator's view, as for workflows and entities: every audience, each one shown
    return await memory.knowledge_base.papers(tenant_scope(args), everywhere=True)


async def _workflows(memory, args):
    if args.json:  # the text shows each one's id, for `memory forget workflow ID`
        return await memory.workflows.all(tenant_scope(args), everywhere=True)
    return [f"[id: {w.id}]\n{w.text}" for w in await memory.browse.workflows(args.tenant, None)]


async def _entities(memory, args):
    if args.json:
        return [asdict(e) for e in await memory.entities.all(tenant_scope(args), everywhere=True)]
    return [  # the text shows each one's id, for `memory forget entity ID`
        {"id": e.id, "name": e.name, "type": e.type, "description": e.description}
        for e in await memory.browse.entities(args.tenant, None)
    ]


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
        f"  [id: {m['id']}]"
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
        f"{'' if p.get('audience', 'public') == 'public' else '  [' + p['audience'] + ' only]'}"
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
        "\n".join(f"{e['name']} ({e['type']}): {e['description']}  [id: {e['id']}]" for e in rows)
        or "(no entities)"
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


# -- forget, export, import, retention ---------------------------------------------------------

FORGET_KINDS = (
    "message", "thread", "summary", "tool-log", "paper", "entity", "workflow", "person", "tenant",
)  # fmt: skip
ERASED = {  # Erasure field -> how it is printed
    "threads": "threads", "messages": "messages", "summaries": "summaries (deleted or rewritten)",
    "tool_logs": "tool logs", "episodes": "episodic entries", "entities": "entities",
    "workflows": "workflows", "papers": "papers", "chunks": "passages",
    "shares": "shares of PDFs that stay",
    "cached_embeddings": "cached embeddings", "turn_records": "turn records",
    "watches": "topic watches", "dead_letters": "dead letters",
}  # fmt: skip


def add_governance(views: argparse._SubParsersAction) -> None:
    forget = views.add_parser(
        "forget",
        help="forget an item, everything about a person, or a whole tenant (`tenant ID`)",
    )
    forget.add_argument("kind", choices=FORGET_KINDS)
    forget.add_argument(
        "item_id", metavar="ID", help="its id (a thread id, a user id, the tenant for `tenant`)"
    )
    forget.add_argument("--thread", help="the message's thread (for `message`)")
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    export = views.add_parser("export", help="export the tenant (or one thread) as JSON Lines")
    export.add_argument("--thread", help="only this thread")
    export.add_argument("-o", "--output", help="write to this file (default: standard output)")
    load = views.add_parser("import", help="import an export into an empty tenant")
    load.add_argument("file", help="a JSON Lines export ('-': standard input)")
    retention = views.add_parser(
        "retention", help="show or set how long conversation memory is kept"
    )
    period = retention.add_mutually_exclusive_group()
    period.add_argument("--days", type=float, help="keep conversation memory this many days")
    period.add_argument("--off", action="store_true", help="keep it for ever")
    period.add_argument(
        "--default",
        action="store_true",
        help="drop the tenant's own setting (ARXIVSCOUT_RETENTION_DAYS applies)",
    )
    for parser, handler in (
        (forget, run_forget),
        (export, run_export),
        (load, run_import),
        (retention, run_retention),
    ):
        add_tenant(parser)
        if parser is not export:
            add_json(parser)
        parser.set_defaults(handler=handler)


def erased_text(counts: dict[str, int]) -> str:
    parts = [f"{n} {ERASED.get(name, name)}" for name, n in counts.items() if n]
    return ", ".join(parts) if parts else "nothing"


def confirmed(question: str, yes: bool) -> bool:
    """Asked only of a person at a terminal; `--yes` and piped input go ahead. Ctrl-D is no."""
    if yes or not sys.stdin.isatty():
        return True
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        print()  # the prompt's line ends
        return False
    return answer.strip().lower() in ("y", "yes")


def run_forget(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """Asks first, then returns the forgetting for `main` to run: asked outside the event
    loop, where Ctrl-C at the question ends the command at once."""
    if args.kind == "message" and not args.thread:
        print("arxivscout: error: forgetting a message needs its --thread.", file=sys.stderr)
        return 2
    if args.kind == "tenant":
        return run_forget_tenant(args)
    what = f"the {args.kind.replace('-', ' ')} {args.item_id!r}"
    what += f" of thread {args.thread!r}" if args.kind == "message" else ""
    if not confirmed(f"Forget {what} in tenant {args.tenant!r}? This cannot be undone.", args.yes):
        print("Nothing was forgotten.")
        return 1
    return forget_item(args, what)


async def forget_item(args: argparse.Namespace, what: str) -> int:
    async with memory_session() as memory:
        governance, tenant, item = memory.governance, args.tenant, args.item_id
        forget = {
            "message": lambda: governance.forget_message(tenant, args.thread, item),
            "thread": lambda: governance.forget_thread(tenant, item),
            "summary": lambda: governance.forget_summary(tenant, item),
            "tool-log": lambda: governance.forget_tool_log(tenant, item),
            "paper": lambda: governance.forget_paper(tenant, item),
            "entity": lambda: governance.forget_entity(tenant, item),
            "workflow": lambda: governance.forget_workflow(tenant, item),
            "person": lambda: governance.forget_person(tenant, item),
        }[args.kind]
        counts = asdict(await forget())
    if args.json:
        print_json(counts)
    else:
        print(f"Forgot {what}. Removed: {erased_text(counts)}.")
    return 0


def run_forget_tenant(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """`forget tenant ID`: the whole tenant (its ID; `--tenant` is not read), as when its team
    removed the bot (memory/governance_tenants.py)."""
    tenant = validate_tenant(args.item_id)
    question = f"Erase everything tenant {tenant!r} holds, in every store? This cannot be undone."
    if not confirmed(question, args.yes):
        print("Nothing was forgotten.")
        return 1
    return forget_tenant(args, tenant)


async def forget_tenant(args: argparse.Namespace, tenant: str) -> int:
    async with memory_session() as memory:
        erasure = await TenantErasures(memory).erase(tenant)
    if not erasure.total:  # a typo, or erased before: say so, as for an unknown id
        print(f"arxivscout: error: tenant {tenant!r} holds no memory: nothing was erased.",
              file=sys.stderr)  # fmt: skip
        return 2
    counts = asdict(erasure)
    if args.json:
        print_json(counts)
    else:
        print(f"Forgot tenant {tenant!r}. Removed: {erased_text(counts)}.")
    return 0


async def run_export(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        portability = memory.portability
        if args.thread:
            records = portability.export_thread(args.tenant, args.thread)
        else:
            records = portability.export_tenant(args.tenant)
        if not args.output:
            async for record in records:
                sys.stdout.write(dumps(record) + "\n")
            sys.stdout.flush()
            return 0
        target = Path(args.output)
        partial = target.with_name(target.name + ".part")  # a failed export leaves no file
        count = 0
        try:
            with partial.open("w", encoding="utf-8") as out:
                async for record in records:
                    out.write(dumps(record) + "\n")
                    count += record.get("kind") != "end"  # the closing line is not a record
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    print(f"Exported {count} records to {target}.", file=sys.stderr)
    return 0


def not_utf8() -> int:
    """An import's input that is not UTF-8: said, and the command's exit status."""
    print("arxivscout: error: the file is not UTF-8 text; nothing was imported.", file=sys.stderr)
    return 2


async def run_import(args: argparse.Namespace) -> int:
    if args.file == "-":
        # UTF-8, as a file is read, whatever the locale's encoding; split on "\n" alone:
        # `splitlines` also cuts at U+2028, U+2029 and U+0085, which an export keeps raw inside
        # its JSON strings (a record cut in two)
        try:
            text = sys.stdin.buffer.read().decode("utf-8").split("\n")
        except UnicodeDecodeError:
            return not_utf8()

        def lines() -> Iterator[str]:
            return iter(text)
    else:
        path = Path(args.file)
        if not path.is_file():
            print(f"arxivscout: error: no such file: {path}", file=sys.stderr)
            return 2

        def lines() -> Iterator[str]:
            with path.open(encoding="utf-8") as handle:
                yield from handle

    async with memory_session() as memory:
        try:
            counts = await memory.portability.import_lines(args.tenant, lines)
        except UnicodeDecodeError:
            return not_utf8()
    if args.json:
        print_json(counts)
    else:
        done = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items() if n)
        print(f"Imported into tenant {args.tenant!r}: {done or 'nothing'}.")
    return 0


async def run_retention(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        retention, tenant = memory.retention, args.tenant
        if args.days is not None:
            await retention.set(tenant, args.days)
        elif args.off:
            await retention.set(tenant, None)
        elif args.default:
            await retention.clear(tenant)
        has_own, _ = await retention.own(tenant)
        days, last = await retention.get(tenant), await retention.last_sweep(tenant)
    if args.json:
        print_json({"tenant": tenant, "days": days, "own": has_own, "last_sweep": last})
        return 0
    kept = f"kept {days:g} days" if days is not None else "kept for ever"
    source = "its own setting" if has_own else "the default, ARXIVSCOUT_RETENTION_DAYS"
    print(f"Conversation memory of tenant {tenant!r} is {kept} ({source}).")
    if days is not None:
        print(
            "Older messages, summaries, tool logs and episodic entries are removed by a "
            "running bot's sweep (hourly); papers, entities and workflows are kept."
        )
    if last:
        counts = {k: int(v) for k, v in last.items() if k in ERASED}
        print(f"Last sweep: {_when(last['at'])}, removed {erased_text(counts)}.")
    return 0
