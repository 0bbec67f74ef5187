"""Telling a Redis outage apart from other failures, for layers that must not import redis."""

from __future__ import annotations

from redis import exceptions as rx

_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, ConnectionRefusedError)


def memory_unavailable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says Redis could not be reached or is not ready."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _UNAVAILABLE):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
