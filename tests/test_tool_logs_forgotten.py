"""A forgotten message's text does not live on in other turns' tool logs: each log keeps the
ids of the stored messages its output showed (a search's hits, an expanded summary's messages,
a log read back), and forgetting a message (alone, with its thread, or with its author)
deletes every log that showed it, in whichever thread the call was made
(memory/stores/tool_log.py `forget_showing`).

A real Redis, the real harness and consolidator, and the scripted model (tests/agent_world.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from memory.browse import Browse
from memory.keys import shown_in_logs_key, tenant_key
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.base import decode
from memory.stores.conversation import Message
from memory.stores.tool_log import UnknownToolLog
from tests import test_walled_summaries_and_logs
from tests.support.memory_seed import say
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_walled_summaries_and_logs import read_log

SECRET = "hunter2zebra"
DAY = 1_700_000_000.0

world = test_walled_summaries_and_logs.world  # its fixture: a bot process (scripted model)


def places(tenant: str) -> dict[str, Scope]:
    """Four threads of public channel C1: Ada's (ta), Bo's (tb and td) and Cy's (tc)."""

    def at(ts: str, user: str, name: str) -> Scope:
        return Scope(tenant, f"slack:{tenant}:C1:{ts}", "C1", Visibility.PUBLIC, user, name)

    return {"ta": at("1.1", "U1", "Ada"), "tb": at("2.2", "U2", "Bo"),
            "tc": at("3.3", "U3", "Cy"), "td": at("4.4", "U2", "Bo")}  # fmt: skip


@dataclass
class Logs:
    secret: Message  # Ada's line in ta
    search: str  # Bo's search in tb that found it
    expand: str  # Bo's expansion, in tb, of ta's summary over it
    read: str  # Cy's reading, in tc, of the search's log
    kept: str  # Bo's search in td that found only td's own words


async def turn(world, scope: Scope, name: str, arguments: dict) -> str:
    """A turn in `scope` whose one tool call is `name`; the call's log id."""
    world.model.script(tool_calls(call(name, arguments)), text("Done."))
    result = await world.agent.run_turn(scope, "Can you look that up?")
    ((called, log_id),) = [(s.name, s.log_id) for s in result.steps]
    assert called == name and log_id
    return log_id


async def others_read_ada_s_line(world, where: dict[str, Scope]) -> Logs:
    """Ada says her password in ta; other turns' tool calls in tb and tc show it."""
    memory = world.runtime.memory
    await say(memory, where["ta"], "user", "Quick question about the okapi server.", DAY)
    secret = await say(memory, where["ta"], "user", f"my okapi password is {SECRET}", DAY + 1)
    await say(memory, where["ta"], "assistant", "Please keep passwords out of chat.", DAY + 2)
    await say(memory, where["td"], "user", "The lab meeting moved to Thursday.", DAY + 3)
    plain = world.route

    def quoting(body: dict):  # a faithful summary repeats what was said
        if body.get("messages") and body["messages"][0]["content"].startswith("You consolidate"):
            return text(json.dumps({"description": "okapi", "summary": f"Ada: {SECRET}."}))
        return plain(body)

    world.model.router = quoting
    (summary,) = await world.runtime.harness.consolidator.roll(where["ta"], 10)
    assert secret.id in summary.message_ids
    world.model.router = plain
    search = await turn(world, where["tb"], "search_conversations", {"query": "okapi password"})
    expand = await turn(world, where["tb"], "expand_summary", {"summary_id": summary.id})
    read = await turn(world, where["tc"], "read_tool_log", {"log_id": search})
    kept = await turn(
        world, where["td"], "search_conversations", {"query": "lab meeting", "where": "thread"}
    )
    logs = Logs(secret, search, expand, read, kept)
    for log_id, scope in ((search, "tb"), (expand, "tb"), (read, "tc")):
        assert SECRET in (await memory.tool_logs.get(where[scope], log_id)).output
    assert SECRET in await read_log(world, where["td"], search)  # the model reads it back
    assert SECRET not in (await memory.tool_logs.get(where["td"], kept)).output
    return logs


async def logs_holding_the_secret(memory, tenant: str) -> list[str]:
    """Every tool log of the tenant whose input or output holds the secret."""
    found = []
    async for key in memory.redis.scan_iter(match=tenant_key(tenant, "toollog", "*")):
        row = {decode(k): decode(v) for k, v in (await memory.redis.hgetall(key)).items()}
        if SECRET in row.get("output", "") + row.get("tool_input", ""):
            found.append(row["id"])
    return found


async def assert_gone_everywhere(world, where: dict[str, Scope], logs: Logs) -> None:
    memory, tenant = world.runtime.memory, where["tb"].tenant
    assert await logs_holding_the_secret(memory, tenant) == []
    for log_id, scope in ((logs.search, "tb"), (logs.expand, "tb"), (logs.read, "tc")):
        with pytest.raises(UnknownToolLog):
            await memory.tool_logs.get(where[scope], log_id)
        refused = await read_log(world, where["td"], log_id)  # `read_tool_log`, as the model
        assert f"No tool log with id '{log_id}'" in refused and SECRET not in refused
    for scope in ("tb", "tc"):  # the memory page's tool calls of those threads
        page = await Browse(memory).thread(tenant, where[scope].thread, {PUBLIC})
        assert page is not None
        assert all(SECRET not in e.output for e in page.tool_logs)
        assert logs.search not in {e.id for e in page.tool_logs}
    assert not await memory.redis.exists(shown_in_logs_key(tenant, logs.secret.id))
    kept = await memory.tool_logs.get(where["td"], logs.kept)  # showed none of it: stays
    assert "lab meeting moved to Thursday" in kept.output


async def test_forgetting_a_message_deletes_the_logs_that_showed_it(world, tenant):
    where = places(tenant)
    logs = await others_read_ada_s_line(world, where)
    erasure = await world.runtime.memory.governance.forget_message(
        tenant, where["ta"].thread, logs.secret.id
    )
    await assert_gone_everywhere(world, where, logs)
    assert erasure.tool_logs == 3


async def test_forgetting_its_thread_deletes_the_logs_that_showed_it(world, tenant):
    where = places(tenant)
    logs = await others_read_ada_s_line(world, where)
    erasure = await world.runtime.memory.governance.forget_thread(tenant, where["ta"].thread)
    await assert_gone_everywhere(world, where, logs)
    assert erasure.threads == 1 and erasure.tool_logs == 3


async def test_forgetting_its_author_deletes_the_logs_that_showed_it(world, tenant):
    where = places(tenant)
    logs = await others_read_ada_s_line(world, where)
    erasure = await world.runtime.memory.governance.forget_person(tenant, "U1")
    await assert_gone_everywhere(world, where, logs)
    assert erasure.tool_logs == 3
