"""Telling a Redis outage apart from other failures, for layers that must not import redis."""

from __future__ import annotations

from redis import exceptions as rx

_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, ConnectionRefusedError)
# A full Redis (maxmemory reached, noeviction) refuses every write: the memory cannot take the
# message now, so it is refused as unavailable (retried later), not accepted and lost. A script's
# error carries the reply inside its own text, hence the match on the message too.
_OUT_OF_MEMORY = "oom command not allowed"


class ServiceError(RuntimeError):
    """A service other than Redis failed (the embedding model): what caused it, a connection
    refused say, is that service's, so the memory is never taken for down because of it."""


def memory_unavailable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says Redis could not be reached, is not ready, or
    is full."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ServiceError):
            return False
        if isinstance(exc, _UNAVAILABLE) or _out_of_memory(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, rx.OutOfMemoryError) or (
        isinstance(exc, rx.ResponseError) and _OUT_OF_MEMORY in str(exc).lower()
    )


def memory_full(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is a full Redis refusing a write: reads still work,
    so a turn can run (and call the model) up to that write, again and again."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if _out_of_memory(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
