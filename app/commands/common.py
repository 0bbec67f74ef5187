"""Options and helpers that several sub-commands share."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from app.runtime import open_memory
from app.settings import Settings
from memory.manager import MemoryManager
from memory.scope import Scope

DEFAULT_TENANT = "local"


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
