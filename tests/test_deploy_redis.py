"""A hosted Redis as deployments meet it: a plan's client limit (Redis Cloud's free plan allows
30), a full Redis (maxmemory), a TLS port that does not answer, a certificate not trusted."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from memory.connection import RedisCapabilityError, connect
from memory.errors import memory_unavailable
from memory.redis_server import EmbeddedRedis
from tests.conftest import free_port, redis_options
from tests.support.tls import self_signed_server_context


@pytest.fixture
async def own_redis(tmp_path):
    """A Redis of the test's own: its limits change, the session's must not."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    url = server.ensure_running()
    admin = await connect(url, warm=0)
    yield url, admin
    await admin.aclose()
    server.stop()


async def test_a_client_limit_below_the_warm_up_does_not_stop_the_start(own_redis):
    url, admin = own_redis
    clients = int((await admin.config_get("maxclients"))["maxclients"])
    await admin.config_set("maxclients", 3)  # the admin holds one of the three
    try:
        client = await connect(url, warm=8)
        try:
            assert await client.ping()
        finally:
            await client.aclose()
    finally:
        await admin.config_set("maxclients", clients)


async def test_a_client_limit_reached_at_the_start_says_what_to_change(own_redis):
    url, admin = own_redis
    clients = int((await admin.config_get("maxclients"))["maxclients"])
    await admin.config_set("maxclients", 1)  # the admin's connection is the one
    try:
        with pytest.raises(RedisCapabilityError, match=r"ARXIVSCOUT_REDIS_MAX_CONNECTIONS"):
            await connect(url)
    finally:
        await admin.config_set("maxclients", clients)


async def test_a_full_redis_counts_as_memory_unavailable(own_redis):
    _, admin = own_redis
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", 1)  # less than it already uses: writes are refused
    try:
        with pytest.raises(ResponseError) as refused:
            await admin.set("arxivscout:test:oom", "x")
        assert memory_unavailable(refused.value)
        with pytest.raises(ResponseError) as in_script:  # a script's write, refused inside it
            await admin.eval("return redis.call('SET', KEYS[1], 'x')", 1, "arxivscout:test:oom")
        assert memory_unavailable(in_script.value)
    finally:
        await admin.config_set("maxmemory", 0)
    assert not memory_unavailable(ResponseError("WRONGTYPE Operation against a key"))


@pytest.fixture
async def silent_port():
    """A port that accepts connections and never says a word (a TLS handshake never ends)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()


async def test_a_rediss_url_to_a_port_that_never_answers_is_a_clear_error(silent_port):
    with pytest.raises(RedisCapabilityError, match=r"^Cannot reach Redis at rediss://.*TLS"):
        await connect(f"rediss://127.0.0.1:{silent_port}/0")


@pytest.fixture
async def untrusted_tls_port(tmp_path):
    """A TLS port whose certificate is self-signed (as a private Redis' often is)."""
    context = self_signed_server_context(tmp_path)

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0, ssl=context)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_an_untrusted_certificate_says_how_to_trust_it(untrusted_tls_port):
    with pytest.raises(RedisCapabilityError, match=r"ssl_ca_certs=.*ssl_cert_reqs=none"):
        await connect(f"rediss://127.0.0.1:{untrusted_tls_port}/0")
