"""Poison input stays alone: text that is not valid UTF-8 fails nothing, and a text the
embedding model refuses fails only the caller that sent it, not the turns batched with it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import numpy as np
import pytest

from adapters.terminal import decode_line
from memory.embeddings import CachedEmbedder, EmbeddingError, LocalEmbedder
from memory.text import clean_text
from memory.tokens import count_tokens
from tests.support.scripted_openai import ScriptedOpenAI
from tests.test_cli_agent import scenario_model

LONE = "\ud800"  # a lone surrogate: Python holds it, UTF-8 cannot encode it
POISON = "poison-marker"


def test_clean_text_replaces_only_what_utf8_cannot_encode():
    assert clean_text(f"a{LONE}b\udfffc") == "a?b?c"
    assert clean_text("plain ascii") == "plain ascii"
    assert clean_text("déjà vu ✓ 🙂") == "déjà vu ✓ 🙂"  # valid non-ASCII, surrogate pairs too
    clean_text(f"x{LONE}").encode("utf-8")  # must not raise


def test_token_counts_take_lone_surrogates():
    """tiktoken replaces them itself; this keeps the counter honest if that ever changes."""
    assert count_tokens(f"a{LONE}b\nsecond line {LONE}", "gpt-5-mini") > 0


def test_the_terminal_reader_tells_utf8_from_garbage():
    assert decode_line("caf\u00e9\n".encode()) == "café\n"
    assert decode_line("typed") == "typed"
    with pytest.raises(UnicodeError):
        decode_line(b"\xff\xfe bad\n")
    with pytest.raises(UnicodeError):  # what surrogateescape makes of those bytes
        decode_line(b"\xff\xfe bad\n".decode("utf-8", "surrogateescape"))


async def test_the_embedder_takes_lone_surrogates(local_embedder):
    poisoned, cleaned = await asyncio.gather(
        local_embedder.embed([f"attention {LONE} heads"]),
        local_embedder.embed(["attention ? heads"]),
    )
    assert np.allclose(poisoned, cleaned, atol=1e-5)
    long = f"long passage {LONE} " * 60  # past SHORT_CHARS: the torch runtime
    assert local_embedder.encode_sync([long]).shape == (1, local_embedder.dims)


async def test_the_cached_embedder_caches_the_cleaned_text(memory):
    text = f"cache {uuid.uuid4().hex} {LONE}"
    vector = await memory.embedder.embed_one(text)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
    assert await memory.redis.exists(memory.embedder._key(clean_text(text)))


class RefusesMarker(LocalEmbedder):
    """A model that cannot take one text: any pass holding the marker raises. Records each
    pass, so the test sees that the callers were batched together first."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[list[str]] = []

    def encode_sync(self, texts: list[str]) -> np.ndarray:
        self.passes.append(list(texts))
        if any(POISON in t for t in texts):
            raise EmbeddingError(f"the model refused {POISON}")
        return super().encode_sync(texts)


@pytest.fixture(scope="module")
def refusing() -> RefusesMarker:
    return RefusesMarker()


async def test_a_failed_batch_is_retried_caller_by_caller(refusing, local_embedder):
    refusing.passes.clear()
    first, bad, second = ["first question"], [f"{POISON} here"], ["second", "third question"]
    results = await asyncio.gather(
        refusing.embed(first), refusing.embed(bad), refusing.embed(second), return_exceptions=True
    )
    assert refusing.passes[0] == first + bad + second  # one pass for the three callers
    assert isinstance(results[1], EmbeddingError)
    assert np.allclose(results[0], local_embedder.encode_sync(first), atol=1e-5)
    assert np.allclose(results[2], local_embedder.encode_sync(second), atol=1e-5)


async def test_a_lone_failing_caller_gets_its_error_without_a_retry(refusing):
    refusing.passes.clear()
    with pytest.raises(EmbeddingError):
        await refusing.embed([f"{POISON} alone"])
    assert len(refusing.passes) == 1


async def test_through_the_cache_only_the_poisoned_caller_fails(refusing, memory):
    cached = CachedEmbedder(refusing, memory.redis)
    tag = uuid.uuid4().hex
    good, bad = [f"good {tag}"], [f"{POISON} {tag}"]
    results = await asyncio.gather(cached.embed(good), cached.embed(bad), return_exceptions=True)
    assert isinstance(results[1], EmbeddingError)
    assert results[0].shape == (1, refusing.dims) and np.linalg.norm(results[0][0]) > 0.99
    assert await memory.redis.exists(cached._key(good[0]))
    assert not await memory.redis.exists(cached._key(bad[0]))
    assert (await cached.embed(good)).shape == (1, refusing.dims)  # nothing left in flight


@pytest.fixture(scope="module")
def echo_model():
    model = ScriptedOpenAI(responder=scenario_model)
    base_url = model.start_in_thread()
    yield base_url
    model.stop()


def test_chat_skips_a_piped_line_that_is_not_utf8(cli_env, echo_model, tenant):
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": echo_model,
           "ARXIV_API_URL": "http://127.0.0.1:9/unused"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "chat", "--tenant", tenant, "--thread", "p"],
        env=env, input=b"hello\n\xff\xfe bad\nbye\n", capture_output=True, timeout=300,
    )  # fmt: skip
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err
    assert "Traceback" not in err
    assert "warning: skipped input line 2: not valid UTF-8" in err
    assert "You said: hello" in out and "You said: bye" in out
    assert "bad" not in out
