"""An erasure whose copy step fails once (memory/governance_threads.py `erase_unchanged`,
memory/governance_sweeps.py `person`, `expire`): the logs elsewhere that read back a log of
what goes are deleted before it, so a retry still finds them. Before, the thread or log went
first and a retry found nothing naming the copy (a forgotten thread: NotFound).

The failure is Redis's own: the index of the logs that read the log back (`shown_in_logs_key`)
is made a string for one attempt, so reading it answers WRONGTYPE; no code is patched.

A real Redis, the real harness, and the scripted model (tests/agent_world.py).
"""

from __future__ import annotations

import contextlib
import time

import pytest
from redis.exceptions import ResponseError

from memory.keys import shown_in_logs_key
from memory.scope import Scope, Visibility
from memory.stores.tool_log import ToolLogEntry, UnknownToolLog
from tests import test_walled_summaries_and_logs
from tests.support.memory_seed import say
from tests.test_tool_logs_forgotten import turn

SECRET = "hunter2zebra"
DAY = 1_700_000_000.0

world = test_walled_summaries_and_logs.world  # its fixture: a bot process (scripted model)


def in_c1(tenant: str, ts: str, user: str = "U1") -> Scope:
    return Scope(tenant, f"slack:{tenant}:C1:{ts}", "C1", Visibility.PUBLIC, user, user)


async def a_log_read_back(world, there: Scope, here: Scope, created_at: float) -> tuple[str, str]:
    """A log in `there` showing the secret (indexed under no message), and the log of a turn
    in `here` that read it back: (the log, its copy)."""
    memory = world.runtime.memory
    fetched = ToolLogEntry(there.thread, "fetch_url", {"url": "x"}, f"vault code {SECRET}",
                           "success", created_at=created_at, audience="public",
                           author=there.user)  # fmt: skip
    log_id = await memory.tool_logs.write(there, fetched)
    copy = await turn(world, here, "read_tool_log", {"log_id": log_id})
    assert SECRET in (await memory.tool_logs.get(here, copy)).output
    return log_id, copy


@contextlib.asynccontextmanager
async def copies_unreadable(memory, tenant: str, log_id: str):
    """The index of the logs that read `log_id` back answers WRONGTYPE in the body; then it
    is as it was."""
    key = shown_in_logs_key(tenant, log_id)
    members = await memory.redis.smembers(key)
    assert members
    await memory.redis.delete(key)
    await memory.redis.set(key, "not a set")
    try:
        yield
    finally:
        await memory.redis.delete(key)
        await memory.redis.sadd(key, *members)


async def test_a_thread_s_erasure_retried_after_its_copy_step_failed(world, tenant):
    memory = world.runtime.memory
    there, here = in_c1(tenant, "1.1"), in_c1(tenant, "2.2")
    await say(memory, there, "user", "fetch the vault page", DAY)
    log_id, copy = await a_log_read_back(world, there, here, time.time())
    async with copies_unreadable(memory, tenant, log_id):
        with pytest.raises(ResponseError):
            await memory.governance.forget_thread(tenant, there.thread)
    erasure = await memory.governance.forget_thread(tenant, there.thread)  # no NotFound
    assert erasure.threads == 1
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(here, copy)


async def test_a_person_s_erasure_retried_after_its_copy_step_failed(world, tenant):
    memory = world.runtime.memory
    there, here = in_c1(tenant, "1.1"), in_c1(tenant, "2.2", user="U2")
    await say(memory, there, "user", "fetch the vault page", DAY)
    log_id, copy = await a_log_read_back(world, there, here, time.time())
    async with copies_unreadable(memory, tenant, log_id):
        with pytest.raises(ResponseError):
            await memory.governance.forget_person(tenant, "U1")
    await memory.governance.forget_person(tenant, "U1")
    for scope, gone in ((there, log_id), (here, copy)):
        with pytest.raises(UnknownToolLog):
            await memory.tool_logs.get(scope, gone)


async def test_a_retention_sweep_retried_after_its_copy_step_failed(world, tenant):
    memory = world.runtime.memory
    there, here = in_c1(tenant, "1.1"), in_c1(tenant, "2.2")
    await say(memory, there, "user", "fetch the vault page", DAY)
    await say(memory, there, "user", "and today's too", time.time())  # the thread stays
    log_id, copy = await a_log_read_back(world, there, here, DAY)
    async with copies_unreadable(memory, tenant, log_id):
        with pytest.raises(ResponseError):
            await memory.governance.sweep_retention(tenant, DAY + 100)
    await memory.governance.sweep_retention(tenant, DAY + 100)
    for scope, gone in ((there, log_id), (here, copy)):
        with pytest.raises(UnknownToolLog):
            await memory.tool_logs.get(scope, gone)
