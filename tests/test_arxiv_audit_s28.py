"""arXiv audit (s28): the shared pace counted from the end of a request in every process (a
slot held while a long download or page runs, and lapsing if its holder died); an unreadable
200 said as such, not as "no papers" (nor as an empty digest period); a download cut off part
way said as such; the save tool taking ids as the search tool shows them (a failed replacement
told without the store's own text: tests/test_arxiv_ingest_s24.py). Its review: a process
already waiting for the slot sends nothing once another's request met a long pause (recorded
before that slot is released); a release lost once sent again; one blank page tried again as
the client tries a failed one; a request whose event loop closed keeps to this process's own
spacing. A real Redis, the local arXiv server, the real client."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from bot.tools import ToolContext, toolbox
from bot.watches import WatchPlace
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import UNREADABLE, ArxivSource, RateLimiter
from memory.ingest.errors import IngestError
from memory.keys import arxiv_blocked_key, arxiv_slot_key
from memory.manager import MemoryManager
from memory.scope import Scope
from tests.support.arxiv_replay import MEMGPT_ID, ArxivReplay
from tests.support.redis_gate import RedisGate
from tests.test_arxiv_ingest_s24 import enc as enc
from tests.test_arxiv_ingest_s24 import kb as kb
from tests.test_arxiv_ingest_s24 import replay as replay
from tests.test_arxiv_ingest_s24 import source as source
from tests.test_watches import ON_TOPIC, T0, entry, place
from tests.test_watches import watch_world as watch_world


def _process(replay: ArxivReplay, client) -> ArxivSource:
    """One process's arXiv client: its own limiter, the slot shared with the others in Redis."""
    pace = SharedPace(client, 0.1, poll_seconds=0.05)
    return ArxivSource(replay.api_url, delay_seconds=0.1, limiter=RateLimiter(), pace=pace)


async def _arrived(replay: ArxivReplay, count: int) -> None:
    async with asyncio.timeout(30):
        while len(replay.requests) < count:
            await asyncio.sleep(0.01)


class _Noting(SharedPace):
    """The real shared pace, noting at each release whether arXiv's pause was recorded yet."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.blocked_at_release: list[bool] = []

    async def release(self, token: str | None) -> None:
        self.blocked_at_release.append(bool(await self.redis.exists(arxiv_blocked_key())))
        await super().release(token)


async def test_another_process_waits_for_a_long_request_to_end(replay, client):
    """Process A's download (slow) and then B's API page (slow) run while the other process
    asks: no request of one starts before the other's has been answered."""
    replay.slow = {"/pdf/": 1.0, "/api/": 1.0}
    first, second = _process(replay, client), _process(replay, client)
    pdf = f"{replay.base}/pdf/{MEMGPT_ID}"
    try:
        download = asyncio.create_task(first.download_pdf(pdf))
        await _arrived(replay, 1)
        search = asyncio.create_task(second.search_candidates("MemGPT"))
        await asyncio.gather(download, search)
        search = asyncio.create_task(second.search_candidates("MemGPT"))
        await _arrived(replay, 3)
        download = asyncio.create_task(first.download_pdf(pdf))
        await asyncio.gather(search, download)
    finally:
        await client.delete(arxiv_slot_key())
    spans = sorted(replay.spans)
    assert [path.split("/")[1] for _, _, path in spans] == ["pdf", "api", "api", "pdf"]
    for (_, answered, _), (arrived, _, _) in itertools.pairwise(spans):
        assert arrived > answered  # never two requests at once, whichever process sent them


async def test_a_holder_that_died_blocks_the_others_for_a_bounded_time(client):
    """A process that took the slot and died mid-request never releases it: it lapses after
    `hold_seconds`; the dead holder's late release leaves the next holder's slot alone."""
    dead = SharedPace(client, 0.1, hold_seconds=0.3)
    live = SharedPace(client, 0.1, poll_seconds=0.05)
    try:
        token = await dead.take()
        assert 0 < await client.pttl(arxiv_slot_key()) <= 300
        mine = await asyncio.wait_for(live.take(), 30)
        await dead.release(token)  # not its slot any more: left as it is
        assert await client.get(arxiv_slot_key()) == mine.encode()
        assert await client.pttl(arxiv_slot_key()) > 1_000  # still held for live's request
        await live.release(mine)
        assert 0 < await client.pttl(arxiv_slot_key()) <= 100  # the spacing, from now
    finally:
        await client.delete(arxiv_slot_key())


@pytest.mark.parametrize("asked", ["page", "pdf"])
async def test_a_process_waiting_for_the_slot_sends_nothing_once_arxiv_asks_a_long_pause(
    replay, client, asked
):
    """A's request (an API page, a PDF) holds the slot while arXiv answers (slowly) 429
    Retry-After 30; B asked meanwhile and waits for the slot: A records the pause before it
    lets the slot go, and B, once it has the slot, fails with the pause's message, sending
    nothing."""
    replay.slow = {"/api/": 0.5, "/pdf/": 0.5}
    replay.busy = [(429, "30")]
    pace = _Noting(client, 0.1, poll_seconds=0.05)
    first = ArxivSource(replay.api_url, delay_seconds=0.1, limiter=RateLimiter(), pace=pace)
    second = _process(replay, client)
    try:
        if asked == "page":
            asking = asyncio.create_task(first.search_candidates("MemGPT"))
        else:
            asking = asyncio.create_task(first.download_pdf(f"{replay.base}/pdf/{MEMGPT_ID}"))
        await _arrived(replay, 1)  # A holds the slot until arXiv has answered
        waiting = asyncio.create_task(second.search_candidates("MemGPT"))
        with pytest.raises(IngestError, match="rate limiting requests; try again in about 1"):
            await asking
        with pytest.raises(IngestError, match="rate limiting requests; try again in about 1"):
            await waiting
    finally:
        await client.delete(arxiv_slot_key())
        await client.delete(arxiv_blocked_key())
    assert pace.blocked_at_release == [True]
    assert len(replay.requests) == 1


async def test_a_release_lost_once_is_sent_again(redis_url, client):
    """The release's connection drops (its client retries nothing itself): the slot is let go
    all the same, not left to stall every process for `hold_seconds`."""
    gate = RedisGate(redis_url)
    gated = Redis.from_url(await gate.start(), retry=Retry(NoBackoff(), 0))
    pace = SharedPace(gated, 0.1)
    try:
        token = await pace.take()
        gate.hold(b"EVALSHA")
        releasing = asyncio.create_task(pace.release(token))
        await gate.held.wait()
        gate.cut()  # the first try is lost with its connection
        gate.mend()
        await releasing
        assert 0 < await client.pttl(arxiv_slot_key()) <= 100  # the spacing only
    finally:
        await client.delete(arxiv_slot_key())
        await gated.aclose()
        await gate.close()


async def test_a_request_whose_loop_closed_keeps_to_its_own_spacing(replay, client):
    """A digest's pages go on in a worker thread after the loop that asked has closed (a
    process stopping): no shared slot to wait for there, the request still goes, spaced by
    this process's own limiter."""
    process = _process(replay, client)
    gone = asyncio.new_event_loop()
    gone.close()
    try:
        found = await asyncio.to_thread(process._for, gone, process.search_sync, "MemGPT")
    finally:
        await client.delete(arxiv_slot_key())
    assert [c.arxiv_id for c in found] == [MEMGPT_ID]


@pytest.mark.parametrize("body", ["<html><body>Busy</body></html>", ""])
async def test_an_unreadable_answer_is_not_taken_for_no_paper(replay, source, body):
    replay.add_response("id", "2401.99998", body)
    replay.add_response("q", "garbled", body)
    with pytest.raises(IngestError) as caught:
        await source.paper("2401.99998")
    assert str(caught.value) == UNREADABLE
    with pytest.raises(IngestError) as caught:
        await source.search_candidates("garbled")
    assert str(caught.value) == UNREADABLE


async def test_one_blank_page_is_tried_again_as_the_client_tries_a_failed_one(replay, source):
    replay.busy = [(200, "")]  # a passing glitch: a 200 with no feed, then the right answer
    assert (await source.paper(MEMGPT_ID)).paper.title.startswith("MemGPT")
    assert len(replay.api_paths()) == 2


async def test_a_digest_whose_first_page_came_blank_once_is_posted(watch_world, tenant):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    world.replay.busy = [(200, "")]
    service = world.process()
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C1"))
    world.clock.now = T0 + 1
    assert await service.check() == [(tenant, watch.id)]
    await world.drain()
    assert world.digests("C1") == [[world.replay.feed[0].arxiv_id]]
    stored = await service.store.get(tenant, watch.id)
    assert stored.failures == 0 and stored.since > watch.since


async def test_a_digest_arxiv_answered_unreadably_is_tried_again(watch_world, tenant):
    """Not an empty period: the watch is due again later and its `since` stays."""
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    world.replay.garbled = True
    service = world.process()
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C1"))
    world.clock.now = T0 + 1
    assert await service.check() == [(tenant, watch.id)]
    await world.drain()
    stored = await service.store.get(tenant, watch.id)
    assert stored.failures == 1 and stored.since == watch.since
    world.replay.garbled = False
    world.clock.now = stored.next_due + 1
    assert await service.check() == [(tenant, watch.id)]
    await world.drain()
    assert world.digests("C1") == [[world.replay.feed[0].arxiv_id]]


@pytest.mark.parametrize("how", ["length", "chunked"])
async def test_a_download_cut_off_part_way_says_so(replay, source, how):
    replay.cut_off[MEMGPT_ID] = how
    url = f"{replay.base}/pdf/{MEMGPT_ID}"
    with pytest.raises(IngestError, match="was cut off; try again in a minute"):
        await source.download_pdf(url)
    del replay.cut_off[MEMGPT_ID]
    assert (await source.download_pdf(url)).startswith(b"%PDF")


@pytest.mark.parametrize(
    "written",
    [
        f"arXiv:{MEMGPT_ID}",
        f"https://arxiv.org/abs/{MEMGPT_ID}v2",
        f"arxiv.org/pdf/{MEMGPT_ID}.pdf",
    ],
)
async def test_the_save_tool_takes_an_id_as_the_search_tool_shows_it(
    replay, source, kb, enc, tenant, written
):
    no_consolidator: Any = None  # the tool never consolidates
    memory = MemoryManager(kb.redis, kb.embedder)
    ctx = ToolContext(Scope(tenant), memory, source, consolidator=no_consolidator, encoding=enc)
    try:
        result = await toolbox.execute(
            "fetch_and_save_paper_to_kb", json.dumps({"arxiv_id": written}), ctx
        )
        assert result.status == "success", result.output
        assert result.output.startswith(f"[arXiv:{MEMGPT_ID}]")
        assert await kb.paper(Scope(tenant), MEMGPT_ID) is not None
    finally:
        await kb.drop_tenant(tenant)
