"""arXiv calls wait their turn (one request per `delay_seconds`) on their own threads: the
default executor, which every turn's question embedding and PDF reads need, stays free."""

from __future__ import annotations

import asyncio
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from memory.ingest.arxiv_source import ArxivSource, RateLimiter
from tests.support.arxiv_replay import MEMGPT_ID, ArxivReplay, memgpt_entry


@pytest.fixture(scope="module")
def replay():
    server = ArxivReplay().start()
    server.add_entry(memgpt_entry(), search_query="MemGPT")
    yield server
    server.stop()


async def _calls_waiting_their_turn(api_url: str) -> None:
    """Three searches queue behind a held slot (their `pace` hook waits for a gate) while a
    job goes to the default executor, two threads here: it must not wait behind them."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
    gate, first_in = asyncio.Event(), asyncio.Event()

    async def pace() -> None:
        first_in.set()
        await gate.wait()

    source = ArxivSource(api_url, delay_seconds=0.0, limiter=RateLimiter(), pace=pace)
    calls = [asyncio.create_task(source.search_candidates("MemGPT")) for _ in range(3)]
    try:
        await first_in.wait()  # the first search holds the slot; the others queue behind it
        job = await asyncio.wait_for(asyncio.to_thread(lambda: "embedded"), timeout=30)
        assert job == "embedded"
        assert not any(call.done() for call in calls)  # still waiting their turn
    finally:
        gate.set()
    found = await asyncio.gather(*calls)
    assert [[c.arxiv_id for c in hits] for hits in found] == [[MEMGPT_ID]] * 3


def test_waiting_arxiv_calls_leave_the_default_executor_free(replay):
    asyncio.run(_calls_waiting_their_turn(replay.api_url))


def test_pacing_holds_across_event_loops(replay):
    """One source used from two event loops (each in its thread): requests stay spaced by the
    delay, and each call's `pace` hook runs on the loop that made the call."""
    source = ArxivSource(replay.api_url, delay_seconds=0.2, limiter=RateLimiter())
    paced_on: list[tuple[int, asyncio.AbstractEventLoop]] = []
    loops: dict[int, asyncio.AbstractEventLoop] = {}

    async def pace() -> None:
        paced_on.append((threading.get_ident(), asyncio.get_running_loop()))

    source.pace = pace

    found: list[list[str] | BaseException] = []  # each search's ids, or what a thread raised

    async def searches(n: int) -> None:
        loops[threading.get_ident()] = asyncio.get_running_loop()
        for _ in range(n):
            found.append([c.arxiv_id for c in await source.search_candidates("MemGPT")])

    def in_thread(n: int) -> None:
        """A failure in a thread is only printed: kept, and asserted on in the test's own."""
        try:
            asyncio.run(searches(n))
        except BaseException as exc:
            found.append(exc)

    start = len(replay.requests)
    threads = [threading.Thread(target=in_thread, args=(2,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == [[MEMGPT_ID]] * 4
    times = [t for t, _ in replay.requests[start:]]
    assert len(times) == 4 and len(paced_on) == 4
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.2
    assert all(loop is loops[thread] for thread, loop in paced_on)
