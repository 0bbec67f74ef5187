"""Telling a Redis outage apart from other failures, for layers that must not import redis."""

from __future__ import annotations

from collections.abc import Iterator

from redis import exceptions as rx

_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, ConnectionRefusedError)
# A full Redis (maxmemory reached, noeviction) refuses every write: the memory cannot take the
# message now, so it is refused as unavailable (retried later), not accepted and lost. A script's
# error carries the reply inside its own text, hence the match on the message too.
_OUT_OF_MEMORY = "oom command not allowed"


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
    is full."""
    for e in error_chain(exc):
        if isinstance(e, ServiceError):
            return False
        if isinstance(e, _UNAVAILABLE) or _out_of_memory(e):
            return True
    return False


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, rx.OutOfMemoryError) or (
        isinstance(exc, rx.ResponseError) and _OUT_OF_MEMORY in str(exc).lower()
    )


def memory_full(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is a full Redis refusing a write: reads still work,
    so a turn can run (and call the model) up to that write, again and again."""
    return any(_out_of_memory(e) for e in error_chain(exc))
