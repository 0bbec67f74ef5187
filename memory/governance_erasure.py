"""What an erasure reports (`Erasure`: how many items went, per store) and why one is refused
(`NotFound`, `Busy`). Importable from `memory.governance`, the entry point."""

from __future__ import annotations

from dataclasses import dataclass, fields


class NotFound(KeyError):
    """No such item in this tenant's memory (or it belongs to another tenant)."""

    def __init__(self, what: str, item_id: str) -> None:
        super().__init__(item_id)
        self.what = what

    def __str__(self) -> str:
        return f"No {self.what} {self.args[0]!r} in this workspace's memory."


class Busy(RuntimeError):
    """Another erasure of the same tenant held its memory for too long."""


@dataclass
class Erasure:
    """What was removed, per store (counts). `summaries` counts those deleted or rewritten
    without the forgotten text, `entities` those deleted or rewritten without what a forgotten
    question taught; `messages` those made tombstones or deleted with a thread."""

    messages: int = 0
    threads: int = 0
    summaries: int = 0
    tool_logs: int = 0
    episodes: int = 0
    entities: int = 0
    workflows: int = 0
    papers: int = 0
    chunks: int = 0
    shares: int = 0  # a PDF's shares taken out (others keep it) or unnamed (the team's copy)
    cached_embeddings: int = 0
    turn_records: int = 0  # answered turns' records (memory/stores/turn_records.py)

    def __add__(self, other: Erasure) -> Erasure:
        return Erasure(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                          for f in fields(self)})  # fmt: skip

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))
