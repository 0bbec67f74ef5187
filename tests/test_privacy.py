"""What is learned in a DM or a private channel stays there: store by store, tool by tool.

Four places of one workspace: a public channel, another public channel, a private channel, and
two people's DMs with the bot. Each writes into every memory; each read is checked from every
other place.
"""

from __future__ import annotations

import re

import pytest

from bot.toolbox import ToolResult
from memory.scope import Scope, Visibility
from memory.stores.entity import Entity
from memory.stores.summary import Summary, UnknownSummary
from memory.stores.tool_log import ToolLogEntry, UnknownToolLog
from tests.agent_world import close_world, open_world


def places(tenant: str) -> dict[str, Scope]:
    return {
        "public": Scope(tenant, "slack:T:C1:1.0", "C1", Visibility.PUBLIC, "U1", "Ada"),
        "other public": Scope(tenant, "slack:T:C2:2.0", "C2", Visibility.PUBLIC, "U2", "Bo"),
        "private": Scope(tenant, "slack:T:G1:3.0", "G1", Visibility.PRIVATE, "U1", "Ada"),
        "dm": Scope(tenant, "slack:T:D1:dm", "D1", Visibility.DM, "U1", "Ada"),
        "other dm": Scope(tenant, "slack:T:D2:dm", "D2", Visibility.DM, "U2", "Bo"),
    }


def may_see(writer: str, reader: str) -> bool:
    """The rule under test: public memory is team-wide; the rest stays where it was said."""
    return writer == reader or writer in ("public", "other public")


PAIRS = [(w, r) for w in ("public", "private", "dm") for r in places("x") if w != r]


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_entities_and_workflows_stay_in_their_place(memory, tenant):
    where = places(tenant)
    for name, scope in where.items():
        secret = f"Project{name.replace(' ', '').title()}"
        await memory.entities.upsert(scope, [Entity(secret, "system", f"said in {name}")])
        await memory.workflows.add(scope, f"how to deploy {secret}", ["step"], "done")
    vector = (await memory.embedder.embed(["Project deploy"]))[0]
    for reader, scope in where.items():
        seen = {e.description for e in await memory.entities.similar(scope, vector, k=20)}
        expected = {f"said in {w}" for w in where if may_see(w, reader)}
        assert seen == expected, reader
        workflows = await memory.workflows.similar(scope, vector, k=20)
        assert len(workflows) == len(expected), reader


async def test_the_same_name_learned_in_two_places_is_two_entities(memory, tenant):
    where = places(tenant)
    await memory.entities.upsert(where["public"], [Entity("Atlas", "system", "a public cluster")])
    await memory.entities.upsert(where["dm"], [Entity("Atlas", "system", "my side project")])
    vector = (await memory.embedder.embed(["Atlas"]))[0]
    public = await memory.entities.similar(where["other public"], vector)
    assert [e.description for e in public] == ["a public cluster"]
    mine = {e.description for e in await memory.entities.similar(where["dm"], vector)}
    assert mine == {"a public cluster", "my side project"}


@pytest.mark.parametrize(("writer", "reader"), PAIRS)
async def test_summaries_and_tool_logs_by_id(memory, tenant, writer, reader):
    where = places(tenant)
    summary = await memory.summaries.save(
        where[writer], Summary(where[writer].thread, "notes", "the notes", [])
    )
    log_id = await memory.tool_logs.write(
        where[writer], ToolLogEntry(where[writer].thread, "search", {}, "found", "success")
    )
    if may_see(writer, reader):
        assert (await memory.summaries.get(where[reader], summary.id)).text == "the notes"
        assert (await memory.tool_logs.get(where[reader], log_id)).output == "found"
    else:
        with pytest.raises(UnknownSummary):
            await memory.summaries.get(where[reader], summary.id)
        with pytest.raises(UnknownToolLog):
            await memory.tool_logs.get(where[reader], log_id)


async def test_tools_answer_not_found_across_places(world, tenant):
    where = places(tenant)
    memory, harness = world.runtime.memory, world.runtime.harness
    for name in ("private", "dm"):
        scope = where[name]
        await memory.conversation.append(
            scope, "user", f"the launch code of {name} is zanzibar-quill"
        )
        await harness.consolidator.compact(scope)
        ((summary_id, _),) = await memory.summaries.descriptions(scope)
        log_id = await memory.tool_logs.write(
            scope, ToolLogEntry(scope.thread, "search", {}, f"{name} output", "success")
        )
        for reader in ("public", "other dm"):
            context = harness.tool_context(where[reader])
            expanded: ToolResult = await harness.toolbox.execute(
                "expand_summary", f'{{"summary_id": "{summary_id}"}}', context
            )
            read: ToolResult = await harness.toolbox.execute(
                "read_tool_log", f'{{"log_id": "{log_id}"}}', context
            )
            assert expanded.status == read.status == "error"
            assert "No summary with id" in expanded.output and "zanzibar" not in expanded.output
            assert "No tool log with id" in read.output and "output" not in read.output
        own = await harness.toolbox.execute(
            "expand_summary", f'{{"summary_id": "{summary_id}"}}', harness.tool_context(scope)
        )
        assert own.ok and "zanzibar" in own.output
        # `/expand` goes through the same check
        refused = await world.runtime.turns().expand(where["public"], summary_id)
        assert refused.startswith("No summary with id")


async def test_episodic_recall_and_search_respect_places(world, tenant):
    where = places(tenant)
    memory, upkeep = world.runtime.memory, world.runtime.harness.upkeep
    for name, scope in where.items():
        message = await memory.conversation.append(
            scope, "user", f"We decided the budget of the {name} telescope is 7 million"
        )
        await upkeep.after_messages(scope, [message], 0)
    await world.runtime.harness.drain()
    question = "What did we decide about the telescope budget?"
    vector = (await memory.embedder.embed([question]))[0]
    for reader, scope in where.items():
        asker = scope.in_thread(scope.thread + ":later")
        recalled = await memory.episodes.recall(asker, question, vector, 2000, memory.model)
        found = {re.search(r"of the (.+?) telescope", e.text)[1] for e in recalled}
        assert found == {w for w in where if may_see(w, reader)}, reader
        context = world.runtime.harness.tool_context(asker)
        result = await world.runtime.harness.toolbox.execute(
            "search_conversations", f'{{"query": "{question}"}}', context
        )
        for writer in where:
            assert (f"the {writer} telescope" in result.output) == may_see(writer, reader)
