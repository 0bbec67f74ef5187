"""A summary or a tool log is stored for who may see what it holds, not only for who wrote it
(memory/scope.py `narrowest`). In a public channel C, what a walled person (a guest) said is
C's private memory (`private:<C>`): a member's rolling summary of it, a summary merged from
it, and the log of a member's search that found it are shown in C, nobody elsewhere. A log
that found nothing of the kind stays the team's.

A real Redis, the real harness and consolidator, and the scripted model (tests/agent_world.py).
"""

from __future__ import annotations

import json

import pytest

from memory.browse import Browse
from memory.context import assemble_context
from memory.scope import NOWHERE, PUBLIC, Scope, Visibility
from memory.stores.summary import Summary, UnknownSummary
from memory.stores.tool_log import UnknownToolLog
from tests.agent_world import close_world, open_world
from tests.support.memory_seed import say
from tests.support.scripted_openai import call, text, tool_calls

DEADLINE = "the Okavango grant deadline is the ides of March"  # said by the guest in C1
DAY = 1_700_000_000.0


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def places(tenant: str) -> dict[str, Scope]:
    """A member and a guest in public C1's thread, someone in another thread of C1, in public
    C2 and in a DM."""
    c1 = f"slack:{tenant}:C1:1.1"
    return {
        "member": Scope(tenant, c1, "C1", Visibility.PUBLIC, "U1", "Ada"),
        "guest": Scope(tenant, c1, "C1", Visibility.PUBLIC, "U5", "Gus", walled=True),
        "in C1": Scope(tenant, f"slack:{tenant}:C1:5.5", "C1", Visibility.PUBLIC, "U2", "Bo"),
        "in C2": Scope(tenant, f"slack:{tenant}:C2:2.2", "C2", Visibility.PUBLIC, "U2", "Bo"),
        "dm": Scope(tenant, f"slack:{tenant}:D2:dm", "D2", Visibility.DM, "U2", "Bo"),
    }


async def guest_speaks_in_c1(memory, where: dict[str, Scope]) -> None:
    """A member's question, the guest's answer (stored `private:C1`), the member's thanks."""
    member, guest = where["member"], where["guest"]
    await say(memory, member, "user", "When is the grant deadline, does anyone know?", DAY)
    told = await say(memory, guest, "user", f"Gus here: {DEADLINE}.", DAY + 1)
    assert told.audience == "private:C1"
    await say(memory, member, "user", "Thanks, I will plan the draft around it.", DAY + 2)


def summaries_quote_the_guest(world) -> None:
    """The model's notes repeat what the guest said, as a faithful summary does."""
    plain = world.route

    def route(body: dict):
        if body.get("messages") and body["messages"][0]["content"].startswith("You consolidate"):
            note = {"description": "grant deadline", "summary": f"Gus said {DEADLINE}."}
            return text(json.dumps(note))
        return plain(body)

    world.model.router = route


async def expand(world, scope: Scope, summary_id: str) -> str:
    """The `expand_summary` tool, as the agent calls it in `scope`."""
    harness = world.runtime.harness
    result = await harness.toolbox.execute(
        "expand_summary", json.dumps({"summary_id": summary_id}), harness.tool_context(scope)
    )
    return result.output


async def read_log(world, scope: Scope, log_id: str) -> str:
    harness = world.runtime.harness
    result = await harness.toolbox.execute(
        "read_tool_log", json.dumps({"log_id": log_id}), harness.tool_context(scope)
    )
    return result.output


async def test_a_member_s_summary_of_a_guest_s_words_is_shown_in_c1_only(world, tenant):
    memory, where = world.runtime.memory, places(tenant)
    await guest_speaks_in_c1(memory, where)
    summaries_quote_the_guest(world)
    (summary,) = await world.runtime.harness.consolidator.roll(where["member"], 10)
    assert "ides of March" in summary.text
    assert summary.audience == "private:C1"  # as the guest's words are, not the member's public

    for elsewhere in ("in C2", "dm"):
        scope = where[elsewhere]
        refused = await expand(world, scope, summary.id)
        assert f"No summary with id '{summary.id}'" in refused, refused
        assert "ides of March" not in refused
        slash = await world.runtime.turns().expand(scope, summary.id)  # `/expand`
        assert slash.startswith("No summary with id") and "ides of March" not in slash
        with pytest.raises(UnknownSummary):
            await memory.summaries.get(scope, summary.id)
        # guards: the Summary segment lists the asker's own thread only, and episodic recall
        # holds messages (the guest's is `private:C1`), not summaries
        context = await assemble_context(memory, scope, "When is the Okavango grant deadline?")
        assert summary.id not in context.render() and "ides of March" not in context.render()

    for here in ("member", "guest", "in C1"):  # whoever asks in C1, walled or not
        assert "Gus said the Okavango grant deadline" in await expand(
            world, where[here], summary.id
        )
    context = await assemble_context(memory, where["member"], "When is the grant deadline?")
    assert summary.id in context.segment("Summary").text

    browse, thread = Browse(memory), where["member"].thread
    members = await browse.thread(tenant, thread, {PUBLIC, "private:C1"})
    assert members is not None and [s.id for s in members.summaries] == [summary.id]
    others = await browse.thread(tenant, thread, {PUBLIC, "private:C2"})
    assert others is not None and others.summaries == []  # the thread is public; not the summary
    assert await browse.summary(tenant, summary.id, {PUBLIC, "private:C2", "dm:D2"}) is None


async def test_a_summary_merged_from_a_guest_s_summary_is_shown_in_c1_only(world, tenant):
    memory, where = world.runtime.memory, places(tenant)
    member, thread = where["member"], where["member"].thread
    await guest_speaks_in_c1(memory, where)
    messages = await memory.conversation.all(member)
    said = await memory.summaries.save(
        member, Summary(thread, "the question", "Ada asked.", [messages[0].id])
    )
    quoted = await memory.summaries.save(
        member, Summary(thread, "the deadline", f"Gus: {DEADLINE}", [messages[1].id],
                        audience="private:C1"),
    )  # fmt: skip
    assert (said.audience, quoted.audience) == (PUBLIC, "private:C1")
    merged = Summary(thread, "two notes", f"Ada asked; Gus: {DEADLINE}",
                     [messages[0].id, messages[1].id], level=1)  # fmt: skip
    await memory.summaries.merge(member, merged, [said, quoted])
    assert merged.audience == "private:C1"
    with pytest.raises(UnknownSummary):
        await memory.summaries.get(where["in C2"], merged.id)
    assert (await memory.summaries.get(where["in C1"], merged.id)).text == merged.text


async def searches(world, scope: Scope, arguments: dict) -> str:
    """A member's turn in `scope` that searches past conversations; the log of the search."""
    world.model.script(tool_calls(call("search_conversations", arguments)), text("I looked."))
    result = await world.agent.run_turn(scope, "When is the grant deadline?")
    ((name, log_id),) = [(s.name, s.log_id) for s in result.steps]
    assert name == "search_conversations" and log_id
    return log_id


async def test_the_log_of_a_search_that_found_a_guest_s_words_stays_in_c1(world, tenant):
    memory, where = world.runtime.memory, places(tenant)
    await guest_speaks_in_c1(memory, where)
    asking = where["in C1"]
    found = await searches(world, asking, {"query": "Okavango grant deadline", "author": "U5"})
    entry = await memory.tool_logs.get(asking, found)
    assert "ides of March" in entry.output and entry.audience == "private:C1"
    for elsewhere in ("in C2", "dm"):
        refused = await read_log(world, where[elsewhere], found)
        assert f"No tool log with id '{found}'" in refused, refused
    for here in ("member", "guest"):  # C1's own private memory, nothing of the team's
        assert "ides of March" in await read_log(world, where[here], found)

    # what the team said elsewhere and the guest's words: no place may read both
    long = "The Okavango grant deadline moved? " + "Budget lines follow. " * 200
    await say(memory, where["in C2"], "user", long, DAY + 3)
    both = await searches(world, asking, {"query": "Okavango grant deadline", "k": 10})
    (shown,) = [m["content"] for m in world.model_requests()[-1]["messages"] if m["role"] == "tool"]
    assert "[Truncated. The rest cannot be read back" in shown and both not in shown
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(where["in C2"], both)
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(where["guest"], both)
    admin = await Browse(memory).tool_log(tenant, both, None)
    assert admin is not None and admin.audience == NOWHERE and "ides of March" in admin.output


async def test_the_log_of_a_search_that_found_only_the_team_s_words_stays_public(world, tenant):
    memory, where = world.runtime.memory, places(tenant)
    await guest_speaks_in_c1(memory, where)
    plain = await searches(world, where["in C1"], {"query": "grant deadline", "author": "U1"})
    entry = await memory.tool_logs.get(where["in C2"], plain)  # read team-wide
    assert entry.audience == PUBLIC and "Ada" in entry.output
    assert "ides of March" not in entry.output
