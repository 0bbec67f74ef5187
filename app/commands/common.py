"""Options and helpers that several sub-commands share."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import logging.handlers
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.runtime import open_memory
from app.settings import Settings
from memory.manager import MemoryManager
from memory.scope import Scope

DEFAULT_TENANT = "local"
# The thread ids Slack's and Discord's adapters make (`slack:<team>:<channel>:<ts>`,
# `discord:<guild>:<channel>`, `discord:dm:<channel>`): a place with its own audience and people.
PLATFORM_THREADS = ("slack:", "discord:")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = "arxivscout.log"  # the terminal's log, in the data directory
LOG_FILE_BYTES, LOG_FILE_KEPT = 5_000_000, 2  # rotated: a long-lived data dir does not fill up
HANDLER_NAME = "arxivscout"  # ours on the root logger: replaced, never added twice
# a memory-page sign-in link's token in an address (aiohttp's access log: the request line, the
# Referer): whoever reads the log must not be able to sign in with it
TOKEN_IN_ADDRESS = re.compile(r"(?i)([?&]token=)[^&\s\"']+")


class PlatformThread(ValueError):
    """A Slack or Discord thread named to a command run at the terminal."""


def terminal_thread(thread: str) -> str:
    """`thread` when the terminal may use it. A Slack or Discord thread is refused: it may be a
    DM or a private channel, whose messages the terminal's person may not read, and what they
    said there would be stored as the terminal's (public) turn. `chat`, `ask` and `context`
    refuse the same ids."""
    if thread.startswith(PLATFORM_THREADS):
        raise PlatformThread(
            f"{thread!r} is a Slack or Discord thread: the terminal takes its own threads only "
            "(a Slack or Discord thread may be private or a DM). Read it with "
            "`arxivscout memory thread`."
        )
    return thread


def log_to(handler: logging.Handler, level: int) -> None:
    """Send this process's log records of `level` and up to `handler`, one line each with the
    time, level and logger (a trace after an exception's), sign-in tokens hidden, replacing
    the handler set before (a command run twice in one process)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(HiddenTokens())
    root.addHandler(handler)
    root.setLevel(level)


class HiddenTokens(logging.Filter):
    """A record's message with any sign-in token in an address hidden (`token=***`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = TOKEN_IN_ADDRESS.sub(r"\1***", message)
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


class StderrHandler(logging.StreamHandler):
    """To `sys.stderr` as it is when a record comes (redirected meanwhile, or a test's)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def log_to_stderr(level: int = logging.INFO) -> None:
    """A server's log (worker, slack, web): what it does, on stderr for the platform to keep."""
    log_to(StderrHandler(), level)


def log_to_file(data_dir: Path, level: int = logging.INFO) -> Path:
    """The terminal chat's log, in a file of the data directory: a background failure's trace
    never lands at the `you>` prompt. Returns the file; only its owner reads it (it may quote
    what was asked)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / LOG_FILE
    path.touch(mode=0o600, exist_ok=True)
    log_to(
        logging.handlers.RotatingFileHandler(
            path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_KEPT, encoding="utf-8"
        ),
        level,
    )
    return path


def tenant_scope(args: argparse.Namespace, thread: str = "") -> Scope:
    """The scope of a command run by the operator on the server: the tenant (and a thread)."""
    return Scope(args.tenant, thread)


def add_tenant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant", default=DEFAULT_TENANT, help="team memory to use (default: local)"
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


@asynccontextmanager
async def memory_session(settings: Settings | None = None) -> AsyncIterator[MemoryManager]:
    memory = await open_memory(settings or Settings.from_env())
    try:
        yield memory
    finally:
        await memory.close()


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
