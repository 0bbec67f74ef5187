"""A batch of several tasks is never its tasks' last delivery (bot/spent_tasks.py
`last_delivery`): when it fails, those that used up their deliveries each get a run alone, and
that run is their last. A handler that says something before its task is dead-lettered is told
so on that run, and never on the batch's. Through the real stream consumer and Redis (each
run's delivery count is the stream's own, XPENDING's)."""

from __future__ import annotations

import json

from bot.spent_tasks import last_delivery
from memory.tasks import TaskStream
from tests import test_background
from tests.support.task_deliveries import payload_deliveries
from tests.test_background import drain, work

name = test_background.name  # its fixture: a stream of the test's own

MAX_DELIVERIES = 3


class Told:
    """A handler that fails every batch of several tasks; run alone, it fails the tasks marked
    bad, saying so first when it is told this is their last delivery."""

    def __init__(self) -> None:
        self.stream: TaskStream | None = None  # the work's, once it exists
        self.runs: list[tuple[list[int], int, bool]] = []  # (tasks, deliveries, last)
        self.said: list[int] = []  # tasks whose failure was said before they were given up

    async def __call__(self, payloads: list[dict]) -> None:
        tasks = [p["i"] for p in payloads]
        assert self.stream is not None
        counts = [await payload_deliveries(self.stream, p) for p in payloads]
        self.runs.append((tasks, min(counts), last_delivery()))  # its least delivered task's
        if len(payloads) > 1:
            raise ValueError(f"the batch {tasks} failed")
        [payload] = payloads
        if payload.get("bad"):
            if last_delivery():
                self.said.append(payload["i"])
            raise ValueError(f"task {payload['i']} failed")


async def test_a_spent_batch_is_not_the_last_delivery_its_tasks_run_alone(client, name):
    handler = Told()
    # claimed when idle 1 s: a run's count, read in its handler, is not raced by a claim of
    # its own tasks (its keep-alive late: a stalled loop) counting a delivery not yet given back
    bg = work(client, name, {"a": handler}, max_deliveries=MAX_DELIVERIES, claim_idle_ms=1000)
    handler.stream = bg.stream
    with bg.foreground():  # one read takes them all: they fail, and are claimed, together
        for payload in ({"i": 0}, {"i": 1, "bad": True}, {"i": 2}):
            await bg.submit("a", payload)
    await drain(bg, 20)  # two retries, each after 1 s idle
    await bg.close()

    batches = [(d, last) for tasks, d, last in handler.runs if len(tasks) > 1]
    alone = sorted((tasks, d, last) for tasks, d, last in handler.runs if len(tasks) == 1)
    # redelivered together until their last delivery, never told it was the last
    assert batches == [(n, False) for n in range(1, MAX_DELIVERIES)]
    assert all(tasks == [0, 1, 2] for tasks, _, _ in handler.runs[: MAX_DELIVERIES - 1])
    # then each spent task alone, on its last delivery, and told so
    assert alone == [([i], MAX_DELIVERIES, True) for i in range(3)]
    # the bad one said its failure before it was dead-lettered; the others were acknowledged
    assert handler.said == [1]
    [(_, fields)] = await client.xrange(f"{name}:dead")
    assert json.loads(fields[b"payload"]) == {"i": 1, "bad": True}
    assert await client.xlen(name) == 0
