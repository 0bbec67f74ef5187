"""The `arxivscout` command: one sub-command module per job, errors printed as one clear line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable

from app.commands import (
    chat_cmd,
    context_cmd,
    discord_cmd,
    eval_cmd,
    ingest_cmd,
    memory_cmd,
    redis_cmd,
    slack_cmd,
    tasks_cmd,
    watch_cmd,
    web_cmd,
    worker_cmd,
)
from app.commands.common import PlatformThread, log_to_file, log_to_stderr
from app.settings import Settings
from bot.errors import ConfigError
from bot.llm import LLMError
from memory.connection import RedisCapabilityError
from memory.dead_letters import UnknownDeadLetter
from memory.embeddings import EmbeddingError
from memory.errors import memory_full, memory_unavailable
from memory.governance import Busy, NotFound
from memory.keys import InvalidName
from memory.portability import BadExportLine, ImportBusy, ImportInterrupted, TenantNotEmpty
from memory.redis_server import EmbeddedRedisError
from memory.retention import InvalidRetention
from memory.stores.base import IndexModelMismatch
from memory.stores.conversation import InvalidMessage
from memory.stores.summary import UnknownSummary
from memory.stores.tool_log import UnknownToolLog
from memory.stores.watches import InvalidWatch

# The errors a user can cause or meet: printed as one line instead of a trace.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, RedisCapabilityError, EmbeddedRedisError, EmbeddingError, IndexModelMismatch,
    InvalidName, InvalidMessage, UnknownSummary, UnknownToolLog,
    NotFound, Busy, BadExportLine, TenantNotEmpty, ImportBusy, ImportInterrupted, InvalidRetention,
    InvalidWatch, UnknownDeadLetter, PlatformThread,
)  # fmt: skip
# Servers log what they do to stderr (`discord` sets up its own: discord.py's colours);
# the terminal's commands to a file (app/commands/common.py `log_to_file`).
SERVERS = ("worker", "slack", "web")
AT_THE_TERMINAL = ("chat", "ask")

COMMANDS = [
    chat_cmd,
    ingest_cmd,
    memory_cmd,
    context_cmd,
    eval_cmd,
    redis_cmd,
    slack_cmd,
    discord_cmd,
    web_cmd,
    worker_cmd,
    watch_cmd,
    tasks_cmd,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arxivscout",
        description="ArxivScout: a memory-aware research assistant for arXiv papers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable = args.handler
    try:
        configure_logging(args.command)
        result = handler(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        sys.stdout.flush()  # here, not at exit: a reader gone (`| head`) is caught below
        return int(result or 0)
    except BrokenPipeError:
        return reader_gone()
    except USER_ERRORS as exc:
        print(f"arxivscout: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, LLMError):  # the model server: down, refusing, too slow
            print(f"arxivscout: error: {exc}", file=sys.stderr)
            return 1
        if memory_unavailable(exc):  # Redis went away mid-command (a refused connection too)
            state = "is full" if memory_full(exc) else "is unreachable"
            print(f"arxivscout: error: memory (Redis) {state}: {exc}", file=sys.stderr)
            return 1
        # a file it writes: a folder that does not exist, a full disk; any other error (not a
        # file's: a bug, a timeout) is shown with its trace
        if not isinstance(exc, OSError) or exc.filename is None:
            raise
        print(f"arxivscout: error: {os_error_text(exc)}", file=sys.stderr)
        return 2


def reader_gone() -> int:
    """The reader of stdout went away (`arxivscout ... | head`): it wanted no more, so exit
    quietly instead of with a traceback. Python's own recipe (its `signal` docs): stdout onto
    /dev/null, so the flush at exit cannot fail again, and status 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


def configure_logging(command: str) -> None:
    """Where log records go, by command: a server's on stderr at INFO, with level and logger;
    `chat` and `ask` to a file in the data directory, so the terminal shows only the replies.
    Any other command (run once, by hand) keeps Python's default: its warnings on stderr."""
    if command in SERVERS:
        log_to_stderr(logging.INFO)
    elif command in AT_THE_TERMINAL:
        log_to_file(Settings.from_env().data_dir)


def os_error_text(exc: OSError) -> str:
    """A file's OSError as one line, without its `[Errno N]`: `<file>: <what went wrong>`."""
    return f"{exc.filename}: {exc.strerror or exc}"


if __name__ == "__main__":
    sys.exit(main())
