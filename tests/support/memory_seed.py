"""What the memory page's tests seed a tenant with: a paper with its passages, and messages
stored and indexed as the bot stores them (tests/test_memory_page.py, test_memory_browser.py)."""

from __future__ import annotations

from memory.scope import Scope
from memory.stores.conversation import Message
from memory.stores.episodic import Episode
from memory.stores.knowledge_base import Chunk, Paper

PAPER = Paper(
    arxiv_id="2310.08560",
    title="MemGPT: Towards LLMs as Operating Systems",
    authors=["Charles Packer", "Sarah Wooders"],
    published="2023-10-12",
    categories=["cs.AI"],
    abstract="An operating system for language model memory.",
)
PASSAGES = [
    "MemGPT manages a hierarchy of memory tiers, paging context in and out like an operating system.",
    "Virtual context management lets a fixed-window model appear to have unbounded memory.",
    "We evaluate on document analysis and multi-session chat with the zanzibarite benchmark.",
]


async def say(
    memory, scope: Scope, role: str, text: str, ts: float, searchable: bool = True
) -> Message:
    """A message stored as the bot stores it, and indexed for search as its upkeep does after
    the turn (bot/upkeep.py), here at once."""
    message = await memory.conversation.append(scope, role, text, timestamp=ts)
    if searchable:
        episode = Episode(
            message.id, scope.thread, scope.channel, audience=message.audience,
            author=message.author, author_name=message.author_name, role=role, text=text,
            ts=ts, seq=message.seq,
        )  # fmt: skip
        await memory.episodes.add(scope, [episode])
    return message


async def add_paper(memory, tenant: str) -> None:
    """PAPER in the tenant's knowledge base, its PASSAGES in one "Introduction" section."""
    vectors = await memory.embedder.embed(PASSAGES)
    chunks = [Chunk(text, "Introduction", i) for i, text in enumerate(PASSAGES)]
    await memory.knowledge_base.add_paper(Scope(tenant), PAPER, chunks, vectors)
