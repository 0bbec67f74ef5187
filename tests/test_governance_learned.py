"""What a turn taught goes with its question (memory/governance_learned.py): forgetting a
question (a message, a thread, a deletion on the platform) takes its workflow and its pieces of
each entity, and leaves what other turns (or records from before pieces) taught; a question
forgotten while its turn's entities are written takes only its own pieces; an edit on the
platform replaces what its old text taught. Real Redis, scripted model."""

from __future__ import annotations

import asyncio
import time

from bot.harness import ENTITY_INSTRUCTIONS
from memory.context import assemble_context
from memory.governance_learned import FORGOTTEN, FORGOTTEN_SECONDS
from memory.keys import learned_key
from memory.scope import Scope
from memory.stores.base import vector_bytes
from memory.stores.entity import Entity
from memory.stores.entity_pieces import PIECES
from tests import test_agent_session
from tests.support.scripted_openai import call, text, tool_calls

KESTREL = "Kestrel"


world = test_agent_session.world  # its fixture: an agent world on the test Redis


async def ask(world, scope: Scope, question: str, taught: str, source: str = "") -> str:
    """A turn that uses a tool and teaches `taught` of Kestrel; its stored question's id."""
    world.entities = [{"name": KESTREL, "type": "system", "description": taught}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": KESTREL})), text(f"{KESTREL}: ok.")
    )
    await world.agent.run_turn(scope, question, source=source)
    await world.runtime.harness.drain()
    return await question_id(world, scope, question)


async def question_id(world, scope: Scope, question: str) -> str:
    stored = await world.runtime.memory.conversation.all(scope)
    return next(m.id for m in stored if m.role == "user" and m.content == question)


async def kestrel(world, tenant: str) -> list[Entity]:
    return [e for e in await world.runtime.memory.entities.all(Scope(tenant)) if e.name == KESTREL]


async def workflow_queries(world, tenant: str) -> list[str]:
    texts = await world.runtime.memory.workflows.all(Scope(tenant))
    return sorted(t.split("\n", 1)[0] for t in texts)


async def context_text(world, scope: Scope) -> str:
    context = await assemble_context(world.runtime.memory, scope, f"What is {KESTREL}?")
    return context.render()


async def test_forgetting_one_question_leaves_what_the_other_taught(world, tenant):
    memory = world.runtime.memory
    a, b = Scope(tenant, "ta", user="U1"), Scope(tenant, "tb", user="U2")
    first = await ask(world, a, "What is Kestrel billing?", "Bills customers monthly.")
    await ask(world, b, "Does Kestrel page?", "Pages the on-call engineer at night.")
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Bills customers monthly. Pages the on-call engineer at night."

    erasure = await memory.governance.forget_message(tenant, "ta", first)
    assert (erasure.entities, erasure.workflows) == (1, 1)
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages the on-call engineer at night."
    assert await workflow_queries(world, tenant) == ["QUERY: Does Kestrel page?"]
    seen = await context_text(world, b)
    assert "Pages the on-call engineer" in seen and "monthly" not in seen
    stored = await memory.redis.hget(memory.entities.key(b, KESTREL), "embedding")
    line_vector = (await memory.entities.line_embedder.embed([entity.line()]))[0]
    assert stored == vector_bytes(line_vector)  # embedded again
    record = learned_key(tenant, first)  # kept a day, marked: a late write learns nothing
    assert await memory.redis.sismember(record, FORGOTTEN)
    assert 0 < await memory.redis.ttl(record) <= FORGOTTEN_SECONDS
    again = await memory.governance.forget_message(tenant, "ta", first)  # done already
    assert (again.entities, again.workflows) == (0, 0)


async def test_forgetting_the_only_question_takes_its_entity_and_workflow(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", user="U1")
    only = await ask(world, scope, "What is Kestrel?", "A billing service.")
    assert await kestrel(world, tenant) and await workflow_queries(world, tenant)
    erasure = await memory.governance.forget_message(tenant, "t", only)
    assert (erasure.entities, erasure.workflows) == (1, 1)
    assert await kestrel(world, tenant) == [] and await workflow_queries(world, tenant) == []
    assert "billing service" not in await context_text(world, scope)


async def test_a_deleted_message_takes_what_its_question_taught(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, "What is Kestrel?", "A billing service.", source="C1:111.1")
    erasure = await memory.governance.forget_deleted(tenant, ["t"], "C1:111.1")
    assert (erasure.entities, erasure.workflows) == (1, 1)
    assert await kestrel(world, tenant) == [] and await workflow_queries(world, tenant) == []


async def test_forgetting_a_thread_takes_what_its_questions_taught(world, tenant):
    memory = world.runtime.memory
    a, b = Scope(tenant, "ta", user="U1"), Scope(tenant, "tb", user="U2")
    await ask(world, a, "What is Kestrel billing?", "Bills customers monthly.")
    await ask(world, a, "Who runs Kestrel?", "Run by the payments team.")
    await ask(world, b, "Does Kestrel page?", "Pages the on-call engineer at night.")
    erasure = await memory.governance.forget_thread(tenant, "ta")
    assert (erasure.entities, erasure.workflows) == (1, 2)
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages the on-call engineer at night."
    assert await workflow_queries(world, tenant) == ["QUERY: Does Kestrel page?"]

    erasure = await memory.governance.forget_thread(tenant, "tb")  # the last: all goes
    assert (erasure.entities, erasure.workflows) == (1, 1)
    assert await kestrel(world, tenant) == [] and await workflow_queries(world, tenant) == []


async def test_an_entity_from_before_pieces_keeps_its_description(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", user="U1")
    await memory.entities.upsert(scope, [Entity(KESTREL, "system", "An old billing service.")])
    await memory.redis.hdel(memory.entities.key(scope, KESTREL), PIECES)  # as stored before
    asked = await ask(world, scope, "Does Kestrel page?", "Pages the on-call engineer.")
    [entity] = await kestrel(world, tenant)
    assert entity.description == "An old billing service. Pages the on-call engineer."
    erasure = await memory.governance.forget_message(tenant, "t", asked)
    assert erasure.entities == 1
    [entity] = await kestrel(world, tenant)
    assert entity.description == "An old billing service."


async def test_a_question_forgotten_while_its_entities_are_written_takes_only_its_piece(
    world, tenant
):
    memory, harness = world.runtime.memory, world.runtime.harness
    other = Scope(tenant, "tb", user="U2")
    await ask(world, other, "Does Kestrel page?", "Pages the on-call engineer.")
    scope = Scope(tenant, "ta", user="U1")
    world.hold_entities = asyncio.Event()
    world.entities = [{"name": KESTREL, "type": "system", "description": "A secret launch."}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": KESTREL})), text("Kestrel: ours.")
    )
    await world.agent.run_turn(scope, "Is Kestrel our secret launch?")
    while not any(r["messages"][0]["content"] == ENTITY_INSTRUCTIONS
                  for r in world.model.requests[-3:]):  # fmt: skip
        await asyncio.sleep(0.01)
    asked = await question_id(world, scope, "Is Kestrel our secret launch?")
    await memory.governance.forget_message(tenant, "ta", asked)
    world.hold_entities.set()
    await harness.drain()
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages the on-call engineer."
    assert await workflow_queries(world, tenant) == ["QUERY: Does Kestrel page?"]
    assert "secret launch" not in await context_text(world, other)


async def test_a_platform_edit_replaces_what_the_old_text_taught(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    other = await ask(world, Scope(tenant, "tb", user="U2"), "Does Kestrel page?", "Pages.")
    asked = await ask(world, scope, "Is Kestrel a zebra?", "A zebra farm.", source="C1:9.1")
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages. A zebra farm."

    world.entities = [{"name": KESTREL, "type": "system", "description": "An okapi grant."}]
    await harness.upkeep.message_edited(
        tenant, {"t": "C1"}, "C1:9.1", "Is Kestrel an okapi grant?", time.time()
    )
    await harness.drain()
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages. An okapi grant."
    assert await workflow_queries(world, tenant) == [
        "QUERY: Does Kestrel page?",
        "QUERY: Is Kestrel an okapi grant?",
    ]
    assert "zebra" not in await context_text(world, scope)
    # what the new text taught goes with it too; the other question's piece stays
    erasure = await memory.governance.forget_message(tenant, "t", asked)
    assert (erasure.entities, erasure.workflows) == (1, 1)
    [entity] = await kestrel(world, tenant)
    assert entity.description == "Pages." and other


async def test_concurrent_merges_and_a_removal_lose_no_piece(memory, tenant):
    """The background's merges take no lock: each entity write is a compare-and-set."""
    scope = Scope(tenant, "t", user="U1")
    entities = memory.entities
    await entities.upsert(scope, [Entity(KESTREL, "system", "Piece zero.")], question="q0")
    key = entities.key(scope, KESTREL)
    merges = [
        entities.upsert(scope, [Entity(KESTREL, "system", f"Piece {n}.")], question=f"q{n}")
        for n in range(1, 7)
    ]
    await asyncio.gather(*merges, entities.unlearn(tenant, key, {"q0"}.__contains__))
    [entity] = await kestrel_of(memory, tenant)
    assert all(f"Piece {n}." in entity.description for n in range(1, 7))
    assert "zero" not in entity.description


async def kestrel_of(memory, tenant: str) -> list[Entity]:
    return [e for e in await memory.entities.all(Scope(tenant)) if e.name == KESTREL]


async def test_retention_and_a_persons_erasure_drop_the_records_of_what_questions_taught(
    world, tenant
):
    """Retention keeps entities and workflows, a person's erasure drops them whole: either way
    the per-question records are marked forgotten and expire, so they do not pile up."""
    memory = world.runtime.memory
    first = await ask(world, Scope(tenant, "ta", user="U1"), "What is Kestrel?", "A scheduler.")
    assert await memory.redis.exists(learned_key(tenant, first))
    await memory.governance.sweep_retention(tenant, time.time() + 60)
    assert await memory.governance.learned.forgotten(tenant, first)
    assert 0 < await memory.redis.ttl(learned_key(tenant, first)) <= 86_400
    assert [e.description for e in await kestrel(world, tenant)] == ["A scheduler."]  # kept

    second = await ask(world, Scope(tenant, "tb", user="U2"), "Is Kestrel fast?", "Fast.")
    await memory.governance.forget_person(tenant, "U2")
    assert await memory.governance.learned.forgotten(tenant, second)
    assert 0 < await memory.redis.ttl(learned_key(tenant, second)) <= 86_400
