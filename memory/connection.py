"""Connecting to Redis, and refusing one that lacks the Query Engine."""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory.autopipeline import AutoPipelineRedis

RECONNECT_TRIES = 2
CONNECT_TIMEOUT_SECONDS = 3.0
MIN_SEARCH_VERSION = 20400  # RediSearch 2.4: vector similarity search

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
    except ResponseError as exc:
        if "unknown" not in str(exc).lower():
            raise
        raise RedisCapabilityError(
            f"This Redis lacks the Query Engine (FT.*). {WHAT_WORKS}"
        ) from None


async def warm_up(client: aredis.Redis, connections: int) -> None:
    """Open pool connections ahead of a burst: a new connection costs a few ms of CPU."""
    pool = client.connection_pool
    opened = await asyncio.gather(*(pool.get_connection() for _ in range(connections)))
    for connection in opened:
        await pool.release(connection)


async def connect(url: str, check: bool = True, warm: int = 32) -> aredis.Redis:
    """A client for `url`, checked for the modules ArxivScout needs."""
    # A blocking pool: under a burst (hundreds of concurrent turns) callers wait for a free
    # connection instead of failing with "Too many connections".
    # A pooled connection found dead (Redis restarted) is re-opened and the command resent.
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=128,
        timeout=30,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RECONNECT_TRIES),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
    )
    client = AutoPipelineRedis.from_pool(pool)  # owns the pool: aclose() closes it
    try:
        await client.ping()
    except (RedisConnectionError, OSError) as exc:
        await client.aclose()
        raise RedisCapabilityError(f"Cannot reach Redis at {redact_url(url)}: {exc}") from exc
    try:
        if check:
            await check_capabilities(client)
        await warm_up(client, warm)
    except BaseException:
        await client.aclose()
        raise
    return client
