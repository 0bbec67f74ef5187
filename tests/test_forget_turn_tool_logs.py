"""A forgotten question takes its turn's own tool logs: their inputs quote it (a search for its
words). Each log lists its turn's question (bot/harness.py `run_tool`), so it goes however the
question goes: on the memory page (`forget_message`), deleted on the platform
(`forget_deleted`), while its turn runs (the turn drops them itself: `_kept`), after its answer
took the turn's record; an edit of it takes them as well. Another question's logs in the same
thread, and the answer, stay. Real Redis, scripted model."""

from __future__ import annotations

import asyncio
import time

import pytest

from memory.scope import Scope
from memory.stores.tool_log import ToolLogEntry
from memory.stores.turn_records import UnknownTurn
from tests import test_agent_session
from tests.support.scripted_openai import Reply, call, text, tool_calls

SECRET = "is the quokka merger with Initech signed"
OTHER = "what does the walrus paper claim"
WAIT = 30.0  # seconds a test waits for the held turn to reach the model, at most

world = test_agent_session.world  # its fixture: an agent world on the test Redis


async def ask(world, scope: Scope, words: str, source: str = "") -> str:
    """A turn that searches the conversations for the question's words; its question's id."""
    world.model.script(
        tool_calls(call("search_conversations", {"query": words})), text("I found nothing.")
    )
    question = f"Quick check: {words}?"
    await world.agent.run_turn(scope, question, source=source)
    await world.runtime.harness.drain()
    stored = await world.runtime.memory.conversation.all(scope)
    return next(m.id for m in stored if m.role == "user" and m.content == question)


async def queries(world, scope: Scope) -> list[str]:
    """The search inputs of the thread's tool logs (as the thread page and `memory thread`
    show them)."""
    logs = await world.runtime.memory.tool_logs.recent(scope)
    return sorted(str(e.tool_input.get("query")) for e in logs)


async def test_forgetting_a_question_takes_its_turns_tool_logs(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, OTHER)  # first: its search cannot show the secret (that log goes)
    secret = await ask(world, scope, SECRET)
    assert await queries(world, scope) == [SECRET, OTHER]
    [mine] = [e for e in await memory.tool_logs.recent(scope) if e.tool_input["query"] == SECRET]
    # another thread's call that read the log back quotes it too
    elsewhere = Scope(tenant, "t2", "C1", user="U2")
    await memory.tool_logs.write(elsewhere, ToolLogEntry(
        "t2", "read_tool_log", {"log_id": mine.id}, f"query: {SECRET}", "success",
        author="U2", message_ids=[mine.id],
    ))  # fmt: skip

    erasure = await memory.governance.forget_message(tenant, "t", secret)

    assert erasure.turn_records == 1 and erasure.tool_logs == 2
    assert await queries(world, scope) == [OTHER]
    assert await memory.tool_logs.recent(elsewhere) == []
    stored = [m.content for m in await memory.conversation.all(scope)]
    assert "I found nothing." in stored  # the answer stays, as the README says
    again = await memory.governance.forget_message(tenant, "t", secret)  # nothing left
    assert again.tool_logs == 0


async def test_a_question_deleted_on_the_platform_takes_its_turns_tool_logs(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, OTHER, source="C1:222.2")
    await ask(world, scope, SECRET, source="C1:111.1")

    erasure = await memory.governance.forget_deleted(tenant, ["t"], "C1:111.1")

    assert erasure.turn_records == 1 and erasure.tool_logs == 1
    assert await queries(world, scope) == [OTHER]


def held(world, at: int, *replies: Reply) -> tuple[asyncio.Event, asyncio.Event]:
    """The next turn's model calls get `replies` in order; call `at` (from 1) waits until
    released."""
    entered, release, asked = asyncio.Event(), asyncio.Event(), list[dict]()

    async def respond(body: dict) -> Reply:
        asked.append(body)
        if len(asked) == at:
            entered.set()
            await release.wait()
        return replies[len(asked) - 1]

    world.model.responder = respond
    return entered, release


@pytest.mark.parametrize("at", [1, 2], ids=["before its search", "after its search"])
async def test_a_question_forgotten_while_its_turn_runs_takes_its_tool_logs(world, tenant, at):
    """Forgotten before the turn's search is logged, the erasure cannot find that log: the
    turn, finding its question a tombstone once its record is saved, deletes it (`_kept`).
    Forgotten after, the erasure finds it by the question, as no record is saved yet."""
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, OTHER)
    search = tool_calls(call("search_conversations", {"query": SECRET}))
    entered, release = held(world, at, search, text("I found nothing."))
    question = f"Quick check: {SECRET}?"
    turn = asyncio.create_task(world.agent.run_turn(scope, question))
    await asyncio.wait_for(entered.wait(), WAIT)  # its question stored, the model asked
    stored = await memory.conversation.all(scope)
    asked = next(m.id for m in stored if m.content == question)
    await memory.governance.forget_message(tenant, "t", asked)
    release.set()
    result = await turn
    world.model.responder = None
    await world.runtime.harness.drain()

    assert [s.name for s in result.steps] == ["search_conversations"]
    with pytest.raises(UnknownTurn):
        await memory.turn_records.get(tenant, result.turn_id)
    assert await queries(world, scope) == [OTHER]


async def test_a_question_forgotten_after_its_answer_takes_its_turns_tool_logs(world, tenant):
    """Its answer forgotten first takes the turn's record (question and answer both map to
    it): the question forgotten later still takes its turn's logs."""
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, OTHER)
    secret = await ask(world, scope, SECRET)
    stored = await memory.conversation.all(scope)
    answer = next(m.id for m in reversed(stored) if m.role == "assistant")
    first = await memory.governance.forget_message(tenant, "t", answer)
    assert first.turn_records == 1 and await queries(world, scope) == [SECRET, OTHER]

    erasure = await memory.governance.forget_message(tenant, "t", secret)

    assert erasure.tool_logs == 1
    assert await queries(world, scope) == [OTHER]


async def test_an_edited_question_takes_its_turns_tool_logs_quoting_the_old_text(world, tenant):
    """Edited on the platform, its old text goes from its turn's own logs too, as from the
    logs that showed it."""
    memory = world.runtime.memory
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, OTHER, source="C1:222.2")
    await ask(world, scope, SECRET, source="C1:111.1")

    edit = "Quick check: what is on the menu?"
    followed = await memory.governance.edits.follow(tenant, ["t"], "C1:111.1", edit, time.time())

    assert [m.content for _, m in followed.messages] == [edit]
    assert await queries(world, scope) == [OTHER]
