"""Wiring: Settings -> Redis (embedded or REDIS_URL) -> embedder -> MemoryManager."""

from __future__ import annotations

from dataclasses import dataclass

from bot.agent import Agent
from bot.config import Settings
from bot.consolidation import Consolidator
from bot.harness import Harness
from bot.llm import LLMClient, openai_client
from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder, OpenAIEmbedder
from memory.ingest.arxiv_source import ArxivSource
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis
from memory.tokens import encoding_for


def embedded_redis(settings: Settings) -> EmbeddedRedis:
    return EmbeddedRedis(settings.data_dir)


def redis_url(settings: Settings) -> str:
    """REDIS_URL, or the embedded Redis (started on first use)."""
    return settings.redis_url or embedded_redis(settings).ensure_running()


def make_embedder(settings: Settings):
    if settings.embeddings == "openai":
        client = openai_client(
            settings.openai_api_key, settings.openai_base_url, settings.llm_timeout_seconds
        )
        return OpenAIEmbedder(client, settings.openai_embedding_model)
    return LocalEmbedder()


async def open_memory(settings: Settings, check_indexes: bool = True) -> MemoryManager:
    """Connect, check the server, and open (or create) every store."""
    client = await connect(redis_url(settings))
    embedder = CachedEmbedder(make_embedder(settings), client)
    memory = MemoryManager(client, embedder, model=settings.openai_model)
    if check_indexes:
        try:
            await memory.open()
        except BaseException:
            await client.aclose()
            raise
    return memory


@dataclass
class AgentRuntime:
    """Everything one running bot process holds: memory, model client, agent."""

    memory: MemoryManager
    llm: LLMClient
    agent: Agent

    @property
    def harness(self) -> Harness:
        return self.agent.harness

    async def close(self) -> None:
        await self.harness.close()
        await self.llm.aclose()
        await self.memory.close()


async def open_agent(settings: Settings, window: int | None = None) -> AgentRuntime:
    """The agent over memory: tools indexed in the toolbox store, ready for turns."""
    llm = LLMClient.from_settings(settings)  # fails first, and clearly, without a key
    memory = await open_memory(settings)
    try:
        from bot.tools import ToolDeps, toolbox

        await memory.toolbox.register([tool.record() for tool in toolbox])
        consolidator = Consolidator(memory, llm)
        deps = ToolDeps(
            memory,
            ArxivSource.from_settings(settings),
            consolidator,
            encoding_for(settings.openai_model),
        )
        harness = Harness(memory, llm, toolbox, consolidator, {"deps": deps}, window=window)
        agent = Agent(harness, timeout_seconds=settings.turn_timeout_seconds)
    except BaseException:
        await memory.close()
        await llm.aclose()
        raise
    return AgentRuntime(memory, llm, agent)
