"""A `/summarize` task that will never be done tells its person so, once (adapters/
slack_summarize.py GIVEN_UP), instead of leaving "Checking…" unanswered: dead-lettered unrun
(its last run took its process down: the work's `on_dead_letter` hook), or failing on every
delivery with an unexpected error (said on the last one). Over real HTTP to the mock Web API
and a real Redis, as tests/test_slack_summarize_checks.py.
"""

from __future__ import annotations

import time

from adapters.slack_summarize import GIVEN_UP, MAX_DELIVERIES, SUMMARIZE
from memory.dead_letters import dead_letters
from memory.keys import task_stream
from memory.tasks import TaskStream
from tests.test_slack_summarize_checks import (  # noqa: F401  (the fixtures)
    a_thread,
    acked_then_died,
    api,
    new_stream,
    slack_process,
    told,
    world,
)


async def test_a_check_whose_last_run_never_ended_tells_its_person_it_was_given_up(world, api):  # noqa: F811
    team, stream = f"T{time.time_ns()}", new_stream()
    link = await a_thread(world, api, team, stream, 11)
    task = await acked_then_died(world, api, team, stream, link, "U1", "ada")
    dead = TaskStream(world.runtime.memory.redis, task_stream(stream), consumer="dead")
    await dead.mark_started([task])  # its run began, and took its process down
    for _ in range(MAX_DELIVERIES - 1):  # so did every run after it, to the last delivery
        [task] = await dead.claim_stale(0, 10)
        await dead.mark_started([task])
    assert told(api, "ada") == []  # "Checking…" (the command's answer) only
    async with slack_process(world, api, stream) as (alive, _):
        await alive.wait_idle()  # claimed past its last delivery: dead-lettered, unrun
    assert told(api, "ada") == [GIVEN_UP]
    assert [d.task_id for d in await dead_letters(dead)] == [task.id]


async def test_a_task_failing_on_every_delivery_tells_its_person_once_on_the_last(world, api):  # noqa: F811
    team, stream = f"T{time.time_ns()}", new_stream()
    queue = TaskStream(world.runtime.memory.redis, task_stream(stream))
    await queue.add(SUMMARIZE, {  # no thread: what no run can do (an older version's task)
        "id": "broken", "team": team, "user": "U1", "here": "C1", "channel": "C1",
        "command": {"response_url": api.response_url + "ada"},
    })  # fmt: skip
    async with slack_process(world, api, stream) as (alive, _):
        for _ in range(MAX_DELIVERIES + 1):
            await alive.wait_idle()
        assert len(await dead_letters(queue)) == 1
    assert told(api, "ada") == [GIVEN_UP]
