"""`arxivscout chat` (the terminal REPL) and `arxivscout ask` (one question, then exit)."""

from __future__ import annotations

import argparse
import uuid

from adapters.terminal import TerminalChat
from app.commands.common import add_tenant
from app.runtime import open_agent
from app.settings import Settings
from memory.scope import Scope


def add_parser(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="talk to ArxivScout in the terminal")
    add_tenant(chat)
    chat.add_argument("--thread", help="thread id to continue (default: a new thread)")
    chat.set_defaults(handler=run_chat)

    ask = sub.add_parser("ask", help="answer one question and exit")
    add_tenant(ask)
    ask.add_argument("--thread", required=True, help="thread id")
    ask.add_argument("question")
    ask.set_defaults(handler=run_ask)


async def run_chat(args: argparse.Namespace) -> int:
    runtime = await open_agent(Settings.from_env())
    try:
        thread = args.thread or f"cli:{uuid.uuid4().hex[:8]}"
        return await TerminalChat(runtime.turns(), Scope.local(thread, args.tenant)).run()
    finally:
        await runtime.close()


async def run_ask(args: argparse.Namespace) -> int:
    runtime = await open_agent(Settings.from_env())
    try:
        reply = await runtime.turns().handle(Scope.local(args.thread, args.tenant), args.question)
        print(reply.text)
        return 0 if reply.result is None or reply.result.stop_reason == "final" else 1
    finally:
        await runtime.close()
