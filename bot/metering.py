"""Metering: what the model calls of a turn or a background job cost.

`metered()` opens a `Meter` for a block of work; the model client (bot/llm.py) adds each call's
usage to the meter open where the call is made (a context variable, so tasks started inside the
block count to it too), whichever code path makes the call: the loop, compaction, summaries,
entity extraction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.llm import Usage


@dataclass
class Meter:
    """What the model calls made inside `metered()` cost (their usage, summed)."""

    tokens_in: int = 0
    tokens_out: int = 0
    calls: int = 0

    def add(self, usage: Usage | None) -> None:
        self.calls += 1
        if usage is not None:
            self.tokens_in += usage.prompt_tokens
            self.tokens_out += usage.completion_tokens


_METER: ContextVar[Meter | None] = ContextVar("arxivscout_llm_meter", default=None)


@contextlib.contextmanager
def metered() -> Iterator[Meter]:
    """Count every model call made in this block (and the tasks it starts) to one `Meter`."""
    meter = Meter()
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def count_call(usage: Usage | None) -> None:
    """One model call made (by bot/llm.py): counted to the open meter, if any."""
    if (meter := _METER.get()) is not None:
        meter.add(usage)
