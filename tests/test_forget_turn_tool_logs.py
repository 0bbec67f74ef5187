"""A forgotten question takes its turn's own tool logs: their inputs quote it (a search for its
words), and its turn's record, which goes, was the only link to them (`TurnRecord.tools`). On
the memory page (`forget_message`) and deleted on the platform (`forget_deleted`); another
question's logs in the same thread, and the answer, stay. Real Redis, scripted model."""

from __future__ import annotations

from memory.scope import Scope
from memory.stores.tool_log import ToolLogEntry
from tests import test_agent_session
from tests.support.scripted_openai import call, text, tool_calls

SECRET = "is the quokka merger with Initech signed"
OTHER = "what does the walrus paper claim"

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
