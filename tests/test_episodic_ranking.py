"""Pseudo-relevance feedback of episodic recall: which words the best candidates lend, that
candidates read from the real Redis carry their words, and that a candidate sharing the best
ones' vocabulary moves up."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory.scope import Scope
from memory.stores import episodic_ranking
from memory.stores.episodic import Episode, EpisodicStore, Ranking
from memory.stores.episodic_candidates import _Candidate, _Filter, _Question
from memory.stores.episodic_query import _filter
from memory.stores.episodic_ranking import feedback_score, feedback_terms, row_words

START = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()


@pytest.fixture
async def store(memory) -> EpisodicStore:
    store = EpisodicStore(memory.redis, memory.embedder)
    await store.open()
    return store


def test_feedback_words_are_shared_by_the_best_and_rare_among_all():
    best = [
        frozenset({"pottery", "kids", "weekend"}),
        frozenset({"pottery", "clay", "weekend"}),
        frozenset({"clay", "kids", "weekend", "bowl"}),
    ]
    others = [frozenset({"weekend", "work"}), frozenset({"weekend", "coffee"})] * 5
    terms = feedback_terms(best, best + others, limit=10)
    assert {"pottery", "clay", "kids"} <= terms.keys()
    assert "weekend" not in terms  # every candidate has it: it marks nothing
    assert "bowl" not in terms  # one of several best only: noise
    assert feedback_terms(best, best + others, limit=1).keys() <= {"pottery", "clay", "kids"}
    assert feedback_score(frozenset({"clay", "work"}), terms) == terms["clay"]
    assert feedback_score(None, terms) == 0.0


def test_row_words_leave_out_what_names_no_subject():
    text, skip = "Ana: We fired the new kiln, it's great!", frozenset({"ana", "great"})
    seen: dict[bytes | str, frozenset[str]] = {}
    assert row_words(text, skip, seen) == {"fired", "the", "new", "kiln", "it's"}
    # A reply's field as sent: bytes, decoded (a bad byte replaced) as `decode` does.
    assert row_words(text.encode(), skip, seen) == {"fired", "the", "new", "kiln", "it's"}
    assert row_words(b"Kiln \xff glaze", skip, seen) == {"kiln", "glaze"}
    every = {"ana", "fired", "the", "new", "kiln", "it's", "great"}
    assert row_words(text, frozenset({"the"}), seen) == every - {"the"}  # remembered unskipped
    assert seen.keys() == {text, text.encode(), b"Kiln \xff glaze"}  # the recall's, only


def test_no_row_text_outlives_its_recall():
    """Rows' words are remembered per recall (`_Question.seen_words`), never in a cache of
    the process, which would keep forgotten messages' texts in memory."""
    cached = [
        name for name, value in vars(episodic_ranking).items() if hasattr(value, "cache_info")
    ]
    assert cached == []


def _candidate(i: int, words: set[str], cosine: float, text_score: float) -> _Candidate:
    c = _Candidate(f"m{i}", "t", 10 * i, START + i, (), "public", False, False, 12)
    c.words, c.cosine, c.text_score, c.found_by_knn = frozenset(words), cosine, text_score, True
    return c


async def test_a_candidate_sharing_the_best_ones_vocabulary_moves_up(store):
    """Two candidates equal on words and meaning: the one using the words of the best hits
    ranks above the other once feedback is on, and not before."""
    best = [_candidate(i, {"kiln", "glaze", "clay"}, 0.8, 5.0) for i in range(3)]
    plain = [_candidate(3 + i, {"meeting", "agenda"}, 0.2, 0.0) for i in range(10)]
    alike = _candidate(20, {"glaze", "kiln", "other"}, 0.4, 1.0)
    unlike = _candidate(21, {"parking", "garage", "other"}, 0.4, 1.0)
    candidates = {c.id: c for c in [*best, *plain, alike, unlike]}
    scope = Scope("t-rank", "elsewhere")
    question = _Question(["pottery"], [], [])

    store.ranking = Ranking(feedback_weight=0.0)
    store._score(scope, question, candidates)
    assert candidates["m20"].own == candidates["m21"].own

    store.ranking = Ranking(feedback_weight=0.15, feedback_docs=3)
    question.feedback = store._feedback(candidates)
    assert {"kiln", "glaze", "clay"} <= question.feedback.keys()
    store._score(scope, question, candidates)
    assert candidates["m20"].own > candidates["m21"].own


async def test_candidates_carry_the_words_of_their_rows_when_feedback_is_on(store, tenant):
    texts = [
        "The kiln reached cone six overnight. Every glaze came out glossy and even.",
        "Lunch at the Thai place today?",
        "Reminder: the all-hands moved to 4pm.",
    ]
    episodes = [
        Episode(f"m-{i}", "t-studio", author="ana", author_name="Ana", text=text,
                ts=START + i * 86400, seq=i)
        for i, text in enumerate(texts)
    ]  # fmt: skip
    await store.add(Scope(tenant), episodes)
    scope = Scope(tenant, "t-other")
    question = "How did the kiln firing go?"
    vector = (await store.embedder.embed([question]))[0]
    where = _Filter(scope, _filter(scope), True)
    for weight, carried in ((0.0, False), (0.15, True)):
        store.ranking = Ranking(feedback_weight=weight, named_candidates=0)
        read = await store._read(scope, question)
        found = await store._candidates(scope, read, vector, where)
        assert "m-0" in found
        assert (found["m-0"].words is not None) is carried
        assert bool(read.seen_words) is carried  # this recall's, gone with it
    assert {"glaze", "glossy"} <= (found["m-0"].words or frozenset())
    assert "kiln" not in (found["m-0"].words or frozenset())  # the question's: BM25 has it
    assert "ana" not in (found["m-0"].words or frozenset())  # an author's name is no subject
