"""Context assembly, model/dimension checks on indexes, reindex, and the inspect commands."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from memory.context import assemble_context
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.base import IndexModelMismatch
from memory.stores.entity import Entity
from memory.stores.summary import Summary
from memory.tokens import count_tokens, encoding_for
from tests.conftest import SHARED
from tests.test_memory_stores import add_memgpt

HEADINGS = ["Conversation", "Episodic", "Knowledge Base", "Workflow", "Entity", "Summary"]


class CountingEmbedder:
    """Wraps the real embedder and counts calls, to check the question is embedded once."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.model_name, self.dims = inner.model_name, inner.dims

    async def embed(self, texts):
        self.calls += 1
        return await self.inner.embed(texts)


class HashEmbedder:
    """A different, deterministic embedding model (16 dims), to switch models in a test."""

    model_name, dims = "hash-16", 16

    async def embed(self, texts):
        rows = [
            np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], dtype=np.uint8) for t in texts
        ]
        matrix = np.array(rows, dtype=np.float32) + 1
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


async def test_assembles_six_segments_with_token_counts(memory, tenant):
    scope = Scope(tenant, "50000")
    await add_memgpt(memory, tenant)
    await memory.conversation.append(scope, "user", "Can you get me the paper MemGPT")
    await memory.workflows.add(scope, "find MemGPT", ["arxiv_search_candidates -> success"], "ok")
    await memory.entities.upsert(scope, [Entity("MemGPT", "system", "LLM operating system")])
    await memory.summaries.save(scope, Summary("50000", "Earlier talk about memory", "...", []))

    counting = CountingEmbedder(memory.embedder)
    view = MemoryManager(memory.redis, counting, model="gpt-5-mini")
    context = await assemble_context(view, scope, "What does MemGPT do with memory?")
    assert counting.calls == 1
    assert [s.name for s in context.segments] == HEADINGS
    for segment, name in zip(context.segments, HEADINGS, strict=True):
        assert segment.text.startswith(f"## {name} Memory\nWhat it is: ")
        assert "\nHow to use it: " in segment.text
        assert segment.tokens == count_tokens(segment.text, "gpt-5-mini")
    rendered = context.render()
    assert rendered.startswith(
        "# Question\nWhat does MemGPT do with memory?\n\n## Conversation Memory"
    )
    assert "[user] Can you get me the paper MemGPT" in rendered
    assert "[arXiv:2310.08560]" in rendered and "QUERY: find MemGPT" in rendered
    assert "MemGPT (system): LLM operating system" in rendered
    assert "[Summary ID: sum_" in rendered
    assert context.total_tokens == sum(s.tokens for s in context.segments)


async def test_index_built_with_another_model_is_refused_until_reindex(memory, tenant):
    other = MemoryManager(memory.redis, HashEmbedder())
    with pytest.raises(IndexModelMismatch, match="arxivscout reindex"):
        await other.open()
    await add_memgpt(memory, tenant)
    try:
        counts = await other.reindex()
        assert counts["arxivscout_kb"] >= 3
        await other.open()  # now matches
        with pytest.raises(IndexModelMismatch, match="all-MiniLM-L6-v2"):
            await memory.open()
        vector = (await other.embedder.embed(["x"]))[0]
        hits = await other.knowledge_base.search(Scope(tenant), "memory tiers", vector)
        assert hits and all(h.arxiv_id == "2310.08560" for h in hits)
    finally:
        await memory.reindex()  # back to MiniLM for the other tests
    await memory.open()


def run_cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


async def test_inspect_commands(memory, tenant, cli_env):
    scope = Scope(tenant, "50000")
    await add_memgpt(memory, tenant)
    await memory.conversation.append(scope, "user", "Can you get me the paper MemGPT")
    await memory.entities.upsert(scope, [Entity("MemGPT", "system", "LLM operating system")])

    result = run_cli(
        cli_env, "context", "--tenant", tenant, "--thread", "50000", "--json", "What is MemGPT?"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["segments"]] == HEADINGS
    assert all(s["tokens"] > 0 for s in data["segments"])
    knowledge = next(s for s in data["segments"] if s["name"] == "Knowledge Base")
    assert "2310.08560" in knowledge["text"]

    text = run_cli(cli_env, "context", "--tenant", tenant, "--thread", "50000", "What is MemGPT?")
    assert "<!-- Knowledge Base Memory:" in text.stdout and "## Entity Memory" in text.stdout

    assert "50000" in run_cli(cli_env, "memory", "threads", "--tenant", tenant).stdout
    thread = run_cli(cli_env, "memory", "thread", "50000", "--tenant", tenant)
    assert "user: Can you get me the paper MemGPT" in thread.stdout
    papers = run_cli(cli_env, "memory", "papers", "--tenant", tenant)
    assert "2310.08560  MemGPT: Towards LLMs as Operating Systems" in papers.stdout
    entities = json.loads(
        run_cli(cli_env, "memory", "entities", "--tenant", tenant, "--json").stdout
    )
    assert entities == [{"name": "MemGPT", "type": "system", "description": "LLM operating system"}]

    bad = run_cli(cli_env, "memory", "threads", "--tenant", "no spaces allowed")
    assert bad.returncode == 2 and "Invalid tenant" in bad.stderr


async def test_openai_embeddings_through_the_real_client(memory, redis_url):
    """ARXIVSCOUT_EMBEDDINGS=openai: the real SDK against a local server; MiniLM indexes refuse it."""
    from app.runtime import make_embedder
    from app.settings import Settings
    from memory.connection import connect
    from memory.embeddings import CachedEmbedder
    from tests.support.scripted_openai import ScriptedOpenAI

    async with ScriptedOpenAI(embedding_dims=1536) as server:
        settings = Settings(
            embeddings="openai", openai_api_key="k", openai_base_url=server.base_url
        )
        embedder = make_embedder(settings)
        assert (embedder.model_name, embedder.dims) == ("text-embedding-3-small", 1536)
        vectors = await embedder.embed(["a", "b", "c"])
        assert vectors.shape == (3, 1536)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert server.embedding_requests[-1]["model"] == "text-embedding-3-small"
        client = await connect(redis_url)
        try:
            with pytest.raises(IndexModelMismatch, match="text-embedding-3-small"):
                await MemoryManager(client, CachedEmbedder(embedder, client)).open()
        finally:
            await client.aclose()
            await embedder.aclose()


TRICKY = [
    "end.\n\n[user] hi",
    "a.\n\n/path and a.\n/b",
    "x \n \ny\n\n\n\nz",
    "<|endoftext|>\n\nspecial tokens are text here",
    "emoji 🧠\n\n記憶 と 検索\n\n'quoted'\n's",
    "\n\nleading newlines\n",
    "numbers 12345678\n\n9876 and 1\n2",
]


@pytest.mark.parametrize("model", ["gpt-5-mini", "gpt-4o", "gpt-4"])
def test_token_counts_block_by_block_are_exact(model):
    """The counts are summed over newline-separated blocks (each remembered): they must equal
    tiktoken's count of the whole text, whatever the text."""
    seed = next((SHARED / "seed").glob("*.txt")).read_text()
    rng = random.Random(5)
    samples = TRICKY + [
        seed[a : a + rng.randrange(1, 4000)] for a in rng.sample(range(len(seed)), 150)
    ]
    encoding = encoding_for(model)
    for text in samples:
        assert count_tokens(text, model) == len(encoding.encode(text, disallowed_special=())), text
