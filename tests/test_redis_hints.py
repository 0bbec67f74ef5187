"""The hint added to "Cannot reach Redis" on a rediss:// URL: "is this port a TLS one?" only when
the port answered as a port of the other kind would (a timeout, a hang-up, a TLS error), not
for a wrong password or a refused connection, where it would send the person the wrong way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from memory.connection import RedisCapabilityError, connect
from tests.conftest import free_port
from tests.support.tls import self_signed_server_context

TLS_HINT = "is this port a TLS one?"


@pytest.fixture
async def tls_redis_port(redis_url: str, tmp_path) -> AsyncIterator[int]:
    """The session's Redis behind a TLS port (a self-signed certificate), as a hosted Redis is:
    the test Redis is built without TLS, so a local TLS terminator forwards to it."""
    context = self_signed_server_context(tmp_path)
    redis_port = urlsplit(redis_url).port
    pipes: set[asyncio.Task] = set()

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", redis_port)
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(pipe(source, sink))
            pipes.add(task)
            task.add_done_callback(pipes.discard)

    server = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=context)
    yield server.sockets[0].getsockname()[1]
    server.close()
    for task in list(pipes):
        task.cancel()


def tls_url(redis_url: str, port: int, password: str | None = None) -> str:
    """`redis_url` over TLS to `port` (the certificate not checked), with `password` if given."""
    parts = urlsplit(redis_url)
    netloc = f":{password or parts.password}@127.0.0.1:{port}"
    return parts._replace(scheme="rediss", netloc=netloc, query="ssl_cert_reqs=none").geturl()


async def test_a_wrong_password_over_tls_is_not_called_a_tls_problem(redis_url, tls_redis_port):
    client = await connect(tls_url(redis_url, tls_redis_port), warm=0)  # the TLS port works
    await client.aclose()
    with pytest.raises(RedisCapabilityError) as refused:
        await connect(tls_url(redis_url, tls_redis_port, password="not-the-password"))
    assert "invalid username-password pair" in str(refused.value)
    assert TLS_HINT not in str(refused.value)


async def test_a_refused_connection_on_a_rediss_url_is_not_called_a_tls_problem():
    with pytest.raises(RedisCapabilityError) as refused:
        await connect(f"rediss://127.0.0.1:{free_port()}/0")  # nothing listens there
    assert "refused" in str(refused.value).lower() or "111" in str(refused.value)
    assert TLS_HINT not in str(refused.value)


@pytest.fixture
async def plain_talking_port() -> AsyncIterator[int]:
    """A plain port that speaks first (as a plain Redis behind a proxy may answer a TLS hello):
    the TLS handshake fails with an ssl.SSLError."""

    async def answer_in_plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"-ERR not TLS\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_in_plain, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_a_tls_handshake_refused_by_a_plain_port_says_so(plain_talking_port):
    with pytest.raises(RedisCapabilityError) as refused:
        await connect(f"rediss://127.0.0.1:{plain_talking_port}/0")
    assert TLS_HINT in str(refused.value)
