"""A message as episodic memory keeps it (`Episode`), and the segment recall's chosen messages
render to: a header per thread, `Name: text` lines, the date where it changes.

Kept apart from `episodic` (the store) so the record and its rendering read without Redis; the
store re-exports `Episode` and `indexed`, and serves the rendering as `EpisodicStore.segment`.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, replace

from memory.scope import PUBLIC
from memory.stores.base import Segment
from memory.stores.episodic_text import parts

# Of a longer message (a model's answer can run to 250,000 characters), episodic memory keeps
# the first INDEXED_CHARS: what it stores, searches by its words, splits into parts and shows,
# with a note of what the thread's conversation holds beyond it. A vector embeds at most
# EMBEDDED_CHARS: under the 8,191-token input of OpenAI's embedding models in any script
# (MiniLM reads only its first 256 tokens anyway).
INDEXED_CHARS = 8_000
EMBEDDED_CHARS = 6_000


@dataclass
class Episode:
    """One message as episodic memory keeps it; `seq` is its position in its thread."""

    id: str
    thread: str
    channel: str = ""
    audience: str = PUBLIC
    author: str = ""
    author_name: str = ""
    role: str = "user"
    text: str = ""
    ts: float = 0.0
    seq: int = 0
    previous_ts: float | None = None  # when the thread's message before it was said, if known

    @property
    def speaker(self) -> str:
        name = self.author_name or self.author or self.role
        return name.lstrip("/ \t") or self.role  # a line starts where the token counter cuts

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.ts))

    @property
    def embedding_text(self) -> str:
        """What a message's vector embeds: who said it, then what, so that a question about
        someone lands nearer their own messages than the ones addressed to them."""
        return f"{self.speaker}: {self.text}"[:EMBEDDED_CHARS]

    def part_texts(self) -> list[str]:
        """What the vectors of its parts embed (see `parts`): none for a one-part message."""
        return [f"{self.speaker}: {part}"[:EMBEDDED_CHARS] for part in parts(self.text)]

    def line(self, when: str = "") -> str:
        """Its line in the rendering, after `when` it was said (given where that changes)."""
        head = f"{when} {self.speaker}" if when else self.speaker
        return f"{head}: {self.text.strip()}\n"


def indexed(e: Episode) -> Episode:
    """`e` as episodic memory keeps it: its first INDEXED_CHARS characters, and a note of how
    many more the thread's conversation holds (a note counted with the line's tokens)."""
    if len(e.text) <= INDEXED_CHARS:
        return e
    more = len(e.text) - INDEXED_CHARS
    note = f" [... {more:,} more characters in the thread's conversation]"
    return replace(e, text=e.text[:INDEXED_CHARS] + note)


# -- rendering ---------------------------------------------------------------------------------


def segment(episodes: list[Episode], rendered: dict[tuple[str, ...], str] | None = None) -> Segment:
    """Threads in the order given, each oldest first, one `Name: text` line a message; the
    day starts the line where it changes (`8 May 2023`, the year only when it changes), and
    a blank line marks skipped messages. `rendered` remembers each thread's item by its
    messages' ids, for a caller rendering subsets of the same messages again (`pick`)."""
    rendered = {} if rendered is None else rendered
    threads: dict[str, list[Episode]] = {}
    for e in episodes:
        threads.setdefault(e.thread, []).append(e)
    items = []
    for members in threads.values():
        members.sort(key=lambda e: e.seq)
        key = tuple(e.id for e in members)
        if (item := rendered.get(key)) is None:
            item = rendered[key] = _thread_item(members)
        items.append(item)
    return Segment(
        name="Episodic",
        description="earlier messages of this team's threads that bear on the question.",
        usage="recall who said what and when: a date holds until the next one, a year "
        "too; a blank line marks skipped messages.",
        items=items,
        empty_note="(no related earlier messages)",
    )


def _thread_item(members: list[Episode]) -> str:
    """A thread's item: its header, then its messages (in order of `seq`) a line each."""
    lines = [_thread_line(members[0])]
    last: Episode | None = None
    last_day: tuple[int, int, int] | None = None  # `last.date`, as numbers: read once each
    year = 0
    for e in members:
        if last is not None and e.seq != last.seq + 1:
            lines.append("\n")
        when = ""
        day = time.gmtime(e.ts)
        this_day = (day.tm_year, day.tm_mon, day.tm_mday)
        if this_day != last_day:
            when = f"{day.tm_mday} {calendar.month_abbr[day.tm_mon]}"
            when += f" {day.tm_year}" if day.tm_year != year else ""
            year = day.tm_year
        lines.append(e.line(when))
        last, last_day = e, this_day
    return "".join(lines).rstrip("\n")


def _thread_line(e: Episode) -> str:
    where = f"#{e.channel} " if e.channel else ""
    return f"{where}thread {e.thread}\n"


def _ordered(units: list[list[Episode]]) -> list[Episode]:
    """Rendering order: threads by their best unit, messages by position."""
    rank: dict[str, int] = {}
    for unit in units:
        for e in unit:
            rank.setdefault(e.thread, len(rank))
    return sorted((e for unit in units for e in unit), key=lambda e: (rank[e.thread], e.seq))
