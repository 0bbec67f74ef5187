"""A question sent with a file is never dropped in silence: a failure that may pass runs the
share's task again, and on its last delivery every failure is said where the file was shared,
and the message's text is queued as a turn all the same (adapters/shared_files.py)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import redis.exceptions

from adapters.shared_files import MAX_DELIVERIES, SHARED_FILES, FetchError
from adapters.slack_files import SlackFileEnd
from bot.background import BackgroundWork
from memory.keys import busy_tenants_key, busy_threads_key, turn_queue_key
from memory.scope import Scope, Visibility
from tests.support.slack_api import MockSlackApi
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

WENT_WRONG = (
    "Sorry, I could not read x.pdf: something went wrong on my side (tried several times); "
    "share it again later."
)


@pytest.fixture
async def slack_api():
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


async def queued_turns(memory, scope: Scope) -> list[str]:
    """The thread's queued jobs, taken out of the queue (no bot of a later test runs them)."""
    key = turn_queue_key(scope.tenant, scope.thread)
    jobs = [
        j.decode() if isinstance(j, bytes) else j for j in await memory.redis.lrange(key, 0, -1)
    ]
    await memory.redis.delete(key)
    await memory.redis.zrem(busy_threads_key(scope.tenant), scope.thread)
    await memory.redis.srem(busy_tenants_key(), f"slack:{scope.tenant}")
    return jobs


async def test_slack_unreachable_or_busy_is_a_failure_that_may_pass(slack_api):
    bare = {"id": "F1", "name": "x.pdf"}  # the event lacked its details: files.info asked
    unreachable = SlackFileEnd("xoxb-test", "http://127.0.0.1:9/api/")
    with pytest.raises(FetchError, match=r"look up x\.pdf: Slack did not answer") as raised:
        await unreachable.describe(bare)
    assert raised.value.retryable
    busy = SlackFileEnd("xoxb-test", slack_api.base_url)
    slack_api.fail("files.info", "internal_error")
    with pytest.raises(FetchError, match=r"internal_error") as raised:
        await busy.describe(bare)
    assert raised.value.retryable
    with pytest.raises(FetchError, match=r"file_not_found") as raised:
        await busy.describe(bare)  # what a person can fix is said at once
    assert not raised.value.retryable


async def test_a_slack_lookup_that_keeps_failing_is_said_and_the_question_still_asked(
    memory, tenant, slack_api
):
    files = stub_files(memory, StubEnd())
    files.ends["slack"] = SlackFileEnd("xoxb-test", slack_api.base_url)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}", turn="what does it say?")
    payload["files"] = [{"id": "F404", "name": "x.pdf"}]  # files.info is asked for the rest
    slack_api.rate_limit("files.info", times=MAX_DELIVERIES)
    for _ in range(MAX_DELIVERIES - 1):
        with pytest.raises(FetchError, match="ratelimited"):
            await files.one(payload)  # the task stays pending: runs again
    assert slack_api.of("chat.postMessage") == []
    await files.one(payload)  # the last delivery says it, and queues the question
    [said] = [p["text"] for p in slack_api.of("chat.postMessage")]
    assert said.startswith("I could not look up x.pdf on Slack (ratelimited).")
    assert said.endswith("I tried several times; share it again later.")
    assert [payload["turn"]] == await queued_turns(memory, scope)


class FailingEnd(StubEnd):
    """A platform side whose lookup or download fails with what is no FetchError: a network
    error a platform did not word, or Redis away while the file is read."""

    def __init__(self, where: str, error: Exception) -> None:
        super().__init__(shared_pdf())
        self.where, self.error = where, error

    async def describe(self, file):
        if self.where == "describe":
            raise self.error
        return file

    async def fetch(self, file, max_bytes):
        if self.where == "fetch":
            raise self.error
        return self.data


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("describe", aiohttp.ServerDisconnectedError()),
        ("fetch", redis.exceptions.ConnectionError("Connection refused")),
    ],
)
async def test_on_the_last_delivery_any_failure_is_said_and_the_turn_queued(
    memory, tenant, where, error
):
    end = FailingEnd(where, error)
    files = stub_files(memory, end)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}", turn="and so?")
    for _ in range(MAX_DELIVERIES - 1):
        with pytest.raises(type(error)):
            await files.one(payload)  # the task stays pending: runs again
    assert await queued_turns(memory, scope) == []  # not before the file is done
    await files.one(payload)  # the last delivery: said, and the question still asked
    assert WENT_WRONG in end.posts + [text for _, text in end.edits]
    assert [payload["turn"]] == await queued_turns(memory, scope)


async def test_the_streams_last_delivery_says_it_though_earlier_ones_never_ran(memory, tenant):
    """Deliveries that failed before the share counted its runs (another copy held its lock)
    still count: the fifth says the failure instead of being dead-lettered in silence."""
    end = FailingEnd("describe", FetchError("Slack is busy (internal_error).", retryable=True))
    files = stub_files(memory, end, stream_prefix=f"last-{time.time_ns()}")
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    share = f"slack:D1:{time.time_ns()}"
    payload = share_payload(scope, share, turn="is it there?")
    assert await files.progress.lock(tenant, share, "another-copy", 60)

    async def run(payloads: list[dict]) -> None:
        # the other copy ends on the stream's fourth delivery: runs 4 and 5 read
        if await stream.deliveries(task_id) >= MAX_DELIVERIES - 1:
            await files.progress.unlock(tenant, share, "another-copy")
        await files.run(payloads)  # before that, each run finds the lock held: ShareBusy

    stream = files.stream("slack")
    work = BackgroundWork(stream, {SHARED_FILES: run}, batch=1, claim_idle_ms=100,
                          block_ms=50, max_deliveries=MAX_DELIVERIES)  # fmt: skip
    work.start()
    try:
        task_id = await stream.add(SHARED_FILES, payload)
        async with asyncio.timeout(60):
            while not end.posts and not end.edits:
                await asyncio.sleep(0.05)
            await work.drain()
    finally:
        await work.close()
    said = end.posts + [text for _, text in end.edits]
    assert any("Slack is busy (internal_error). I tried several times" in s for s in said)
    assert [payload["turn"]] == await queued_turns(memory, scope)
