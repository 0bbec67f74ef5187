"""A failure that may pass (Slack's 5xx, a download or the embedding API failing quickly) is
tried again within the share's task (adapters/shared_files.py `Patience`: after each of
`retry_delays`, while the task's `retry_seconds` last, for all its files), before the task fails
and waits CLAIM_IDLE_MS for its redelivery with "Reading…" up; a failure that will not pass is
not retried, nor a step that ran long (a download timing out), and an embedding failure redoes
that call, not the PDF's read. The ends and the embedder are the test's (no code of ours
patched); the delays and budgets are the SharedFiles' own options."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest
import redis.exceptions

from adapters.shared_files import FetchError, may_pass
from memory.embeddings import EmbeddingError
from memory.keys import turn_queue_key
from memory.manager import MemoryManager
from memory.scope import Scope, Visibility
from tests.support.pdfs import make_pdf
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

NO_WAIT = (0.0, 0.0)  # three tries, at once


@pytest.fixture(autouse=True)
async def dropped_after(memory, tenant):
    yield
    await memory.drop_tenant(tenant)


BUSY = FetchError("Slack is busy (internal_error).", retryable=True)


class FlakyEnd(StubEnd):
    """Fails its first `describe_fails` lookups with `error` (Slack's 5xx), and its first
    `fail_fetch` downloads (StubEnd's retryable timeout); counts the lookups."""

    def __init__(
        self, data: bytes, describe_fails: int = 0, fail_fetch: int = 0, error=BUSY
    ) -> None:
        super().__init__(data, fail_fetch=fail_fetch)
        self.describe_fails, self.error, self.calls = describe_fails, error, 0

    async def describe(self, file):
        self.calls += 1
        if self.describe_fails:
            self.describe_fails -= 1
            raise self.error
        return file


def dm(tenant: str) -> Scope:
    return Scope(tenant, "t", channel="D1", user="U1", visibility=Visibility.DM)


@pytest.mark.parametrize("where", ["describe", "fetch"])
async def test_a_passing_failure_is_tried_again_within_the_task(memory, tenant, where):
    fails = {"describe_fails": 2} if where == "describe" else {"fail_fetch": 2}
    end = FlakyEnd(shared_pdf("Patient"), **fails)
    files = stub_files(memory, end, retry_delays=NO_WAIT)
    scope = dm(tenant)
    await files.one(share_payload(scope, f"slack:D1:{time.time_ns()}", turn="and so?"))
    assert end.posts == ["_Reading x.pdf…_"]
    assert end.edits[-1][1].startswith("Saved *Patient*")
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 1


async def test_a_failure_lasting_past_the_tries_fails_the_task(memory, tenant):
    end = FlakyEnd(shared_pdf(), describe_fails=10)
    files = stub_files(memory, end, retry_delays=NO_WAIT)
    with pytest.raises(FetchError):
        await files.one(share_payload(dm(tenant), f"slack:D1:{time.time_ns()}"))
    assert end.calls == 3  # then it runs again, as before


async def test_a_failure_that_will_not_pass_is_not_tried_again(memory, tenant):
    refused = FetchError("I cannot see x.pdf: the bot is not in that channel.")
    end = FlakyEnd(shared_pdf(), describe_fails=1, error=refused)
    files = stub_files(memory, end, retry_delays=NO_WAIT)
    await files.one(share_payload(dm(tenant), f"slack:D1:{time.time_ns()}"))
    assert end.calls == 1 and end.posts == ["I cannot see x.pdf: the bot is not in that channel."]


def embedding_error(cause: BaseException) -> EmbeddingError:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise EmbeddingError(f"OpenAI embeddings failed: {exc}") from exc
    except EmbeddingError as wrapped:
        return wrapped


def test_what_may_pass():
    assert may_pass(FetchError("timed out", retryable=True))
    assert not may_pass(FetchError("not in the channel"))
    assert may_pass(embedding_error(aiohttp.ClientConnectionError("reset")))
    assert not may_pass(EmbeddingError("Unknown dimensions for embedding model 'x'"))
    assert not may_pass(redis.exceptions.ConnectionError("Connection refused"))  # the task's


class SlowFailingEnd(StubEnd):
    """Its first download fails retryably after `pause` seconds: it ran long (as one timing
    out does), then the next would succeed."""

    def __init__(self, data: bytes, pause: float) -> None:
        super().__init__(data)
        self.pause, self.fetches = pause, 0

    async def fetch(self, file, max_bytes):
        self.fetches += 1
        if self.fetches == 1:
            await asyncio.sleep(self.pause)
            raise FetchError("I could not download x.pdf: Slack took too long.", retryable=True)
        return self.data


async def test_a_step_that_ran_long_is_not_tried_again_within_the_task(memory, tenant):
    end = SlowFailingEnd(shared_pdf("Slow"), pause=0.3)
    files = stub_files(memory, end, retry_delays=NO_WAIT, long_step_seconds=0.05)
    with pytest.raises(FetchError, match="took too long"):
        await files.one(share_payload(dm(tenant), f"slack:D1:{time.time_ns()}"))
    assert end.fetches == 1  # its redelivery downloads again, not this task


class FirstLookupFails(StubEnd):
    """Each file's first lookup fails (Slack's 5xx); counts the lookups."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.seen: set[str] = set()
        self.calls = 0

    async def describe(self, file):
        self.calls += 1
        if file["id"] not in self.seen:
            self.seen.add(file["id"])
            raise BUSY
        return file


class Clock:
    """A clock that moves only as its `sleep` is awaited (what the retries wait, recorded)."""

    def __init__(self) -> None:
        self.now, self.sleeps = 1000.0, []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_the_retry_budget_is_the_tasks_for_all_its_files(memory, tenant):
    """The first file's retry starts within the budget; by the second file's failure (after
    that retry's one-second wait) it is spent: the task fails, to run again later."""
    end = FirstLookupFails(shared_pdf("Budgeted"))
    clock = Clock()
    files = stub_files(memory, end, retry_delays=(1.0,), retry_seconds=1.5, clock=clock,
                       sleep=clock.sleep)  # fmt: skip
    payload = share_payload(dm(tenant), f"slack:D1:{time.time_ns()}")
    payload["files"].append({**payload["files"][0], "id": "F2", "name": "y.pdf"})
    with pytest.raises(FetchError):
        await files.one(payload)
    assert clock.sleeps == [1.0] and end.calls == 3
    assert end.edits[-1][1].startswith("Saved *Budgeted*")  # the first file's


async def test_a_retry_waits_no_longer_once_the_process_stops(memory, tenant):
    """A closing process waits for its running tasks (bot/background.py): a task waiting to
    try again raises its failure as the process stops reading, not after its wait (ten
    minutes here), and runs again in the next process."""
    end = FlakyEnd(shared_pdf("Stopped"), describe_fails=1)
    files = stub_files(memory, end, retry_delays=(600.0,), retry_seconds=900.0)
    task = asyncio.create_task(files.one(share_payload(dm(tenant), f"slack:D1:{time.time_ns()}")))

    async def first_call() -> None:  # or the task ended before it: the asserts below say how
        while not end.calls and not task.done():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(first_call(), 30)  # a guard against a hang, not a timing
    await files.stop_reading()
    with pytest.raises(FetchError, match="busy"):
        await asyncio.wait_for(task, 30)  # a guard against a hang, not a timing
    assert end.calls == 1


class EverySecondCallFails:
    """An embedder (the memory's, for its vectors) whose every second call fails as an
    unreachable embedding API does: a failure that may pass."""

    def __init__(self, embedder) -> None:
        self.embedder, self.calls = embedder, 0
        self.model_name, self.dims = embedder.model_name, embedder.dims

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if self.calls % 2 == 0:
            raise embedding_error(aiohttp.ClientConnectionError("reset"))
        return np.ones((len(texts), self.dims), dtype=np.float32) / np.sqrt(self.dims)


def long_pdf() -> bytes:
    """A PDF of more passages than one embedding call takes (EMBED_BATCH): two calls."""
    words = " ".join(f"word{i} of a long paragraph about sharing papers" for i in range(40))
    return make_pdf([(f"{n} Part", [words] * 6) for n in range(1, 25)], title="Long")


async def test_an_embedding_failure_redoes_that_call_not_the_whole_save(memory, tenant):
    """Were the save run again (the PDF read anew, every call again), each run would fail on
    its second call; tried again alone, that call succeeds and the PDF is saved."""
    embedder = EverySecondCallFails(memory.embedder)
    flaky = MemoryManager(memory.redis, embedder)  # type: ignore[arg-type]
    end = StubEnd(long_pdf())
    files = stub_files(flaky, end, retry_delays=NO_WAIT)
    scope = dm(tenant)
    await files.one(share_payload(scope, f"slack:D1:{time.time_ns()}"))
    assert end.edits[-1][1].startswith("Saved *Long*")
    assert embedder.calls == 3  # the first batch, the second failing, the second again
