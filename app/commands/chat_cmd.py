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
from app.runtime import AgentRuntime, open_agent
from app.settings import Settings
from bot.turns import Reply, TurnHandler
from memory.embeddings import EmbeddingError
from memory.errors import in_passing
from memory.scope import Scope

log = logging.getLogger(__name__)

# How long `ask` and `chat` wait, once done, for the memory writes still queued (indexing the
# turn's messages, its entities and workflow, summaries): a terminal runs no worker, so what a
# command leaves waits for the next one. Long enough for a turn's writes and a small backlog,
# short enough that a model down (its writes failing, retried) does not hold the terminal long.
FINISH_WRITES_SECONDS = 30.0
FINISHING = "finishing memory writes…"
LEFT_QUEUED = (
    "memory writes not all finished in {seconds:.0f}s: the rest stays queued and is done by the "
    "next run"
)


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
        turns = TalliedTurns(runtime.turns())
        chat = TerminalChat(turns, Scope.local(thread, args.tenant))
        try:
            status = await chat.run()
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the chat, then says so
            if chat.last_question:
                print(f"To continue this chat: {continue_command(args, thread)}", file=sys.stderr)
            raise
        await finish_memory_writes(runtime)  # the end of input, /quit
        if not chat.interactive and turns.all_failed:  # piped: said as `ask` says it
            return 1
        return status
    finally:
        await runtime.close()


class TalliedTurns(TurnHandler):
    """The chat's turns, each told answered or failed as `ask` tells it (`answered`): a piped
    chat whose every message failed (the model down) exits 1, as `ask` does."""

    def __init__(self, turns: TurnHandler) -> None:
        super().__init__(turns.agent, watches=turns.watches, files=turns.files)
        self.answered = self.failed = 0

    @property
    def all_failed(self) -> bool:
        return self.failed > 0 and not self.answered

    async def handle(self, *args, **kwargs) -> Reply:  # type: ignore[override]
        try:
            reply = await super().handle(*args, **kwargs)
        except Exception:
            self.failed += 1
            raise
        if answered(reply):
            self.answered += 1
        else:
            self.failed += 1
        return reply


def answered(reply: Reply) -> bool:
    """Whether a turn answered its question: taken, and its turn ended with an answer."""
    if reply.refused:  # not taken: no answer
        return False
    return reply.result is None or reply.result.stop_reason == "final"


async def finish_memory_writes(
    runtime: AgentRuntime, seconds: float = FINISH_WRITES_SECONDS
) -> None:
    """Run the queued background tasks (this command's and any left by earlier runs: the
    whole stream, `Harness.drain`) before the command exits, for at most `seconds`: no worker
    runs beside a terminal, so a fact said in one thread would otherwise reach no other. Said
    on stderr only when there is work. Past `seconds`, or on Ctrl-C, what runs is cut short
    (`cut_short`): every task stays queued for the next run."""
    background = runtime.harness.background
    if not await background.stream.pending_count():
        return
    print(FINISHING, file=sys.stderr, flush=True)
    try:
        async with asyncio.timeout(seconds):
            await runtime.harness.drain()
    except TimeoutError:
        print(LEFT_QUEUED.format(seconds=seconds), file=sys.stderr)
        await cut_short(runtime)
    except asyncio.CancelledError:  # Ctrl-C: out at once, nothing waited for
        await cut_short(runtime)
        raise


async def cut_short(runtime: AgentRuntime) -> None:
    """Close the background work cancelled (bot/background.py `close`): the batches running
    are cut short and, with those read and not started, handed back with their delivery
    unspent, claimable at once by the next run, instead of waited for (a model call each)."""
    closing = asyncio.create_task(runtime.harness.close())
    await asyncio.sleep(0)  # it starts: a task cancelled before it runs skips its hand-back
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)


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
            print(reply.text, flush=True)  # shown before the memory writes are waited for
            await finish_memory_writes(runtime)
        finally:
            await runtime.close()
    except EmbeddingError as exc:  # not answered: said as the chat and the bots say it
        log.error("the embedding model failed: %s", exc)  # its whole text, for the operator
        print(embeddings_failed(exc))
        return 1
    return 0 if answered(reply) else 1


def embeddings_failed(exc: EmbeddingError) -> str:
    """The spine's words for an embedding model that failed: in passing (try again soon), or
    for its setup (its operator must fix it). Whether the question was kept is not known
    here, so the ending asks for it again."""
    cause = error_kind(exc)  # a provider's own text (a masked key) stays out
    if in_passing(exc):
        return f"{EMBEDDINGS_DOWN.format(cause=cause)} {AGAIN}"
    return EMBEDDINGS_BROKEN.format(cause=cause, saved=AGAIN_TILL_FIXED)
