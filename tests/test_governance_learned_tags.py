"""An entity's `authors` and `threads` tags follow its pieces (memory/stores/entity_pieces.py):
forgetting a question takes out the tags only its pieces brought, so a person's erasure later
spares an entity nothing of theirs is left in; a piece of unknown provenance (no question's, or
learned before provenance was kept) keeps every tag. Real Redis, scripted model."""

from __future__ import annotations

import asyncio
import contextlib

from memory.governance_erasure import NotFound
from memory.scope import Scope
from memory.stores.entity import Entity
from memory.stores.entity_pieces import PIECES, PROVENANCE
from tests import test_governance_learned
from tests.test_governance_learned import KESTREL, ask, kestrel

world = test_governance_learned.world  # its fixture: an agent world on the test Redis


async def tags(memory, scope: Scope) -> dict[str, set[str]]:
    """Kestrel's provenance tags as stored, each a set of ids."""
    key = memory.entities.key(scope, KESTREL)
    authors, threads = await memory.redis.hmget(key, ["authors", "threads"])
    return {
        name: {i for i in (value or b"").decode().split(",") if i}
        for name, value in (("authors", authors), ("threads", threads))
    }


async def test_a_persons_erasure_after_their_only_question_was_forgotten_keeps_the_entity(
    world, tenant
):
    memory = world.runtime.memory
    a, b = Scope(tenant, "ta", user="U1"), Scope(tenant, "tb", user="U2")
    first = await ask(world, a, "What is Kestrel billing?", "Bills customers monthly.")
    await ask(world, b, "Does Kestrel page?", "Pages the on-call engineer at night.")
    assert await tags(memory, b) == {"authors": {"U1", "U2"}, "threads": {"ta", "tb"}}

    await memory.governance.forget_message(tenant, "ta", first)
    assert await tags(memory, b) == {"authors": {"U2"}, "threads": {"tb"}}

    with contextlib.suppress(NotFound):  # nothing of theirs is left anywhere
        await memory.governance.forget_person(tenant, "U1")
    [entity] = await kestrel(world, tenant)  # U2's turn taught it: it stays
    assert entity.description == "Pages the on-call engineer at night."


async def test_a_piece_from_before_provenance_keeps_every_tag(world, tenant):
    """U1's piece was learned before provenance was kept: it may be anyone's, so forgetting
    U2's question takes neither U2 nor tb off the entity, and U2's erasure still takes it."""
    memory = world.runtime.memory
    a, b = Scope(tenant, "ta", user="U1"), Scope(tenant, "tb", user="U2")
    await ask(world, a, "What is Kestrel billing?", "Bills customers monthly.")
    await memory.redis.hdel(memory.entities.key(a, KESTREL), PROVENANCE)  # as stored before
    second = await ask(world, b, "Does Kestrel page?", "Pages the on-call engineer at night.")

    await memory.governance.forget_message(tenant, "tb", second)
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Bills customers monthly."
    assert await tags(memory, b) == {"authors": {"U1", "U2"}, "threads": {"ta", "tb"}}
    await memory.governance.forget_person(tenant, "U2")
    assert await kestrel(world, tenant) == []


async def test_a_description_no_question_owns_keeps_the_old_tags(world, tenant):
    """A record from before pieces: its description is no question's, and its tags (U0's,
    in t0) stay however the questions that taught it more are forgotten."""
    memory = world.runtime.memory
    old = Scope(tenant, "t0", user="U0")
    await memory.entities.upsert(old, [Entity(KESTREL, "system", "An old billing service.")])
    await memory.redis.hdel(memory.entities.key(old, KESTREL), PIECES, PROVENANCE)
    asked = await ask(world, Scope(tenant, "t1", user="U1"), "Does Kestrel page?", "Pages.")

    await memory.governance.forget_message(tenant, "t1", asked)
    [entity] = await kestrel(world, tenant)
    assert entity.description == "An old billing service."
    assert await tags(memory, old) == {"authors": {"U0", "U1"}, "threads": {"t0", "t1"}}


async def test_concurrent_merges_and_a_forget_lose_no_tag(memory, tenant):
    """Merges take no lock: the tags are compared with the pieces, so a forget that crosses
    them reads again and neither takes a merge's author off nor leaves the forgotten one's."""
    entities = memory.entities
    first = Scope(tenant, "t0", user="U0")
    await entities.upsert(first, [Entity(KESTREL, "system", "Piece zero.")], question="q0")
    merges = [
        entities.upsert(
            Scope(tenant, f"t{n}", user=f"U{n}"),
            [Entity(KESTREL, "system", f"Piece {n}.")],
            question=f"q{n}",
        )
        for n in range(1, 7)
    ]
    key = entities.key(first, KESTREL)
    await asyncio.gather(*merges, entities.unlearn(tenant, key, {"q0"}.__contains__))
    assert await tags(memory, first) == {
        "authors": {f"U{n}" for n in range(1, 7)},
        "threads": {f"t{n}" for n in range(1, 7)},
    }
