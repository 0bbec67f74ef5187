"""What a message and a question say, read as text: dates a question names, a message's parts,
word stems; no Redis.

Kept apart from `episodic` (the store and its ranking) so the text rules read on their own and
tests and benchmarks can use them without a store.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime

DAY = 86400.0
MAX_PARTS = 8
PART_CHARS = 40  # a shorter sentence joins the next one: alone, its vector says little
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
_M = "|".join(_MONTHS)
_DAY_FIRST = re.compile(rf"\b(\d{{1,2}}) ({_M}),? (\d{{4}})\b", re.I)
_MONTH_FIRST = re.compile(rf"\b({_M}) (\d{{1,2}}),? (\d{{4}})\b", re.I)
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_YEAR = re.compile(rf"\b({_M}),? (\d{{4}})\b", re.I)


def mentioned_periods(question: str, around: float = 3.0) -> list[tuple[float, float]]:
    """The periods (UTC timestamps) of the days and months a question names: `3 June, 2023`,
    `June 3, 2023` or `2023-06-03` (give or take `around` days), or a whole `June 2023`
    (and the week after it: what happened in June is often told in early July)."""
    periods = []
    days = [(int(d), _MONTHS[m.lower()], int(y)) for d, m, y in _DAY_FIRST.findall(question)]
    days += [(int(d), _MONTHS[m.lower()], int(y)) for m, d, y in _MONTH_FIRST.findall(question)]
    days += [(int(d), int(m), int(y)) for y, m, d in _ISO.findall(question)]
    for day, month, year in days:
        try:
            ts = datetime(year, month, day, tzinfo=UTC).timestamp()
        except ValueError:
            continue
        periods.append((ts - around * DAY, ts + (around + 1) * DAY))
    if not days:
        for month, year in _MONTH_YEAR.findall(question):
            start = datetime(int(year), _MONTHS[month.lower()], 1, tzinfo=UTC).timestamp()
            length = calendar.monthrange(int(year), _MONTHS[month.lower()])[1]
            periods.append((start, start + (length + 7) * DAY))
    return periods


def parts(text: str) -> list[str]:
    """A message's sentences, the short ones joined to the next, at most MAX_PARTS (the
    sentences spread evenly); none when the message is one part."""
    out: list[str] = []
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip()
        if not sentence:
            continue
        if out and len(out[-1]) < PART_CHARS:
            out[-1] += " " + sentence
        else:
            out.append(sentence)
    if len(out) > 1 and len(out[-1]) < PART_CHARS:
        last = out.pop()
        out[-1] += " " + last
    if len(out) > MAX_PARTS:
        size = -(-len(out) // MAX_PARTS)
        out = [" ".join(out[i : i + size]) for i in range(0, len(out), size)]
    return out if len(out) > 1 else []


_SUFFIXES = ("ations", "ation", "ments", "ment", "ings", "ing", "ies", "ied", "ers", "er",
             "ed", "es", "ly", "s", "e", "y")  # fmt: skip
STEM_CHARS = 4  # a shorter stem would match too many words as a prefix
WHOLE_STEM_CHARS = 5  # a word kept whole as a stem: `pain*` would find `paint`


def stems(terms: list[str]) -> list[str]:
    """Stems of the question's words to search as prefixes (`research*` for `researched`):
    the index keeps words as written, and people say `volunteered` of `volunteering`. A word
    whose suffix cannot be cut (none, or too short a stem would be left) is its own stem when
    it is long enough (`research*` finds `researching`): a short one matches too many words."""
    out = []
    for term in terms:
        for suffix in _SUFFIXES:
            if term.endswith(suffix) and len(term) - len(suffix) >= STEM_CHARS:
                out.append(term[: -len(suffix)])
                break
        else:
            if len(term) >= WHOLE_STEM_CHARS:
                out.append(term)
    return list(dict.fromkeys(out))


def asks(text: str) -> bool:
    """Whether a message is a question (it ends with `?`): a flag the ranking reads."""
    return text.rstrip().endswith("?")
