"""A walled scope (a guest, someone of another organisation) sees only its own place's memory,
so its BM25 query is filtered to it: run over the whole tenant, its top candidates would be the
public messages it may not see, and its own message matching the words never one of them.

The real embedded Redis and the local MiniLM, as tests/test_episodic.py."""

from __future__ import annotations

import pytest

from memory.scope import Scope, Visibility
from memory.stores.episodic import Episode, EpisodicStore

START = 1_700_000_000.0
PUBLIC_MATCHES = 120  # more than the BM25 query's top 100 (`Ranking.text_candidates`)
OWN_OTHERS = 60  # more than the KNN's top 50 (`Ranking.vector_candidates`)
# Long, with the question's words once each: every short public message that has them too
# outranks it by BM25.
TARGET = (
    "After the long call with the vendor about the staffing plan, the travel schedule, the "
    "hardware order, the onboarding calendar and the security review we finally settled the "
    "budget of the pilot at forty thousand euros"
)


@pytest.fixture
async def store(memory, tenant):
    store = EpisodicStore(memory.redis, memory.embedder)
    await store.open()
    yield store
    await memory.drop_tenant(tenant)


def episode(i: int, thread: str, channel: str, audience: str, text: str) -> Episode:
    return Episode(
        id=f"{thread}-{i}", thread=thread, channel=channel, audience=audience, author="u1",
        author_name="Ana", text=text, ts=START + i * 60, seq=i,
    )  # fmt: skip


async def test_a_walled_scope_finds_its_own_message_among_many_public_ones(store, tenant):
    public = [
        episode(
            i, "t-general", "general", "public", f"The budget line {i} of the pilot was approved."
        )
        for i in range(PUBLIC_MATCHES)
    ]
    own = [
        episode(i, "t-shared", "shared", "private:shared", f"Standup note {i}: the demo went fine.")
        for i in range(OWN_OTHERS)
    ]
    own.append(episode(OWN_OTHERS, "t-shared", "shared", "private:shared", TARGET))
    await store.add(Scope(tenant), public + own)
    guest = Scope(tenant, "t-shared-2", "shared", Visibility.PUBLIC, "U9", "Gus", walled=True)
    target = f"t-shared-{OWN_OTHERS}"
    question = "What is the budget of the pilot?"
    # A vector as far from the message as can be: KNN cannot find it, BM25 must.
    away = -(await store.embedder.embed([TARGET]))[0]

    found = await store.find(guest, question, away)
    assert target in found.candidates and found.candidates[target].text_score is not None
    assert all(c.audience == "private:shared" for c in found.candidates.values())

    searched = await store.search(guest, question, away, k=5)
    assert target in [e.id for e in searched]
