"""What episodic recall reasons with: its knobs (`Ranking`), a question as read, the filter a
read obeys, the candidates found (`Found`), and each candidate as ranking sees it.

Underscored names here are private to the `episodic*` modules: kept as they were when these
lived in `episodic`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory.scope import Scope
from memory.stores.base import decode
from memory.stores.episodic_query import SEP
from memory.stores.episodic_text import DAY


@dataclass
class Ranking:
    """The knobs of recall, tuned on LoCoMo's development split (bench/locomo_recall.py)."""

    text_candidates: int = 100  # BM25
    vector_candidates: int = 50  # KNN over every message
    named_candidates: int = 150  # KNN over this thread's messages by the people named
    text_weight: float = 1.0
    vector_weight: float = 1.0
    author_bonus: float = 1.0  # the question names the message's author
    thread_bonus: float = 0.6  # the message is from the thread the question is asked in
    date_bonus: float = 2.0  # the message is from around a date the question names
    date_days: float = 3.0  # how far around a named day
    opener_bonus: float = 0.5  # the message opens a conversation
    question_penalty: float = 0.3  # the message asks: its answer says more
    smoothing: float = 0.7  # share of the better adjacent message's score borrowed
    smoothing_far: float = 0.5  # the same, from two messages away
    context_neighbours: int = 20  # best candidates whose neighbours join the candidates
    short_tokens: int = 10  # a hit this short is shown with the message it replies to
    answer_tokens: int = 16  # a hit this short is shown with its question, or its answer
    cost_exponent: float = 0.3  # priority = exp(score) / tokens**exponent
    stem_weight: float = 0.5  # BM25 weight of the question's stems as prefixes (0: none)
    feedback_weight: float = 0.15  # weight of the best candidates' vocabulary (0: none)
    feedback_docs: int = 5  # how many best candidates lend it
    feedback_terms: int = 20  # how many of their words, at most


@dataclass
class _Question:
    """What recall reads from a question: words for BM25, named authors, named periods."""

    terms: list[str]
    named: list[str]
    periods: list[tuple[float, float]]
    plain: frozenset[str] = frozenset()  # words that say nothing of a subject here
    feedback: dict[str, float] = field(default_factory=dict)  # see `episodic_ranking`
    # Its candidates' words by their rows' texts (`row_words`): this recall's only.
    seen_words: dict[bytes | str, frozenset[str]] = field(default_factory=dict)


@dataclass
class Found:
    """What recall's candidate searches found for a question (`EpisodicStore.find`)."""

    scope: Scope
    vector: np.ndarray
    read: _Question
    where: _Filter
    candidates: dict[str, _Candidate]


@dataclass
class _Filter:
    """What a read may return. `clause` filters the KNN queries; when `broad` (only the
    audience and the recent window stand in the way: most messages pass) the BM25 and tag
    lookups go unfiltered and `admits` filters their rows here, which spares Redis walking
    the long `public` postings (half of a BM25 query's time at 100k messages)."""

    scope: Scope
    clause: str
    broad: bool
    skip: tuple[str, int] | None = None  # (thread, seq): that thread from seq on is hidden

    @property
    def lookup(self) -> str:
        return "" if self.broad else self.clause

    def admits(self, c: _Candidate) -> bool:
        hidden = self.skip is not None and c.thread == self.skip[0] and c.seq >= self.skip[1]
        return self.scope.may_show(c.audience, c.thread) and not hidden


@dataclass
class _Candidate:
    """A message as ranking sees it: where and when, from its row's `meta`; of its text only
    the words, for feedback."""

    id: str
    thread: str
    seq: int
    ts: float
    names: tuple[str, ...]
    audience: str
    opens: bool  # it opens a conversation (see `EpisodicStore._openers`)
    asks: bool  # it ends with a question mark
    tokens: int  # its line's tokens, in ESTIMATE_MODEL's encoding (see `episodic`)
    text_score: float = 0.0
    cosine: float | None = None
    measured: bool = False  # its cosine comes from the second pass, not a KNN list
    neighbour: bool = False  # found as the neighbour of a candidate, not by a search
    words: frozenset[str] | None = None  # its row's words, when read (see `episodic_ranking`)
    own: float = 0.0  # its own score: fused, plus the priors
    score: float = 0.0  # after smoothing

    @classmethod
    def from_row(cls, row: dict[bytes, Any]) -> _Candidate:
        seq, ts, flags, tokens, names, thread, audience = decode(row[b"meta"]).split(SEP, 6)
        return cls(decode(row[b"msg"]), thread, int(seq), float(ts), tuple(names.split()),
                   audience, "o" in flags, "q" in flags, int(tokens))  # fmt: skip

    @property
    def day(self) -> int:
        return int(self.ts // DAY)
