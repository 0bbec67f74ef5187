"""`arxivscout` on Windows: no command crashed at import any more (memory/redis_server.py
imported fcntl and memory/ingest/pdf_child.py read signal.SIGHUP at module level; Windows has
neither), and the embedded Redis, which needs fcntl, says in one line to set REDIS_URL.

Windows is played in a child interpreter that has no fcntl and no SIGHUP, as there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
AS_ON_WINDOWS = """
import signal, sys
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
del signal.SIGHUP
import memory.ingest.pdf_child
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def arxivscout_on_windows(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARXIVSCOUT_DATA_DIR": str(tmp_path), "REDIS_URL": ""}
    return subprocess.run(
        [sys.executable, "-c", AS_ON_WINDOWS, *args],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_commands_start_without_fcntl_or_sighup(tmp_path):
    done = arxivscout_on_windows(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert "arxivscout" in done.stdout


def test_the_embedded_redis_says_to_set_redis_url(tmp_path):
    done = arxivscout_on_windows(tmp_path, "redis", "start")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "arxivscout: error: the embedded Redis is Linux/macOS only; set REDIS_URL"
    )
    assert not list(tmp_path.rglob("*.pid")), "a redis-server was started"
