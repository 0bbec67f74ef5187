"""arXiv audit (s28): the shared pace counted from the end of a request in every process (a
slot held while a long download or page runs, and lapsing if its holder died); an unreadable
200 said as such, not as "no papers" (nor as an empty digest period); a download cut off part
way said as such; a failed replacement told without the store's own text; the save tool taking
ids as the search tool shows them. A real Redis, the local arXiv server, the real client."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from bot.tools import ToolContext, toolbox
from bot.watches import WatchPlace
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import UNREADABLE, ArxivSource, RateLimiter
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save
from memory.keys import arxiv_slot_key
from memory.manager import MemoryManager
from memory.scope import Scope
from tests.support.arxiv_replay import MEMGPT_ID, ArxivReplay
from tests.support.pdfs import make_pdf
from tests.test_arxiv_ingest_s24 import PAPER_ID, _version
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
    while len(replay.requests) < count:
        await asyncio.sleep(0.01)


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


async def test_a_failed_replacement_is_told_without_the_stores_text(
    replay, source, kb, enc, tenant
):
    scope = Scope(tenant)
    _version(replay, 1, "apples")
    await fetch_and_save(PAPER_ID, scope, kb, kb.embedder, enc, source)
    stored = (await kb.paper(scope, PAPER_ID))["chunks"]
    _version(replay, 2, "oranges")
    await kb.redis.set(kb.chunk_key(tenant, PAPER_ID, stored), "not a hash")
    long_sections = [(f"{n} Part", [f"Oranges in part {n}. " * 200]) for n in range(1, 6)]
    replay.pdfs[PAPER_ID] = make_pdf(long_sections, title="Versioned paper (oranges)")
    try:
        with pytest.raises(IngestError) as caught:
            await fetch_and_save(f"{PAPER_ID}v2", scope, kb, kb.embedder, enc, source)
    finally:
        await kb.drop_tenant(tenant)
    said = str(caught.value)
    assert "WRONGTYPE" not in said and "ResponseError" not in said
    assert "the saved version (v1) was removed" in said
    assert "something went wrong on my side" in said


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
