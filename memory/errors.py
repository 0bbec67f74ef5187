"""Telling a Redis outage apart from other failures, and a service's failure that may pass
from one that will not, for every layer (those that must not import redis too)."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import openai
from redis import exceptions as rx

# A bare ConnectionRefusedError is Redis's only when nothing of another service's (below) came
# before it in the chain: redis-py wraps its own, a refusal without a wrapper is the memory's.
_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, ConnectionRefusedError)
# Another service's error (Slack's or Discord's HTTP client, the model's): what caused it, a
# connection refused say, is that service's, so the walk of its causes stops there.
_OTHER_SERVICES = (aiohttp.ClientError, openai.APIError)
_OTHER_CLIENTS = ("httpx", "httpcore", "httpx2", "httpcore2")  # openai's HTTP client, by name
# A full Redis (maxmemory reached, noeviction) refuses every write: the memory cannot take the
# message now, so it is refused as unavailable (retried later), not accepted and lost. A script's
# error carries the reply inside its own text, hence the match on the message too.
_OUT_OF_MEMORY = "oom command not allowed"
# What a service failing in passing raises (`in_passing`): no connection or a timeout
PASSING_ERRORS = (openai.APIConnectionError, aiohttp.ClientError, OSError, TimeoutError)


class Deferred(Exception):
    """Work that cannot start now through no fault of its own: what it needs is held by a long
    job that will end (an import holding the tenant's erasure lock). A background task failing
    so is put back with its delivery unspent and tried again later (bot/background.py): waiting
    in a worker, or being dead-lettered after a few tries, would be wrong for it."""


class ServiceError(RuntimeError):
    """A service other than Redis failed (the embedding model): what caused it, a connection
    refused say, is that service's, so the memory is never taken for down because of it."""


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then what caused it, and so on (its `__cause__`, else its `__context__`); each
    once, as a chain may loop."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def memory_unavailable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says Redis could not be reached, is not ready, or
    is full. Another service's error (`ServiceError`, Slack's refused connection) ends the
    search: taken for the memory down, its job would be retried for ever, never counted."""
    for e in error_chain(exc):
        if _of_another_service(e):
            return False
        if isinstance(e, _UNAVAILABLE) or _out_of_memory(e):
            return True
    return False


def _of_another_service(exc: BaseException) -> bool:
    return isinstance(exc, (ServiceError, *_OTHER_SERVICES)) or (
        type(exc).__module__.split(".")[0] in _OTHER_CLIENTS
    )


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, rx.OutOfMemoryError) or (
        isinstance(exc, rx.ResponseError) and _OUT_OF_MEMORY in str(exc).lower()
    )


def memory_full(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is a full Redis refusing a write: reads still work,
    so a turn can run (and call the model) up to that write, again and again."""
    return any(_out_of_memory(e) for e in error_chain(exc))


def in_passing(exc: BaseException) -> bool:
    """Whether a service's failure may pass by itself: no connection, a timeout, throttled
    (429), its own error (5xx), read from what caused it. Anything else (401, a model not
    found or not installed, vectors of the wrong size) is its setup's, said as such."""
    for cause in list(error_chain(exc))[1:]:
        status = getattr(cause, "status_code", None)
        if isinstance(status, int):
            return status in (408, 429) or status >= 500
        if isinstance(cause, PASSING_ERRORS):
            return True
    return False
