"""The embedded Redis: start, reuse, persistence, stale state, taken ports, capability checks."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest
import redis

from memory.connection import RedisCapabilityError, connect
from memory.redis_server import EmbeddedRedis
from tests.conftest import free_port, redis_options


@pytest.fixture
def server(tmp_path):
    embedded = EmbeddedRedis(tmp_path / "data", preferred_port=free_port(), **redis_options())
    yield embedded
    embedded.stop()


def test_starts_on_loopback_with_aof_and_is_reused(server):
    url = server.ensure_running()
    assert url.startswith("redis://127.0.0.1:")
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
    assert server.stop()
    assert server.running_url() is None
    url = server.ensure_running()
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
