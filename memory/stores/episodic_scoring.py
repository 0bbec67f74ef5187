"""How episodic recall values its candidates and fills the budget; no Redis.

Each candidate's own score: z-scored BM25 plus z-scored cosine (and the feedback vocabulary,
`episodic_ranking`), plus priors for a named author, a named date, this thread and a
conversation's opening message; every message then borrows from its neighbours' scores. The
best are packed into the token budget by value per token, a short hit with the message it
replies to. A mixin of `EpisodicStore`, which holds the knobs (`ranking`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from memory.scope import Scope
from memory.stores.episodic_candidates import Ranking, _Candidate, _Question
from memory.stores.episodic_episode import segment
from memory.stores.episodic_ranking import feedback_score, feedback_terms, z_of
from memory.tokens import block_tokens, count_tokens


class EpisodicScoring:
    """Scoring, smoothing and packing of recall's candidates, by the knobs of `ranking`."""

    ranking: Ranking

    def _score(self, scope: Scope, question: _Question, candidates: dict[str, _Candidate]) -> None:
        """Each candidate's own score: z-scored BM25 plus z-scored cosine, plus the priors.
        Neighbours (`_expand`) start from the lowest fused score."""
        r = self.ranking
        found = [c for c in candidates.values() if not c.neighbour]
        text = np.array([c.text_score for c in found])
        known = [c.cosine for c in found if c.cosine is not None and not c.measured]
        floor = min(known, default=0.0)  # beyond the KNN lists: at most their last cosine
        cosine = np.array([floor if c.cosine is None else c.cosine for c in found])
        text_z, cosine_z = z_of(text), z_of(cosine)
        fused = r.text_weight * text_z(text) + r.vector_weight * cosine_z(cosine)
        feedback = np.array([feedback_score(c.words, question.feedback) for c in found])
        feedback_z = z_of(feedback)
        fused += r.feedback_weight * feedback_z(feedback)
        low = float(fused.min()) if len(fused) else 0.0
        for c, f in zip(found, fused, strict=True):
            c.own = float(f)
        for c in candidates.values():
            if c.neighbour:  # by its own cosine when measured, never below the floor
                c.own = low
                if c.cosine is not None:
                    own = r.text_weight * text_z(0.0) + r.vector_weight * cosine_z(c.cosine)
                    own += r.feedback_weight * feedback_z(
                        feedback_score(c.words, question.feedback)
                    )
                    c.own = max(low, float(own))
        named, periods = set(question.named), question.periods
        for c in candidates.values():
            own = c.own
            own += r.author_bonus * (bool(named) and not named.isdisjoint(c.names))
            own += r.thread_bonus * (c.thread == scope.thread)
            own += r.opener_bonus * c.opens - r.question_penalty * c.asks
            own += r.date_bonus * (bool(periods) and any(s <= c.ts < e for s, e in periods))
            c.own = c.score = own

    def _feedback(self, candidates: dict[str, _Candidate]) -> dict[str, float]:
        """The vocabulary of the best candidates by their own score (see `episodic_ranking`)."""
        r = self.ranking
        if not r.feedback_weight:
            return {}
        read = [c for c in candidates.values() if c.words is not None]
        best = sorted(read, key=lambda c: -c.own)[: r.feedback_docs]
        return feedback_terms([c.words or frozenset() for c in best],
                              (c.words or frozenset() for c in read), r.feedback_terms)  # fmt: skip

    def _smooth(self, candidates: dict[str, _Candidate]) -> None:
        """A message borrows from its best neighbour within two messages: the answer sits
        next to the question, the story goes on in the speaker's next message."""
        r = self.ranking
        at: dict[str, dict[int, float]] = {}  # thread -> seq -> own score
        for c in candidates.values():
            at.setdefault(c.thread, {})[c.seq] = c.own
        low = min((own for seqs in at.values() for own in seqs.values()), default=0.0)
        weights = ((-2, r.smoothing_far), (-1, r.smoothing), (1, r.smoothing), (2, r.smoothing_far))
        for c in candidates.values():
            seqs, best = at[c.thread], None  # the first largest borrowed, as `max` picks it
            for d, w in weights:
                if (own := seqs.get(c.seq + d)) is not None:
                    lent = w * (own - low)
                    if best is None or lent > best:
                        best = lent
            c.score = c.own + (0.0 if best is None else best)

    # -- packing -------------------------------------------------------------------------------

    def _pack(self, candidates: dict[str, _Candidate], budget: int, model: str) -> list[list[str]]:
        """Greedy by value per token: each hit with the context it needs, until the budget.
        Returns the units (lists of ids) in the order they were taken.

        Costs are the lines' stored token counts plus the headers a new thread or date adds:
        an estimate, which `recall` checks on the rendering.
        """
        r = self.ranking
        at = {(c.thread, c.seq): c for c in candidates.values()}
        units = []
        for c in _leading(candidates.values(), 2 * budget):
            members = [c]
            before, after = at.get((c.thread, c.seq - 1)), at.get((c.thread, c.seq + 1))
            if before is not None and (
                c.tokens < r.short_tokens or (c.tokens < r.answer_tokens and before.asks)
            ):
                members.insert(0, before)  # what a short reply, or an answer, responds to
            if after is not None and c.tokens < r.answer_tokens and c.asks:
                members.append(after)  # the answer to a short question
            cost = sum(m.tokens for m in members)
            units.append((c.score - r.cost_exponent * math.log(cost), members))
        used = _heading_tokens(model)
        date_cost = _date_tokens(model)
        taken: set[str] = set()
        threads: set[str] = set()
        days: set[tuple[str, int]] = set()
        out: list[list[str]] = []
        for _, members in sorted(units, key=lambda u: -u[0]):
            if budget - used < 8:  # full: no line is that short
                break
            fresh = [m for m in members if m.id not in taken]
            cost = 0
            for m in fresh:
                cost += m.tokens
                if m.thread not in threads:
                    cost += len(m.thread) // 3 + 8  # its header, about
                if (m.thread, m.day) not in days:
                    cost += date_cost
            if not fresh or used + cost > budget:
                continue
            used += cost
            for m in fresh:
                taken.add(m.id)
                threads.add(m.thread)
                days.add((m.thread, m.day))
            out.append([m.id for m in fresh])
        return out


@lru_cache(maxsize=16)
def _heading_tokens(model: str) -> int:
    """What the segment costs before its first thread."""
    return count_tokens(segment([]).render().rsplit("\n", 1)[0], model)


@lru_cache(maxsize=16)
def _date_tokens(model: str) -> int:
    """What a date costs at the start of a line."""
    return block_tokens(model, "28 Sep Name: x\n") - block_tokens(model, "Name: x\n")


def _leading(candidates: Iterable[_Candidate], tokens: int) -> list[_Candidate]:
    """The best candidates, as many as take `tokens`: the rest could not make it in."""
    out = []
    for c in sorted(candidates, key=lambda c: -c.score):
        out.append(c)
        tokens -= c.tokens
        if tokens < 0:
            break
    return out
