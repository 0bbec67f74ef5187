"""The Redis reads of episodic recall: a question's words and the authors it names, the
candidate searches, the messages around the best ones, and the chosen messages read whole.

Candidates come from up to three queries at once: BM25 over the question's words (and their
stems as prefixes), KNN over all messages, and KNN over the messages of the people it names in
this thread. One filtered KNN over the neighbours of the best and the hits only BM25 found
measures their cosine. Rows carry ids and `meta` only (and their words, for feedback); only
the chosen messages are read whole. A base of `EpisodicStore`, which holds the knobs
(`ranking`) and the cache of author names.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from memory.keys import erasing_key
from memory.scope import Scope
from memory.stores.base import VectorStore, decode, vector_bytes
from memory.stores.episodic_candidates import Ranking, _Candidate, _Filter, _Question
from memory.stores.episodic_episode import Episode
from memory.stores.episodic_query import (
    _TEXT_ESCAPER,
    _WORD,
    FIELDS,
    ROW,
    WORDS_ROW,
    _episode,
    _pos_tag,
    _rows,
    _tags,
)
from memory.stores.episodic_ranking import row_words
from memory.stores.episodic_text import mentioned_periods, stems
from memory.stores.stopwords import STOPWORDS

NAMES_TTL = 60.0  # seconds a process trusts its list of a tenant's author names
_ASKING = """
ever recently last time times anything something someone kind type sort mention mentioned talk
talked said ask asked think thought like likely both
"""
QUESTION_WORDS = frozenset(_ASKING.split())  # they phrase a question, not name its subject


class EpisodicSearch(VectorStore):
    """Recall's reads: candidates for a question, their neighbours, the chosen messages."""

    ranking: Ranking
    _names: dict[str, tuple[float, frozenset[str]]]  # tenant -> (when read, author name words)

    async def _read(self, scope: Scope, question: str) -> _Question:
        words = dict.fromkeys(_WORD.findall(question.lower()))
        authors = await self._author_names(scope.tenant)
        named = [w for w in words if w in authors and w not in STOPWORDS]  # not "will", "may"
        # A name in a message mostly addresses someone: the named authors' own messages are
        # found by the named KNN and the author prior instead.
        skip = STOPWORDS | QUESTION_WORDS | authors
        terms = [w for w in words if len(w) > 1 and w not in skip]
        plain = frozenset(skip | set(terms))
        return _Question(terms, named, mentioned_periods(question, self.ranking.date_days), plain)

    async def _author_names(self, tenant: str) -> frozenset[str]:
        """The words of the tenant's author names, read from the index once a minute."""
        cached = self._names.get(tenant)
        if cached and time.monotonic() - cached[0] < NAMES_TTL:
            return cached[1]
        reply = await self._search(tenant, "FT.TAGVALS", "names")
        names = frozenset(decode(v) for v in reply)
        self._names[tenant] = (time.monotonic(), names)
        return names

    async def _candidates(
        self,
        scope: Scope,
        question: _Question,
        vector: np.ndarray,
        where: _Filter,
        least: int = 0,
    ) -> dict[str, _Candidate]:
        """Candidates from up to three queries at once, ids and `meta` only: BM25 over the
        question's words, KNN over all messages, and KNN over this thread's messages by the
        people the question names (a question about the past is mostly about someone, and
        their own messages are where the answer is; the thread keeps that set small)."""
        r, tenant = self.ranking, scope.tenant
        knn = [
            self._knn(tenant, where.clause, vector, max(r.vector_candidates, least), where.broad)
        ]
        if question.named and scope.thread and r.named_candidates:
            here = f"{_tags('names', question.named)} {_tags('thread', [scope.thread])}"
            knn.append(
                self._knn(tenant, f"{here} {where.clause}", vector, r.named_candidates, False)
            )
        bm25 = []
        if question.terms:
            words = [_TEXT_ESCAPER.escape(t) for t in question.terms]
            if r.stem_weight:
                weight = f"=>{{$weight: {r.stem_weight}}}"
                words += [f"({_TEXT_ESCAPER.escape(s)}*){weight}" for s in stems(question.terms)]
            union = " | ".join(words)
            query = f"({union}) {where.lookup}".strip()
            bm25.append(self._bm25(tenant, query, max(r.text_candidates, least)))
        replies = await asyncio.gather(*knn, *bm25)
        out: dict[Any, _Candidate] = {}  # by the row's `msg` as sent: decoded once, if new
        for reply in replies[: len(knn)]:
            for _, row in _rows(reply):
                cosine = 1.0 - float(row[b"dist"])
                c = out.get(row[b"msg"])
                if c is None:
                    c = out[row[b"msg"]] = _Candidate.from_row(row)
                c.cosine = max(c.cosine if c.cosine is not None else -1.0, cosine)
                _add_words(c, row, question.plain, question.seen_words)
        for reply in replies[len(knn) :]:
            for score, row in _rows(reply):
                c = out.get(row[b"msg"])
                if c is None:
                    c = out[row[b"msg"]] = _Candidate.from_row(row)
                c.text_score = float(score)
                _add_words(c, row, question.plain, question.seen_words)
        return {c.id: c for c in out.values() if where.admits(c)}

    def _bm25(self, tenant: str, query: str, k: int) -> Any:
        return self._search(
            tenant, "FT.SEARCH", query, "VERBATIM", "WITHSCORES", "SCORER", "BM25STD",
            "RETURN", len(self._row), *self._row, "LIMIT", 0, k, "DIALECT", 2,
        )  # fmt: skip

    @property
    def _row(self) -> list[str]:
        """What a candidate row returns: its words too when feedback reads them."""
        return WORDS_ROW if self.ranking.feedback_weight else ROW

    def _knn(self, tenant: str, where: str, vector: np.ndarray, k: int, batches: bool) -> Any:
        """A KNN query. With a filter most messages pass, HNSW batches: RediSearch would
        otherwise pick a brute-force scan of every vector (23 ms at 100k messages)."""
        policy = " HYBRID_POLICY BATCHES" if batches else ""
        return self._search(
            tenant, "FT.SEARCH", f"({where})=>[KNN {k} @{self.VECTOR_FIELD} $vec{policy} AS dist]",
            "PARAMS", 2, "vec", vector_bytes(vector), "SORTBY", "dist",
            "RETURN", len(self._row) + 1, *self._row, "dist", "LIMIT", 0, k, "DIALECT", 2,
        )  # fmt: skip

    async def _at(self, tenant: str, places: set[tuple[str, int]], where: str) -> list[_Candidate]:
        """The messages at these (thread, seq) places: one tag lookup."""
        tags = "|".join(_pos_tag(t, s) for t, s in sorted(places))
        reply = await self._search(
            tenant, "FT.SEARCH", f"@pos:{{{tags}}} {where}".strip(),
            "RETURN", len(ROW), *ROW, "LIMIT", 0, len(places), "DIALECT", 2,
        )  # fmt: skip
        return [_Candidate.from_row(row) for _, row in _rows(reply)]

    async def _measure(
        self,
        tenant: str,
        places: set[tuple[str, int]],
        where: _Filter,
        vector: np.ndarray,
        plain: frozenset[str] = frozenset(),
        seen_words: dict[bytes | str, frozenset[str]] | None = None,
    ) -> list[_Candidate]:
        """The messages at these (thread, seq) places with their cosine to the question: one
        KNN restricted to them (exact: RediSearch scans so few), filtered like every KNN.
        `seen_words`: the recall's words of rows already read (`_Question.seen_words`)."""
        seen_words = {} if seen_words is None else seen_words
        tags = "|".join(_pos_tag(t, s) for t, s in sorted(places))
        where_here = f"@pos:{{{tags}}} {where.clause}"
        reply = await self._knn(tenant, where_here, vector, len(places), False)
        out = []
        for _, row in _rows(reply):
            c = _Candidate.from_row(row)
            c.cosine = 1.0 - float(row[b"dist"])
            _add_words(c, row, plain, seen_words)
            out.append(c)
        return out

    async def _expand(
        self,
        scope: Scope,
        candidates: dict[str, _Candidate],
        where: _Filter,
        exclude_ids: frozenset[str],
        vector: np.ndarray,
        plain: frozenset[str] = frozenset(),
        seen_words: dict[bytes | str, frozenset[str]] | None = None,
    ) -> None:
        """Add the messages around the best candidates: as candidates of their own (scored by
        their neighbours) and as context for short hits. `plain` and `seen_words` are the
        question's (`_Question`)."""
        r = self.ranking
        have = {(c.thread, c.seq) for c in candidates.values()}
        best = sorted(candidates.values(), key=lambda c: -c.own)[: r.context_neighbours]
        reach = (-2, -1, 1, 2) if r.smoothing_far else (-1, 1)
        wanted = {(c.thread, c.seq + d) for c in best for d in reach} - have
        unmeasured = {(c.thread, c.seq) for c in candidates.values() if c.cosine is None}
        if not wanted | unmeasured:
            return
        for c in await self._measure(
            scope.tenant, wanted | unmeasured, where, vector, plain, seen_words
        ):
            known = candidates.get(c.id)
            if known is not None:
                if known.cosine is None:
                    known.cosine, known.measured = c.cosine, True
                if c.words is not None:
                    known.words = c.words | (known.words or frozenset())
            elif c.id not in exclude_ids and where.admits(c):
                c.neighbour = True
                candidates[c.id] = c

    async def _fetch(self, scope: Scope, places: dict[str, tuple[str, int]]) -> dict[str, Episode]:
        """The chosen messages (id -> (thread, seq)), whole: one tag lookup, unfiltered (every
        id was admitted already; the audience is checked again all the same). Forgotten
        messages whose documents are still being deleted (memory/governance_purge.py) are left out:
        asked in the same round trip."""
        if not places:
            return {}
        tags = "|".join(_pos_tag(t, s) for t, s in places.values())
        ids = list(places)
        reply, erasing = await asyncio.gather(
            self._search(
                scope.tenant, "FT.SEARCH", f"@pos:{{{tags}}}",
                "RETURN", len(FIELDS) + 1, "msg", *FIELDS, "LIMIT", 0, 2 * len(places),
                "DIALECT", 2,
            ),
            self.redis.hmget(erasing_key(scope.tenant), ids),
        )  # fmt: skip
        gone = {i for i, parts in zip(ids, erasing, strict=True) if parts is not None}
        found = (_episode(row) for _, row in _rows(reply))
        return {
            e.id: e
            for e in found
            if e.id in places and e.id not in gone and scope.may_show(e.audience, e.thread)
        }


def _add_words(
    c: _Candidate,
    row: dict[bytes, Any],
    plain: frozenset[str],
    seen_words: dict[bytes | str, frozenset[str]],
) -> None:
    """Join a row's words (a message's text, or a part's) to its candidate's, when returned."""
    text = row.get(b"text") or row.get(b"part")
    if text is not None:
        c.words = row_words(text, plain, seen_words) | (c.words or frozenset())
