"""Episodic memory against the real embedded Redis and the local MiniLM: recall by meaning and
by term, the scope rule, exclusions, the token budget, context neighbours, search filters."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory.scope import Scope, Visibility
from memory.stores.episodic import Episode, EpisodicStore, Ranking
from memory.stores.episodic_candidates import _Filter
from memory.stores.episodic_query import _filter
from memory.stores.episodic_text import mentioned_periods, parts, stems
from memory.tokens import count_tokens

MODEL = "gpt-5-mini"
DAY = 86400.0
START = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()

# Everyday chatter: none of it is about databases, trains or the budget.
FILLER = [
    "Morning all, coffee machine on floor 3 is fixed.",
    "Lunch at the Thai place today?",
    "I pushed the new logo colours to the design folder.",
    "Reminder: the all-hands moved to 4pm.",
    "Does anyone have a spare HDMI adapter?",
    "The office plants need watering while Sam is away.",
    "Great demo yesterday, the animations looked smooth.",
    "I'll be out Friday afternoon for a dentist appointment.",
    "Can someone review the onboarding slides?",
    "The parking garage closes early on Sundays.",
    "New hires start on Monday, please say hi.",
    "I updated the font sizes on the landing page.",
    "Who took the last oat milk?",
    "Recruiting wants two more interview slots this week.",
    "The printer on floor 2 is jammed again.",
    "Happy birthday Priya! Cake in the kitchen.",
    "The wifi password changed, check the pinned note.",
    "Let's keep stand-up under fifteen minutes.",
    "Please fill in the team survey by Thursday.",
    "The whiteboard markers are in the top drawer.",
]


@pytest.fixture
async def store(memory) -> EpisodicStore:
    store = EpisodicStore(memory.redis, memory.embedder)
    await store.open()
    return store


def thread_of(
    texts: list[str],
    thread: str = "t-general",
    channel: str = "general",
    audience: str = "public",
    authors: tuple[str, ...] = ("Ana", "Ben"),
    start: float = START,
    prefix: str = "",
) -> list[Episode]:
    """A thread of messages, one a day, the authors taking turns."""
    return [
        Episode(
            id=f"{prefix or thread}-{i}",
            thread=thread,
            channel=channel,
            audience=audience,
            author=authors[i % len(authors)].lower(),
            author_name=authors[i % len(authors)],
            text=text,
            ts=start + i * DAY,
            seq=i,
        )
        for i, text in enumerate(texts)
    ]


async def recall(store: EpisodicStore, scope: Scope, question: str, budget: int = 400, **kw):
    vector = (await store.embedder.embed([question]))[0]
    return await store.recall(scope, question, vector, budget, MODEL, **kw)


async def search(store: EpisodicStore, scope: Scope, query: str, k: int = 5, **kw):
    vector = (await store.embedder.embed([query]))[0]
    return await store.search(scope, query, vector, k, **kw)


async def test_an_old_message_is_found_by_meaning_and_by_exact_term(store, tenant):
    texts = [
        "We agreed to move the billing service from MySQL to Postgres next quarter.",
        *FILLER,
        "Ticket ZK-4471 is blocked until the vendor ships their patch.",
        *FILLER,
    ]
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")
    # A budget of a few lines, among more than forty: the right ones must rank first.
    by_meaning = await recall(store, scope, "Which database are we switching payments to?", 120)
    assert len(by_meaning) < 6
    assert "t-general-0" in {e.id for e in by_meaning}
    by_term = await recall(store, scope, "what is going on with zk-4471?", 120)
    assert len(by_term) < 6
    assert "t-general-21" in {e.id for e in by_term}


async def test_private_and_direct_messages_stay_where_they_were_said(store, tenant):
    said = "The launch codename is Bluebird and it ships in May."
    await store.add(Scope(tenant), thread_of([said], "t-pub", "general", prefix="pub"))
    await store.add(
        Scope(tenant), thread_of([said], "t-sec", "secret", "private:secret", prefix="priv")
    )
    await store.add(Scope(tenant), thread_of([said], "t-dm1", "D1", "dm:D1", prefix="dm1"))
    question = "What is the launch codename?"
    places = {
        "other private channel": Scope(tenant, "t-x", "other", Visibility.PRIVATE),
        "another DM": Scope(tenant, "t-dm2", "D2", Visibility.DM),
        "public channel": Scope(tenant, "t-y", "random"),
        "the private channel itself": Scope(tenant, "t-z", "secret", Visibility.PRIVATE),
        "the DM itself": Scope(tenant, "t-dm1", "D1", Visibility.DM),
    }
    seen = {}
    for label, scope in places.items():
        recalled = {e.id for e in await recall(store, scope, question)}
        searched = {e.id for e in await search(store, scope, question)}
        assert recalled == searched, label
        seen[label] = recalled
    assert seen["other private channel"] == {"pub-0"}
    assert seen["another DM"] == {"pub-0"}
    assert seen["public channel"] == {"pub-0"}
    assert seen["the private channel itself"] == {"pub-0", "priv-0"}
    assert seen["the DM itself"] == {"pub-0", "dm1-0"}


async def test_excluded_messages_are_never_returned(store, tenant):
    texts = ["The office move is set for June 3rd.", *FILLER[:8], "Office move: June 3rd."]
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")
    first = {e.id for e in await recall(store, scope, "When is the office move?")}
    assert {"t-general-0", "t-general-9"} <= first
    shown = frozenset({"t-general-9", "t-general-8"})
    again = await recall(store, scope, "When is the office move?", exclude_ids=shown)
    assert "t-general-0" in {e.id for e in again}
    assert not shown & {e.id for e in again}
    later = await recall(store, scope, "When is the office move?", exclude_thread_seq_from=5)
    assert "t-general-0" in {e.id for e in later}
    assert all(e.seq < 5 for e in later)


async def test_each_message_once_and_the_budget_is_exact(store, tenant):
    texts = [f"{f} Also, the train to Lyon leaves at {7 + i % 5}am." for i, f in enumerate(FILLER)]
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")
    header = count_tokens(EpisodicStore.render([]), MODEL)
    for budget in (header - 1, header + 30, 150, 300, 600):
        found = await recall(store, scope, "When does the train to Lyon leave?", budget)
        if budget < header:  # not even the heading fits
            assert found == []
            continue
        ids = [e.id for e in found]
        assert len(ids) == len(set(ids))
        used = count_tokens(EpisodicStore.render(found), MODEL)
        assert used <= budget
        if budget >= 150:  # every message matches: the budget is used, up to about a line
            assert used > budget - 40, (budget, used)
    everything = await recall(store, scope, "When does the train to Lyon leave?", 5000)
    assert len(everything) == len(FILLER)


async def test_a_hit_comes_with_the_message_that_makes_it_understandable(memory, store, tenant):
    texts = [
        *FILLER[:6],
        "Pin staging to Kubernetes 1.29?",
        "Yes, do it.",
        *FILLER[6:12],
        "Did the dashboards survive the datacenter migration last night?",
        "Grafana's? Gone, sadly.",
        *FILLER[12:],
    ]
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")
    header = count_tokens(EpisodicStore.render([]), MODEL)
    found = await recall(store, scope, "Kubernetes version for staging", header + 45)
    assert {"t-general-6", "t-general-7"} <= {e.id for e in found}  # the question, its answer
    rendered = EpisodicStore.render(found)
    assert "Ana: Pin staging to Kubernetes 1.29?\n8 Mar Ben: Yes, do it." in rendered
    # The context rule alone: a search that finds only the hit, no smoothing.
    narrow = Ranking(text_candidates=2, vector_candidates=2, named_candidates=2,
                     smoothing=0, smoothing_far=0)  # fmt: skip
    alone = EpisodicStore(memory.redis, memory.embedder, narrow)
    found = await recall(alone, scope, "Kubernetes 1.29", header + 45)
    assert [e.id for e in found] == ["t-general-6", "t-general-7"]
    found = await recall(alone, scope, "What happened to Grafana?", header + 45)
    assert [e.id for e in found] == ["t-general-14", "t-general-15"]  # a short reply, and to what


async def test_rendering_is_compact_and_says_when_where_and_who(store, tenant):
    episodes = thread_of(["First.", "Second.", "Third, a day later.", "Much later."])
    chosen = [episodes[0], episodes[1], episodes[3]]
    text = EpisodicStore.render(chosen)
    assert text.startswith("## Episodic Memory\nWhat it is: ")
    assert "\nHow to use it: " in text
    body = text.split("\n\n", 1)[1]
    assert body == (
        "#general thread t-general\n"
        "1 Mar 2024 Ana: First.\n"
        "2 Mar Ben: Second.\n\n"
        "4 Mar Ben: Much later."
    )
    same_day = [Episode("a", "t", text="x", ts=START, seq=0, author_name="A"),
                Episode("b", "t", text="y", ts=START + 60, seq=1, author_name="B")]  # fmt: skip
    assert EpisodicStore.render(same_day).endswith("thread t\n1 Mar 2024 A: x\nB: y")


async def test_search_filters_by_thread_author_and_dates(store, tenant):
    said = "The quarterly budget review is on the calendar."
    general = thread_of([said] * 4, "t-general", authors=("Ana", "Ben"))
    finance = thread_of(
        [said] * 4, "t-finance", "finance", authors=("Cem",), start=START + 30 * DAY
    )
    await store.add(Scope(tenant), general + finance)
    scope = Scope(tenant, "t-general", channel="general")
    everything = await search(store, scope, "budget review", k=20)
    assert {e.id for e in everything} == {e.id for e in general + finance}
    in_finance = await search(store, scope, "budget review", k=20, thread="t-finance")
    assert {e.thread for e in in_finance} == {"t-finance"} and len(in_finance) == 4
    by_ben = await search(store, scope, "budget review", k=20, author="ben")
    assert {e.id for e in by_ben} == {"t-general-1", "t-general-3"}
    march = await search(
        store, scope, "budget review", k=20, since=START + DAY, until=START + 3 * DAY
    )
    assert {e.id for e in march} == {"t-general-1", "t-general-2", "t-general-3"}
    later = await search(store, scope, "budget review", k=20, since=START + 10 * DAY)
    assert {e.thread for e in later} == {"t-finance"}
    only_here = await recall(store, scope, "budget review", 2000, thread_only=True)
    assert {e.thread for e in only_here} == {"t-general"}


async def test_writing_a_message_again_replaces_it_and_delete_forgets_it(store, tenant):
    stored = f"{store.key_prefix(tenant)}*"
    first = thread_of(
        ["The demo is on Tuesday, in room 4 as usual. Bring the prototype and its charger cable."]
    )
    await store.add(Scope(tenant), first)
    assert len(await store.redis.keys(stored)) == 3  # the message and its two parts
    edited = thread_of(["The demo moved to Wednesday."])
    await store.add(Scope(tenant), edited)
    assert len(await store.redis.keys(stored)) == 1  # the old parts are gone too
    scope = Scope(tenant, "t-general", channel="general")
    found = await search(store, scope, "When is the demo?")
    assert [e.text for e in found] == ["The demo moved to Wednesday."]
    assert await store.delete(Scope(tenant), ["t-general-0"]) == 1
    assert await store.redis.keys(stored) == []
    assert await search(store, scope, "When is the demo?") == []
    assert await recall(store, scope, "When is the demo?") == []


def test_dates_named_in_a_question():
    ((start, end),) = mentioned_periods("What did Maria do on 3 June, 2023?", around=3)
    assert start == datetime(2023, 5, 31, tzinfo=UTC).timestamp()
    assert end == datetime(2023, 6, 7, tzinfo=UTC).timestamp()
    ((start, end),) = mentioned_periods("What happened in July 2023?")
    assert start == datetime(2023, 7, 1, tzinfo=UTC).timestamp()
    assert end == datetime(2023, 8, 8, tzinfo=UTC).timestamp()
    assert mentioned_periods("What happened on March 33, 2023?") == []
    assert mentioned_periods("What did we decide?") == []


def test_a_message_of_several_sentences_has_parts():
    assert parts("Short one.") == []
    assert parts("Hi! Thanks.") == []  # a greeting alone is no part
    text = "We shipped the importer to production today. It reads CSV. And JSON, Avro and Parquet."
    assert parts(text) == [
        "We shipped the importer to production today.",
        "It reads CSV. And JSON, Avro and Parquet.",  # joined: alone, a short one says little
    ]
    many = " ".join(f"Sentence number {i} is long enough to stand alone." for i in range(20))
    assert len(parts(many)) == 7 and " ".join(parts(many)) == many


async def test_a_word_is_found_in_its_other_forms(store, tenant):
    """The index keeps words as written: a question's stem searched as a prefix finds
    `recalibrated` for `recalibrating`, which the whole word alone cannot."""
    texts = [*FILLER[:10], "I recalibrated the spectrometer twice after the outage.", *FILLER[10:]]
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")
    question = "Who has been recalibrating lately?"
    vector = (await store.embedder.embed([question]))[0]

    async def text_hits(stem_weight: float) -> set[str]:
        store.ranking = Ranking(vector_candidates=1, named_candidates=0, stem_weight=stem_weight)
        where = _Filter(scope, _filter(scope), True)
        read = await store._read(scope, question)
        found = await store._candidates(scope, read, vector, where)
        return {i for i, c in found.items() if c.text_score > 0}

    assert "t-general-10" not in await text_hits(0.0)
    assert "t-general-10" in await text_hits(0.5)


async def test_a_bare_word_finds_its_longer_forms(store, tenant):
    """A word with no suffix to cut is searched as a prefix too: "research" finds
    "Researching", which a verbatim match cannot; a short word ("pain") is not, or it would
    find "painting"."""
    texts = [*FILLER[:10], "Researching adoption agencies has been my whole week.", *FILLER[10:]]
    texts.append("The painting class was fun.")
    await store.add(Scope(tenant), thread_of(texts))
    scope = Scope(tenant, "t-general", channel="general")

    async def text_hits(question: str) -> set[str]:
        vector = (await store.embedder.embed([question]))[0]
        store.ranking = Ranking(vector_candidates=1, named_candidates=0)
        where = _Filter(scope, _filter(scope), True)
        read = await store._read(scope, question)
        found = await store._candidates(scope, read, vector, where)
        return {i for i, c in found.items() if c.text_score > 0}

    assert "t-general-10" in await text_hits("What did she research?")
    assert f"t-general-{len(texts) - 1}" not in await text_hits("Any pain lately?")
    assert stems(["research", "pain", "painting"]) == ["research", "paint"]


async def test_the_second_pass_measures_hits_and_neighbours_within_the_audience(store, tenant):
    """Messages found by their words alone, and the neighbours of the best, get their own
    cosine from one filtered KNN; a neighbour said elsewhere stays out."""
    texts = [*FILLER[:4], "The ZK-4471 patch is late.", *FILLER[4:8], "ZK-4471: vendor replied."]
    public = thread_of(texts, "t-mixed")
    public[3].audience = "private:secret"  # said right before the hit, in a private channel
    await store.add(Scope(tenant), public)
    scope = Scope(tenant, "t-other", channel="general")
    question = "What about zk-4471?"
    vector = (await store.embedder.embed([question]))[0]
    store.ranking = Ranking(vector_candidates=1, named_candidates=0)
    where = _Filter(scope, _filter(scope), True)
    read = await store._read(scope, question)
    candidates = await store._candidates(scope, read, vector, where)
    assert any(c.cosine is None for c in candidates.values())  # BM25 alone found it
    store._score(scope, read, candidates)
    await store._expand(scope, candidates, where, frozenset(), vector)
    assert all(c.cosine is not None for c in candidates.values())
    assert {"t-mixed-5", "t-mixed-6", "t-mixed-2"} <= candidates.keys()
    assert "t-mixed-3" not in candidates
    assert all(scope.can_see(c.audience) for c in candidates.values())
