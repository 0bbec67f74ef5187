"""Helpers shared by the bench scripts: a throwaway embedded Redis, and the unarXive sample.

The sample is read from the shared folder beside the repository (never copied into it), or from
a path given on the command line.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from app.settings import Settings
from memory.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
UNARXIVE_SAMPLE = SHARED / "benchmarks" / "unarxive" / "unarXive_data_sample.tar.gz"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def temporary_redis(prefix: str = "arxivscout-bench-") -> Iterator[str]:
    """An embedded Redis (search + JSON modules) in a temp dir on a free port; yields its URL.

    The server is shut down and its directory removed on exit. ARXIVSCOUT_REDIS_SERVER and
    ARXIVSCOUT_REDIS_MODULES are honoured, as the app does (EmbeddedRedis no longer reads them).
    """
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        server = EmbeddedRedis(
            Path(tmp),
            preferred_port=free_port(),
            server_binary=settings.redis_server,
            modules=settings.redis_modules,
        )
        url = server.ensure_running()
        try:
            yield url
        finally:
            server.stop()


def sample_path(given: str | None = None) -> Path:
    """The unarXive file to read: `given`, or the shared sample; exits if it is missing."""
    path = Path(given).expanduser().resolve() if given else UNARXIVE_SAMPLE.resolve()
    if not path.is_file():
        raise SystemExit(f"No unarXive file at {path}: pass its path on the command line.")
    return path
