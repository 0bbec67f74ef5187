"""Pure scoring helpers of episodic recall: z-scoring, and pseudo-relevance feedback.

A question names a subject in its own words ("what activities"); the messages that answer it
use theirs ("pottery", "camping"). The best few candidates, found by the question's words and
its vector, mostly share the answer's vocabulary: their salient words, weighed like RM3 (how
often among the best, how rare among all candidates), re-score every candidate already
fetched. No query is added: candidates carry the words of their rows (see `row_words`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from memory.stores.base import decode

MIN_CHARS = 3  # shorter words say little about a subject
_WORD = re.compile(rf"[a-z][a-z']{{{MIN_CHARS - 1},}}")  # the length test in the regex: fast


def row_words(
    raw: bytes | str, skip: frozenset[str], seen: dict[bytes | str, frozenset[str]]
) -> frozenset[str]:
    """The distinct words of a candidate's text (a reply's field as sent: bytes, or str from a
    decoding client) that could name a subject. `seen` remembers each text's words for one
    recall (a row comes back from several of its queries), and goes with it: a global cache
    would keep forgotten messages' texts in memory."""
    words = seen.get(raw)
    if words is None:
        words = seen[raw] = frozenset(_WORD.findall(decode(raw).lower()))
    return words.difference(skip)


def feedback_terms(
    best: Sequence[frozenset[str]], every: Iterable[frozenset[str]], limit: int
) -> dict[str, float]:
    """The `limit` words most telling of the `best` candidates' subject, with their weights:
    in how many of the best a word is, times its rarity among `every` candidate (a word all
    candidates share marks the conversation, not the answer). A word in one best only is
    noise, unless there is one best."""
    pool = list(every)
    if not best or not pool:
        return {}
    often = Counter(w for words in best for w in words)
    spread = Counter(w for words in pool for w in words if w in often)
    least = 1 if len(best) == 1 else 2
    weights = {
        w: n * math.log(len(pool) / spread[w]) for w, n in often.items() if n >= least and spread[w]
    }
    top = sorted(weights.items(), key=lambda item: -item[1])[:limit]
    return {w: weight for w, weight in top if weight > 0}


def feedback_score(words: frozenset[str] | None, terms: dict[str, float]) -> float:
    """How much of the feedback vocabulary a candidate holds (0 when its words are unknown)."""
    if not words or not terms:
        return 0.0
    if words.isdisjoint(terms):  # most candidates: as the sum below would, 0
        return 0
    return sum(weight for w, weight in terms.items() if w in words)


def z_of(values: np.ndarray) -> Callable[[Any], Any]:
    """The z-scoring of `values`, to apply to them and to values measured beside them: how far
    a candidate stands out of its list, which makes BM25 and cosine scores addable."""
    mean = values.mean() if len(values) else 0.0
    spread = values.std() if len(values) else 0.0
    if spread <= 1e-9:
        return lambda v: v * 0.0
    return lambda v: (v - mean) / spread
