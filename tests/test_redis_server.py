"""The embedded Redis: start, reuse, persistence, stale state, taken ports, capability checks,
and its lock-down (password, owner-only files) including the upgrade of an older install."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memory.connection import RedisCapabilityError, connect, redact_url
from memory.redis_server import EmbeddedRedis, _server_binary
from tests.conftest import free_port, redis_options


@pytest.fixture
def server(tmp_path):
    embedded = EmbeddedRedis(tmp_path / "data", preferred_port=free_port(), **redis_options())
    yield embedded
    embedded.stop()


def test_starts_on_loopback_with_aof_and_is_reused(server):
    url = server.ensure_running()
    assert urlsplit(url).hostname == "127.0.0.1"
    client = redis.Redis.from_url(url)
    assert client.config_get("appendonly")["appendonly"] == "yes"
    assert client.config_get("bind")["bind"] == "127.0.0.1"
    assert client.config_get("dir")["dir"] == str(server.home)
    pid = int(server.pid_file.read_text())
    assert server.ensure_running() == url  # a second caller reuses it
    assert int(server.pid_file.read_text()) == pid


def test_data_survives_restart(server):
    url = server.ensure_running()
    redis.Redis.from_url(url).rpush("arxivscout:probe", "kept")
    password = server.password()
    assert server.stop()
    assert server.running_url() is None
    url = server.ensure_running()
    assert server.password() == password  # made once, kept with the data
    assert redis.Redis.from_url(url).lrange("arxivscout:probe", 0, -1) == [b"kept"]


def test_stale_pid_file_is_replaced(server):
    server.home.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    server.pid_file.write_text(str(dead.pid))
    server.port_file.write_text(str(server.preferred_port))
    url = server.ensure_running()
    assert redis.Redis.from_url(url).ping()
    assert int(server.pid_file.read_text()) != dead.pid


def test_taken_port_moves_to_a_free_one(server):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", server.preferred_port))
        squatter.listen()
        url = server.ensure_running()
    assert not url.endswith(f":{server.preferred_port}/0")
    assert redis.Redis.from_url(url).ping()


def test_stop_when_not_running(server):
    assert server.stop() is False


async def test_redis_without_search_module_is_refused(tmp_path):
    binary = redis_options()["server_binary"]
    plain = EmbeddedRedis(
        tmp_path / "plain", preferred_port=free_port(), server_binary=binary, modules=""
    )
    url = plain.ensure_running()
    try:
        with pytest.raises(RedisCapabilityError) as error:
            await connect(url)
        message = str(error.value)
        assert "Query Engine" in message and "Redis 8" in message and "Upstash" in message
    finally:
        plain.stop()


async def test_unreachable_redis_url_is_a_clear_error():
    with pytest.raises(
        RedisCapabilityError, match=re.escape("Cannot reach Redis at redis://***@127.0.0.1")
    ):
        await connect(f"redis://user:secret@127.0.0.1:{free_port()}/0")


def test_cli_refuses_redis_without_modules(tmp_path, cli_env):
    binary = redis_options()["server_binary"]
    plain = EmbeddedRedis(
        tmp_path / "plain", preferred_port=free_port(), server_binary=binary, modules=""
    )
    url = plain.ensure_running()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "memory", "threads"],
            env={**cli_env, "REDIS_URL": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2
        assert "arxivscout: error: This Redis lacks the Query Engine" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        plain.stop()


async def test_memory_survives_a_restart(server, local_embedder):
    from memory.embeddings import CachedEmbedder
    from memory.manager import MemoryManager
    from memory.scope import Scope
    from tests.test_memory_stores import add_memgpt

    async def open_memory() -> MemoryManager:
        client = await connect(server.ensure_running())
        return await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()

    scope = Scope("team", "t")
    memory = await open_memory()
    await memory.conversation.append(scope, "user", "remember me")
    await add_memgpt(memory, "team")
    await memory.close()
    assert server.stop()

    memory = await open_memory()  # a new server process, replaying the AOF
    try:
        assert [m.content for m in await memory.conversation.all(scope)] == ["remember me"]
        question = "memory tiers"
        hits = await memory.knowledge_base.search(
            Scope("team"), question, await memory.embedder.embed_one(question)
        )
        assert hits and hits[0].arxiv_id == "2310.08560"
    finally:
        await memory.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_owner_only(server: EmbeddedRedis) -> None:
    """The data and redis/ directories 0700, and every file and folder under redis/ private."""
    assert mode(server.data_dir) == 0o700
    assert mode(server.home) == 0o700
    assert mode(server.password_file) == 0o600
    aof_files = list((server.home / "appendonlydir").iterdir())
    assert aof_files, "no AOF written"
    for path in server.home.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def assert_password_required(server: EmbeddedRedis, url: str) -> None:
    port = urlsplit(url).port
    for password in (None, "not-the-password"):
        with pytest.raises(redis.AuthenticationError):  # NOAUTH / invalid password, no retries
            redis.Redis(port=port, password=password, retry=Retry(NoBackoff(), 0)).ping()
    assert urlsplit(url).password == server.password()
    assert redis.Redis.from_url(url).ping()


def test_data_is_the_users_alone(server):
    url = server.ensure_running()
    redis.Redis.from_url(url).set("arxivscout:probe", "a DM")  # so the AOF holds data
    assert_owner_only(server)
    assert_password_required(server, url)
    assert len(server.password()) >= 32
    pid = int(server.pid_file.read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # Linux: what `ps` would show
        assert server.password().encode() not in cmdline.read_bytes()
    assert server.password() not in redact_url(url)


def test_a_second_server_has_its_own_password(server, tmp_path):
    other = EmbeddedRedis(tmp_path / "other", preferred_port=free_port(), **redis_options())
    try:
        other_url = other.ensure_running()
        server.ensure_running()
        assert other.password() != server.password()
        assert_password_required(other, other_url)
    finally:
        other.stop()


def start_old_style(server: EmbeddedRedis) -> int:
    """An install from before the lock-down: no password, 0755/0644 files, a running server."""
    server.home.mkdir(parents=True)
    server.data_dir.chmod(0o755)
    server.home.chmod(0o755)
    port = server.preferred_port
    binary = _server_binary(redis_options()["server_binary"])
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(server.home),
            "--appendonly", "yes", "--save", "", "--daemonize", "yes",
            "--pidfile", str(server.pid_file), "--logfile", str(server.log_file)]  # fmt: skip
    subprocess.run(args, check=True, capture_output=True, umask=0o022)
    server.port_file.write_text(str(port))
    server.port_file.chmod(0o644)
    redis.Redis(host="127.0.0.1", port=port).set("arxivscout:probe", "an old DM")
    for _ in range(200):  # the daemon writes its pid file once it runs
        if server.pid_file.exists():
            break
        time.sleep(0.05)
    return int(server.pid_file.read_text())


@pytest.fixture
def old_pid(server):
    """The pid of an old-style server; killed afterwards if the upgrade left it running."""
    pid = start_old_style(server)
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def test_an_old_install_is_locked_down_on_start(server, old_pid):
    aof = server.home / "appendonlydir"
    assert mode(aof) == 0o755 and not server.password_file.exists()  # really loose before
    assert server.running_url() is None  # an unprotected server is not handed out

    url = server.ensure_running()

    assert int(server.pid_file.read_text()) != old_pid  # restarted with the password
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)  # the unprotected one is gone, not left holding the same AOF
    assert_owner_only(server)
    assert_password_required(server, url)
    assert redis.Redis.from_url(url).get("arxivscout:probe") == b"an old DM"  # AOF kept
    assert server.running_url() == url


def test_a_lost_password_file_restarts_the_server_with_a_new_one(server):
    url = server.ensure_running()
    redis.Redis.from_url(url).set("arxivscout:probe", "kept")
    old_pid, old_password = int(server.pid_file.read_text()), server.password()
    server.password_file.unlink()
    assert server.running_url() is None

    url = server.ensure_running()

    assert int(server.pid_file.read_text()) != old_pid
    assert server.password() != old_password
    assert_password_required(server, url)
    assert redis.Redis.from_url(url).get("arxivscout:probe") == b"kept"


def test_new_data_directory_is_created_owner_only(tmp_path):
    nested = EmbeddedRedis(tmp_path / "a" / "data", preferred_port=free_port())
    nested.password()
    assert mode(nested.data_dir) == 0o700 and mode(nested.home) == 0o700
    assert mode(nested.password_file) == 0o600
    assert os.listdir(nested.home) == ["redis.password"]  # no stray temporary file


async def test_healthz_says_down_without_the_error(server, local_embedder):
    """Redis refusing our client (its password changed under it) is reported as down, and the
    reply carries nothing of the error: not its text, not the host, not a password."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from adapters.web import health_routes
    from memory.embeddings import CachedEmbedder
    from memory.manager import MemoryManager

    client = await connect(server.ensure_running(), warm=1)
    memory = MemoryManager(client, CachedEmbedder(local_embedder, client))
    app = web.Application()
    app.add_routes(health_routes(memory))
    old_password = server.password()
    try:
        async with TestClient(TestServer(app)) as http:
            response = await http.get("/healthz")
            assert response.status == 200 and await response.json() == {"ok": True, "redis": "up"}

            server.password_file.unlink()
            server.ensure_running()  # restarted with a new password: our client is refused
            response = await http.get("/healthz")
            body = await response.text()
            assert response.status == 503
            assert await response.json() == {"ok": False, "redis": "down"}
            for leak in ("127.0.0.1", "password", "Error", old_password, server.password()):
                assert leak not in body
    finally:
        await client.aclose()
