"""Background embeddings (indexing) run apart from a turn's: their own int8 ONNX session on a
niced runner thread per usable core, their own passes, and vectors close to the float model's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import Upkeep
from memory.connection import connect
from memory.embeddings import (
    BACKGROUND_NICE,
    CachedEmbedder,
    LocalEmbedder,
    background_embedding,
)
from memory.keys import task_stream
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.tasks import TaskStream

TEXTS = ["What does MemGPT page between?", "hello"] + [
    f"sentence {i} about {'long ' * (i * 5 % 9)}episodic memory" for i in range(30)
]


class RecordsPasses(LocalEmbedder):
    """The local model, recording the texts of each pass by the session that ran it."""

    def __init__(self) -> None:
        super().__init__()
        self.foreground: list[list[str]] = []
        self.background: list[list[str]] = []

    def encode_sync(self, texts: list[str]) -> np.ndarray:
        self.foreground.append(list(texts))
        return super().encode_sync(texts)

    def encode_background_sync(self, texts: list[str]) -> np.ndarray:
        self.background.append(list(texts))
        return super().encode_background_sync(texts)


async def test_background_vectors_are_the_int8_models_close_to_the_turns():
    embedder = LocalEmbedder()
    turn = await embedder.embed(TEXTS)
    assert embedder._onnx_background is None, "a turn's pass needs no background session"
    with background_embedding():
        indexing = await embedder.embed(TEXTS)
    assert embedder._onnx_background and embedder._onnx_background is not embedder._onnx
    # one single-thread run per runner: side by side, not one run split over the cores
    threads = embedder._onnx_background.session.get_session_options().intra_op_num_threads
    assert threads == 1
    assert "int8" in embedder._onnx_background.path.name
    cosines = (turn * indexing).sum(axis=1)
    assert cosines.min() >= 0.97 and not np.allclose(cosines, 1.0, atol=1e-6)
    # and it ranks like the float model: each text is nearest to itself
    assert (np.argmax(indexing @ turn.T, axis=1) == np.arange(len(TEXTS))).all()


class WaitsToLoadBackground(LocalEmbedder):
    """The local model, whose background session loads only once `loaded` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = threading.Event()
        self.loaded = threading.Event()

    def _load_onnx(self, threads: int | None = None, quantized: bool = False):
        if quantized:
            self.loading.set()
            self.loaded.wait()
        return super()._load_onnx(threads, quantized)


async def test_a_question_does_not_wait_for_the_background_session_to_load():
    embedder = WaitsToLoadBackground()
    await embedder.embed(["warm-up"])

    async def indexing() -> np.ndarray:
        with background_embedding():
            return await embedder.embed(TEXTS)

    started = asyncio.create_task(indexing())
    try:
        await asyncio.to_thread(embedder.loading.wait)
        question = await asyncio.wait_for(embedder.embed(["a question meanwhile"]), 30)
        assert question.shape == (1, embedder.dims) and not started.done()
    finally:
        embedder.loaded.set()
    assert (await started).shape == (len(TEXTS), embedder.dims)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_one_background_runner_per_core_the_process_may_use():
    embedder = LocalEmbedder()
    embedder.encode_sync(["warm-up"])  # the tokenizer's threads start before the affinity shrinks
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # as `taskset` or a container's cpuset would
    try:
        embedder.encode_background_sync(TEXTS)
    finally:
        os.sched_setaffinity(0, allowed)
    assert embedder._background_pool._max_workers == 1


# A fresh interpreter: the tokenizer's threads are one set per process, started by its first
# tokenization, which here is a background pass; a question follows it.
BACKGROUND_FIRST = """
import asyncio, json, os, threading
from memory.embeddings import LocalEmbedder, background_embedding

def nices():
    return {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}

async def main():
    before = nices()
    embedder = LocalEmbedder()
    with background_embedding():
        await embedder.embed([f"indexed text {i} about episodic memory" for i in range(32)])
    await embedder.embed(["a question after it", "and another one"])
    print(json.dumps({
        "own": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
        "runners": [t.native_id for t in embedder._background_pool._threads],
        "started": {t: n for t, n in nices().items() if t not in before},
    }))

asyncio.run(main())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="threads are niced one by one on Linux only")
def test_a_background_pass_first_leaves_the_tokenizers_threads_at_the_turns_priority():
    ran = subprocess.run(
        [sys.executable, "-c", BACKGROUND_FIRST], cwd=Path(__file__).parents[1],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    seen = json.loads(ran.stdout.splitlines()[-1])
    runners = {str(runner) for runner in seen["runners"]}
    assert runners and runners <= seen["started"].keys()
    others = {t: nice for t, nice in seen["started"].items() if t not in runners}
    assert others, "the tokenizer's and the turns' threads"
    assert set(others.values()) == {seen["own"]}, others
    assert {seen["started"][t] for t in runners} == {min(19, seen["own"] + BACKGROUND_NICE)}


@pytest.mark.skipif(sys.platform != "linux", reason="threads are niced one by one on Linux only")
async def test_background_runs_are_niced_below_the_turns():
    embedder = LocalEmbedder()
    with background_embedding():
        await embedder.embed(TEXTS)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    runners = list(embedder._background_pool._threads)
    assert runners
    for runner in runners:
        nice = os.getpriority(os.PRIO_PROCESS, runner.native_id)
        assert nice == min(19, own + BACKGROUND_NICE)


async def test_turns_and_background_work_never_share_a_pass():
    embedder = RecordsPasses()
    questions = [[f"question {i} about retrieval"] for i in range(3)]

    async def indexing() -> np.ndarray:
        with background_embedding():
            return await embedder.embed(TEXTS)

    *answers, indexed = await asyncio.gather(*(embedder.embed(q) for q in questions), indexing())
    assert [t for p in embedder.background for t in p] == TEXTS  # one lane, in order
    assert sorted(t for p in embedder.foreground for t in p) == sorted(q[0] for q in questions)
    assert len(embedder.background) == 1, "up to BACKGROUND_PASS texts go in one pass"
    for question, vector in zip(questions, answers, strict=True):
        assert np.allclose(vector, embedder.encode_sync(question), atol=1e-5)
    assert indexed.shape == (len(TEXTS), embedder.dims)


async def test_indexing_a_turn_embeds_in_the_background(redis_url: str, tenant: str):
    embedder = RecordsPasses()
    client = await connect(redis_url)
    memory = await MemoryManager(client, CachedEmbedder(embedder, client)).open()
    try:
        upkeep = Upkeep(memory, Consolidator(memory, None), BackgroundWork(
            TaskStream(client, task_stream())))  # fmt: skip
        scope = Scope(tenant, f"{tenant}:t1", "C1", user="U1", user_name="Ada")
        word = f"okapi{uuid.uuid4().hex[:6]}"
        text = f"The {word} survey ran far longer than planned. Its second sentence makes the second part."
        message = await memory.conversation.append(scope, "user", text)
        await upkeep.index_episodes([{"scope": scope.to_dict(), "messages": [asdict(message)]}])
        embedded = [t for p in embedder.background for t in p]
        assert any(word in t for t in embedded) and len(embedded) >= 2  # message and parts
        assert not embedder.foreground
        vector = (await memory.embedder.embed([word]))[0]
        assert await memory.episodes.search(scope, word, vector, k=1)
    finally:
        await memory.close()
