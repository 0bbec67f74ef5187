"""`arxivscout context`: print the exact memory segments the agent would see for a question."""

from __future__ import annotations

import argparse

from app.commands.common import PLATFORM_THREADS, add_json, add_tenant, memory_session, print_json
from memory.context import assemble_context
from memory.manager import MemoryManager
from memory.scope import Scope, Visibility, legacy_audience, scope_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("context", help="show the context the agent would assemble")
    add_tenant(parser)
    parser.add_argument("--thread", required=True, help="thread id (as `memory threads` lists)")
    parser.add_argument("question")
    add_json(parser)
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        scope = await place_scope(memory, args.tenant, args.thread)
        context = await assemble_context(memory, scope, args.question)
    if args.json:
        print_json(context.to_json())
        return 0
    print(f"# Question\n{context.question}\n")
    for segment in context.segments:
        print(f"<!-- {segment.name} Memory: {segment.tokens} tokens -->")
        print(segment.text, end="\n\n")
    print(f"<!-- total: {context.total_tokens} tokens -->")
    return 0


async def place_scope(memory: MemoryManager, tenant: str, thread: str) -> Scope:
    """Where the agent answers in `thread`: a Slack or Discord thread as its newest turn was
    answered (its place and asker: a DM's or private channel's memory is shown as it is
    there), else as its id names the place (`legacy_audience`: its channel's own memory and the
    team's); a terminal thread as the terminal's."""
    if not thread.startswith(PLATFORM_THREADS):
        return Scope(tenant, thread)
    newest = await memory.turn_records.of_thread(tenant, thread, limit=1)
    if newest:
        return scope_of(newest[0])
    kind, _, place = legacy_audience(thread).partition(":")
    return Scope(tenant, thread, place, Visibility(kind) if place else Visibility.PUBLIC)
