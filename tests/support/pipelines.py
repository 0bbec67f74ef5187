"""The `no_pipeline_outlives_its_test` fixture, for every test (tests/conftest.py).

A platform `Pipeline` looks for lapsed threads until it is closed, and takes those of any
tenant: one process serves them all. The event loop is the session's, so a recovery loop that
a test left running would go on taking later tests' jobs, with its test's platform stand-ins
(a channel it never knew is "gone"). Stopping such loops when their test ends keeps each test's
jobs to the adapters it made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

RECOVERY_LOOP = "Pipeline._recover"


@pytest.fixture(autouse=True)
async def no_pipeline_outlives_its_test() -> AsyncIterator[None]:
    yield
    left = [
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") == RECOVERY_LOOP
    ]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)
