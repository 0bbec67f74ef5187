"""`arxivscout chat` (the terminal REPL) and `arxivscout ask` (one question, then exit)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import sys
import uuid

from adapters.spine import AGAIN, AGAIN_TILL_FIXED, EMBEDDINGS_BROKEN, EMBEDDINGS_DOWN, error_kind
from adapters.terminal import TerminalChat
from app.commands.common import DEFAULT_TENANT, add_tenant, terminal_thread
from app.runtime import open_agent
from app.settings import Settings
from memory.embeddings import EmbeddingError
from memory.errors import in_passing
from memory.scope import Scope

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="talk to ArxivScout in the terminal")
    add_tenant(chat)
    chat.add_argument("--thread", help="terminal thread id to continue (default: a new thread)")
    chat.set_defaults(handler=run_chat)

    ask = sub.add_parser("ask", help="answer one question and exit")
    add_tenant(ask)
    ask.add_argument("--thread", required=True, help="terminal thread id")
    ask.add_argument("question")
    ask.set_defaults(handler=run_ask)


async def run_chat(args: argparse.Namespace) -> int:
    thread = terminal_thread(args.thread or f"cli:{uuid.uuid4().hex[:8]}")  # before Redis opens
    runtime = await open_agent(Settings.from_env())
    try:
        chat = TerminalChat(runtime.turns(), Scope.local(thread, args.tenant))
        try:
            return await chat.run()
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the chat, then says so
            if chat.last_question:
                print(f"To continue this chat: {continue_command(args, thread)}", file=sys.stderr)
            raise
    finally:
        await runtime.close()


def continue_command(args: argparse.Namespace, thread: str) -> str:
    """The command that takes this chat up again."""
    tenant = "" if args.tenant == DEFAULT_TENANT else f" --tenant {shlex.quote(args.tenant)}"
    return f"arxivscout chat --thread {shlex.quote(thread)}{tenant}"


async def run_ask(args: argparse.Namespace) -> int:
    scope = Scope.local(terminal_thread(args.thread), args.tenant)
    try:
        runtime = await open_agent(Settings.from_env())  # embeds the tools' descriptions
        try:
            reply = await runtime.turns().handle(scope, args.question)
        finally:
            await runtime.close()
    except EmbeddingError as exc:  # not answered: said as the chat and the bots say it
        log.error("the embedding model failed: %s", exc)  # its whole text, for the operator
        print(embeddings_failed(exc))
        return 1
    print(reply.text)
    if reply.refused:  # not taken: no answer
        return 1
    return 0 if reply.result is None or reply.result.stop_reason == "final" else 1


def embeddings_failed(exc: EmbeddingError) -> str:
    """The spine's words for an embedding model that failed: in passing (try again soon), or
    for its setup (its operator must fix it). Whether the question was kept is not known
    here, so the ending asks for it again."""
    cause = error_kind(exc)  # a provider's own text (a masked key) stays out
    if in_passing(exc):
        return f"{EMBEDDINGS_DOWN.format(cause=cause)} {AGAIN}"
    return EMBEDDINGS_BROKEN.format(cause=cause, saved=AGAIN_TILL_FIXED)
