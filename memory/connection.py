"""Connecting to Redis, and refusing one that lacks the Query Engine."""

from __future__ import annotations

import asyncio
import socket
import ssl

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoPermissionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory.autopipeline import AutoPipelineRedis

RECONNECT_TRIES = 2
CONNECT_TIMEOUT_SECONDS = 3.0
# A reply that does not come within this is a lost connection (a silent network partition, a
# failover that sent no reset): the command fails once 1 + RECONNECT_TRIES tries have timed out
# (about 15 s) and the person is told, instead of waiting ~15 min for TCP to give up (redis-py
# before 8 sets no timeout).
# Above the longest command the code issues: XREADGROUP blocks 1 s (bot/background.py),
# FT.SEARCH stops at the Query Engine's 500 ms TIMEOUT.
SOCKET_TIMEOUT_SECONDS = 5.0
# TCP keepalive probes find a dead peer on an idle pooled connection (Linux option names).
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
MIN_SEARCH_VERSION = 20400  # RediSearch 2.4: vector similarity search
# Connections of one process: Redis Cloud's free plan allows 30 clients in all (README).
MAX_CONNECTIONS = 128
WARM_CONNECTIONS = 4

WHAT_WORKS = (
    "ArxivScout needs Redis with the Query Engine (vector search). These work: "
    "Redis 8 or newer, Redis Stack 7.2+, Redis Cloud (any plan). These do not: Heroku Key-Value "
    "Store, Upstash, plain Redis 7 or older without modules. Or unset REDIS_URL to use the "
    "embedded Redis that ArxivScout starts itself."
)


class RedisCapabilityError(RuntimeError):
    """The Redis at REDIS_URL cannot hold ArxivScout's memory."""


def redact_url(url: str) -> str:
    """`url` fit to print: any user and password (the embedded Redis' is in its URL) hidden."""
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("redis", url)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


async def check_capabilities(client: aredis.Redis) -> None:
    """Probe for the FT.* commands; MODULE LIST is not allowed everywhere."""
    try:
        modules = await client.module_list()
    except ResponseError:
        modules = []
    versions = {}
    for module in modules:
        fields = {_text(k): _text(v) for k, v in module.items()}
        versions[str(fields.get("name", "")).lower()] = int(fields.get("ver") or 0)
    search_version = versions.get("search") or versions.get("searchlight")
    if search_version and search_version < MIN_SEARCH_VERSION:
        raise RedisCapabilityError(
            f"The Redis search module is version {search_version}, older than 2.4 "
            f"(no vector search). {WHAT_WORKS}"
        )
    try:
        await client.execute_command("FT._LIST")
    except NoPermissionError as exc:  # FT.* there, but not for this user
        raise RedisCapabilityError(
            f'The user in REDIS_URL may not run FT._LIST ("{exc}"): allow it the search '
            "commands (ACL category @search)."
        ) from None
    except ResponseError as exc:  # unknown command; Upstash's "not available"
        raise RedisCapabilityError(
            f"This Redis lacks the Query Engine (FT.*): it answered FT._LIST with "
            f'"{exc}". {WHAT_WORKS}'
        ) from None


async def warm_up(client: aredis.Redis, connections: int) -> None:
    """Open a few pool connections ahead of a burst (a new one costs a few ms of CPU); best
    effort: a plan's client limit (Redis Cloud's free one allows 30) must not stop the start."""
    pool = client.connection_pool
    opened = await asyncio.gather(
        *(pool.get_connection() for _ in range(connections)), return_exceptions=True
    )
    for connection in opened:
        if not isinstance(connection, BaseException):
            await pool.release(connection)


def _broke_off(exc: BaseException) -> bool:
    """A timeout, a connection closed or reset, a TLS failure: how a port of the other kind
    (TLS or plain) answers. A wrong password, an unknown host, a refused connection do not."""
    seen: BaseException | None = exc
    for _ in range(10):  # redis-py chains the socket's error; a bound in case of a cycle
        if seen is None:
            break
        if isinstance(seen, (TimeoutError, RedisTimeoutError, ConnectionResetError, ssl.SSLError)):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    return "closed" in text or "reset" in text


def reach_hint(url: str, exc: BaseException) -> str:
    """What to try when Redis cannot be reached: its client limit, or TLS (redis-py reads the
    ssl_* options from the URL)."""
    text = str(exc).lower()
    if "max number of clients" in text:
        return (
            " (the Redis plan's client limit is reached: lower ARXIVSCOUT_REDIS_MAX_CONNECTIONS "
            "or take a plan with more connections)"
        )
    if "certificate" in text:
        return (
            " (the server's TLS certificate was not accepted: add ?ssl_ca_certs=/path/to/ca.pem "
            "to REDIS_URL, or ?ssl_cert_reqs=none to skip the check)"
        )
    if url.startswith("rediss://") and _broke_off(exc):
        return " (rediss:// speaks TLS: is this port a TLS one? Plain ports take redis://)"
    if "closed" in text or "reset" in text:
        return " (if the server requires TLS, use rediss:// instead of redis://)"
    return ""


def answer_hint(exc: BaseException) -> str:
    """What to check when the connection's first commands fail: the port, when the answer is
    not Redis's protocol (an HTTP server); the user's rights (an ACL); else the server's words
    say it (a database index out of range, a busy script)."""
    if isinstance(exc, InvalidResponse):
        return " (is this a Redis port? REDIS_URL should name the port the Redis server listens on)"
    if isinstance(exc, NoPermissionError):
        return " (the user in REDIS_URL may not run it: check its ACL rules)"
    return ""


def keepalive_options() -> dict[int, int]:
    """The KEEPALIVE options this platform's sockets know (macOS lacks some)."""
    return {getattr(socket, n): v for n, v in KEEPALIVE.items() if hasattr(socket, n)}


async def connect(
    url: str, check: bool = True, warm: int = WARM_CONNECTIONS,
    socket_timeout: float = SOCKET_TIMEOUT_SECONDS, max_connections: int = MAX_CONNECTIONS,
) -> aredis.Redis:  # fmt: skip
    """A client for `url`, checked for the modules ArxivScout needs. A command whose reply
    takes longer than `socket_timeout` fails as Redis unreachable (after the retries)."""
    # A blocking pool: under a burst (hundreds of concurrent turns) callers wait for a free
    # connection instead of failing with "Too many connections".
    # A pooled connection found dead (Redis restarted) is re-opened and the command resent.
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max(max_connections, 1),
        timeout=30,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RECONNECT_TRIES),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=socket_timeout,
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),
    )
    client = AutoPipelineRedis.from_pool(pool)  # owns the pool: aclose() closes it
    try:
        await client.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await client.aclose()
        raise RedisCapabilityError(
            f"Cannot reach Redis at {redact_url(url)}: {exc or type(exc).__name__}"
            f"{reach_hint(url, exc)}"
        ) from exc
    except (ResponseError, InvalidResponse) as exc:  # a server that is not Redis, or refuses
        await client.aclose()
        raise RedisCapabilityError(
            f"Redis at {redact_url(url)} refused the connection's first command: "
            f"{exc or type(exc).__name__}{answer_hint(exc)}"
        ) from exc
    try:
        if check:
            await check_capabilities(client)
        await warm_up(client, min(warm, max_connections))
    except BaseException:
        await client.aclose()
        raise
    return client
