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
from memory.errors import in_passing, memory_unavailable
from memory.scope import Scope

log = logging.getLogger(__name__)

# How long `ask` and `chat` wait, once done, for the memory writes they queued (indexing the
# turn's messages, its entities and workflow, summaries): what a command leaves at exit is
# handed back, and nothing runs it until another process (the next command, a bot) claims it.
# Long enough for a turn's writes, short enough that a slow model does not hold the terminal
# long (a write failing is not waited for: retried only after claim_idle_ms).
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
    runtime.harness.track_own()  # its own writes are waited for at the end
    try:
        turns = runtime.turns(TalliedTurns)
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

    answered = failed = 0

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
    """Run this command's background tasks (`track_own`: not the rest of the shared stream,
    another process's or one failing for good) before it exits, for at most `seconds`: what
    a command leaves at exit is handed back and nothing runs it until another process does,
    so a fact said in one thread would reach no other. Said on stderr only when there is
    work; a write failing here is not waited for (`Harness.finish_own`). Past `seconds`, what
    runs is cut short, its delivery spent (a task always longer is dead-lettered in the end,
    not rerun by every command); on Ctrl-C, handed back unspent. Redis gone meanwhile: the
    writes stay queued, said in the log, and the command ends as its turns decided."""
    try:
        if await finish_own(runtime, seconds):
            return
        print(LEFT_QUEUED.format(seconds=seconds), file=sys.stderr)
        await runtime.harness.cut_short(spend=True)
    except asyncio.CancelledError:  # Ctrl-C: out at once, nothing waited for
        await runtime.harness.cut_short()
        raise
    except Exception as exc:
        if not memory_unavailable(exc):
            raise
        log.warning("memory writes left queued: Redis is unreachable (%r)", exc)


async def finish_own(runtime: AgentRuntime, seconds: float) -> bool:
    """Wait for this command's writes, up to `seconds`: False when the time ran out. Those
    that failed here stay queued (retried later, not waited for), said in the log only."""
    if not await runtime.harness.own_left():
        return True
    print(FINISHING, file=sys.stderr, flush=True)
    try:
        async with asyncio.timeout(seconds):
            if await runtime.harness.finish_own():
                return True
    except TimeoutError:
        return False
    log.info("memory writes that failed here stay queued, tried again by a later run")
    return True


def continue_command(args: argparse.Namespace, thread: str) -> str:
    """The command that takes this chat up again."""
    tenant = "" if args.tenant == DEFAULT_TENANT else f" --tenant {shlex.quote(args.tenant)}"
    return f"arxivscout chat --thread {shlex.quote(thread)}{tenant}"


async def run_ask(args: argparse.Namespace) -> int:
    scope = Scope.local(terminal_thread(args.thread), args.tenant)
    try:
        runtime = await open_agent(Settings.from_env())  # embeds the tools' descriptions
        runtime.harness.track_own()  # its own writes are waited for at the end
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
