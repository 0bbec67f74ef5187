"""Who reads the memory page: the audiences a reader may see (`Audiences`, `Reader`, `sees`),
and `Reads`, the base of `Browse`'s parts (memory/browse.py)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from memory.scope import PUBLIC, Scope

Audiences = Collection[str] | None  # what a reader may see; None: everything (an admin)


@dataclass(frozen=True, slots=True)
class Reader(Scope):
    """A tenant-wide place that sees exactly `seen` (with `everything`, whatever exists): the
    stores' reads take a `Scope`, and a reader of the page may see many places at once."""

    seen: tuple[str, ...] = (PUBLIC,)
    everything: bool = False

    @property
    def audiences(self) -> tuple[str, ...]:
        return self.seen

    def can_see(self, audience: str | None) -> bool:
        return self.everything or (audience or PUBLIC) in self.seen


def sees(audiences: Audiences, audience: str) -> bool:
    return audiences is None or audience in audiences


class Reads:
    """Reads over the stores of one `MemoryManager`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.redis = memory.redis

    @staticmethod
    def reader(tenant: str, audiences: Audiences, thread: str = "") -> Reader:
        if audiences is None:
            return Reader(tenant, thread, everything=True)
        return Reader(tenant, thread, seen=tuple(sorted(set(audiences))))
