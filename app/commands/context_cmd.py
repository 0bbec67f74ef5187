"""`arxivscout context`: print the exact memory segments the agent would see for a question."""

from __future__ import annotations

import argparse

from app.commands.common import add_json, add_tenant, memory_session, print_json, tenant_scope
from memory.context import assemble_context


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("context", help="show the context the agent would assemble")
    add_tenant(parser)
    parser.add_argument("--thread", required=True, help="thread id")
    parser.add_argument("question")
    add_json(parser)
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        context = await assemble_context(memory, tenant_scope(args, args.thread), args.question)
    if args.json:
        print_json(context.to_json())
        return 0
    print(f"# Question\n{context.question}\n")
    for segment in context.segments:
        print(f"<!-- {segment.name} Memory: {segment.tokens} tokens -->")
        print(segment.text, end="\n\n")
    print(f"<!-- total: {context.total_tokens} tokens -->")
    return 0
