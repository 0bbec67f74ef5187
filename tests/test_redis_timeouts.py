"""A Redis that goes silent (a network partition, a failover that sends no reset) is reported
as unreachable within the socket timeout, not after TCP gives up (~15 min): through a local
TCP proxy that stops forwarding, with the real Redis behind it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory.connection import SOCKET_TIMEOUT_SECONDS, connect
from memory.errors import memory_unavailable

SMALL_TIMEOUT = 0.5  # the test's socket timeout (a few tries of it fail the command)
HANG_GUARD_SECONDS = 10  # only stops a hang: without the timeout the read would wait for TCP


class RedisProxy:
    """Forwards TCP to Redis. `go_silent()`: every connection stays open and nothing is
    forwarded either way, as over a partitioned network. `cut()`: every connection is closed
    and new ones are closed as soon as they open, as when Redis is down; `restore()` ends both."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.silent = False
        self.down = False
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def url_for(self, redis_url: str) -> str:
        """`redis_url` with this proxy's port instead of Redis'."""
        assert self.server is not None
        parts = urlsplit(redis_url)
        port = self.server.sockets[0].getsockname()[1]
        return parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}").geturl()

    def go_silent(self) -> None:
        self.silent = True

    def cut(self) -> None:
        self.down = True
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    def restore(self) -> None:
        self.silent = self.down = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, upstream_writer]
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                if self.silent:
                    continue  # swallowed: the sender sees an open, silent connection
                sink.write(data)
                await sink.drain()
        sink.close()  # one side closed: so is the other, as across a real proxy

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@contextlib.asynccontextmanager
async def redis_proxy(redis_url: str) -> AsyncIterator[RedisProxy]:
    parts = urlsplit(redis_url)
    proxy = RedisProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def proxied_url(redis_url: str):
    """`redis_url`, through a RedisProxy; yields (url, proxy)."""
    async with redis_proxy(redis_url) as proxy:
        yield proxy.url_for(redis_url), proxy


async def test_a_silent_redis_fails_the_command_instead_of_hanging(proxied_url):
    url, proxy = proxied_url
    client = await connect(url, check=False, warm=1, socket_timeout=SMALL_TIMEOUT)
    try:
        assert await client.ping()
        proxy.go_silent()
        with pytest.raises((RedisTimeoutError, RedisConnectionError)) as raised:
            await asyncio.wait_for(client.get("anything"), HANG_GUARD_SECONDS)
        assert memory_unavailable(raised.value)  # what the turn turns into MEMORY_DOWN
    finally:
        await client.aclose()


async def test_pooled_connections_set_a_timeout_and_keepalive_whatever_redis_py_defaults(
    redis_url,
):
    """redis-py before 8 sets neither: the pool asks for both itself."""
    client = await connect(redis_url, check=False, warm=0)
    try:
        options = client.connection_pool.connection_kwargs
        assert options["socket_timeout"] == SOCKET_TIMEOUT_SECONDS
        assert options["socket_keepalive"] is True
        connection = await client.connection_pool.get_connection()
        try:
            sock = connection._writer.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        finally:
            await client.connection_pool.release(connection)
    finally:
        await client.aclose()
