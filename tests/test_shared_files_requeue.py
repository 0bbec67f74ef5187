"""A share dead-lettered, its cause fixed, requeued (`arxivscout tasks requeue`): its requeued
task reads the file afresh (its kept outcome and count of runs forgotten, once per requeue),
saves the paper, and tells the person the new outcome in the message it posted before."""

from __future__ import annotations

import asyncio
import time

from adapters.shared_files import MAX_DELIVERIES, SHARED_FILES
from bot.background import BackgroundWork
from memory.dead_letters import dead_letters, requeue
from memory.scope import Scope, Visibility
from tests.test_pdf_limits import HangingEnd, redeliver
from tests.test_shared_files_last_delivery import WENT_WRONG
from tests.test_shared_pdfs import share_payload, shared_pdf, stub_files


async def settle(files, stream) -> None:
    work = BackgroundWork(stream, {SHARED_FILES: files.run}, batch=1, claim_idle_ms=100,
                          block_ms=50, max_deliveries=MAX_DELIVERIES,
                          on_dead_letter={SHARED_FILES: files.given_up})  # fmt: skip
    work.start()
    try:
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        await work.close()


async def test_a_requeued_share_reads_its_file_again_and_says_the_new_outcome(memory, tenant):
    end = HangingEnd(shared_pdf("Requeued"))  # its first download hangs: that run dies
    files = stub_files(memory, end, stream_prefix=f"requeue-{time.time_ns()}")
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}")
    stream = files.stream("slack")
    await stream.ensure_group()
    task_id = await stream.add(SHARED_FILES, payload)
    await redeliver(memory.redis, stream.stream, [task_id], times=MAX_DELIVERIES)
    dying = asyncio.create_task(files.one(payload))  # its last run, stuck: then gone
    async with asyncio.timeout(10):
        await end.reading.wait()
    dying.cancel()
    await asyncio.gather(dying, return_exceptions=True)
    try:
        await settle(files, stream)  # claimed past its last delivery: buried, said
        assert end.edits == [("1", WENT_WRONG)]
        [letter] = await dead_letters(stream)

        # the cause fixed (the file downloads now): requeued, it runs and reads the file
        assert await requeue(stream, letter.id)
        await settle(files, stream)
        assert await dead_letters(stream) == []
        [paper] = await memory.knowledge_base.papers(scope)
        assert paper["title"] == "Requeued"
        assert end.edits[-1][0] == "1" and end.edits[-1][1].startswith("Saved *Requeued*")
        assert end.posts == ["_Reading x.pdf…_"]  # its message edited, not a new one
    finally:
        await stream.destroy()
        await files.close()
