"""A tool log in a private channel G1 that showed the team's memory is read by nobody
(`NOWHERE`), as in a public channel: stored `private:G1` it would be read by G1's walled
guests, who may not read the team's memory (memory/stores/tool_log.py `log_audience`)."""

from __future__ import annotations

import pytest

from memory.scope import NOWHERE, PUBLIC, Scope, Visibility
from memory.stores.tool_log import UnknownToolLog, log_audience
from tests.agent_world import close_world, open_world
from tests.support.memory_seed import say
from tests.test_walled_summaries_and_logs import DAY, read_log, searches


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def g1(tenant: str) -> dict[str, Scope]:
    thread = f"slack:{tenant}:G1:1.1"
    return {
        "member": Scope(tenant, thread, "G1", Visibility.PRIVATE, "U1", "Ada"),
        "guest": Scope(tenant, thread, "G1", Visibility.PRIVATE, "U5", "Gus", walled=True),
        "in C2": Scope(tenant, f"slack:{tenant}:C2:2.2", "C2", Visibility.PUBLIC, "U2", "Bo"),
        "dm": Scope(tenant, f"slack:{tenant}:D2:dm", "D2", Visibility.DM, "U2", "Bo"),
    }


async def test_a_log_of_the_team_s_memory_in_a_private_channel_is_read_by_nobody(world, tenant):
    memory, where = world.runtime.memory, g1(tenant)
    await say(memory, where["in C2"], "user", "The Okavango grant deadline is in May.", DAY)
    shown = await searches(world, where["member"], {"query": "Okavango grant deadline"})
    with pytest.raises(UnknownToolLog):  # not G1's: its guest may not read the team's words
        await memory.tool_logs.get(where["guest"], shown)
    refused = await read_log(world, where["guest"], shown)
    assert f"No tool log with id '{shown}'" in refused and "May" not in refused


def test_only_a_dm_keeps_a_log_of_the_team_s_memory_as_its_own(tenant):
    where = g1(tenant)
    assert log_audience(where["member"], [PUBLIC]) == NOWHERE
    assert log_audience(where["member"], []) == "private:G1"
    assert log_audience(where["dm"], [PUBLIC]) == "dm:D2"
