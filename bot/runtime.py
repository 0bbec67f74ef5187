"""Wiring: Settings -> Redis (embedded or REDIS_URL) -> embedder -> MemoryManager."""

from __future__ import annotations

from bot.config import ConfigError, Settings
from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder, OpenAIEmbedder
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis


def embedded_redis(settings: Settings) -> EmbeddedRedis:
    return EmbeddedRedis(settings.data_dir)


def redis_url(settings: Settings) -> str:
    """REDIS_URL, or the embedded Redis (started on first use)."""
    return settings.redis_url or embedded_redis(settings).ensure_running()


def openai_client(settings: Settings):
    from openai import AsyncOpenAI

    if not settings.openai_api_key and not settings.openai_base_url:
        raise ConfigError(
            "OPENAI_API_KEY is not set. Set it (or OPENAI_BASE_URL for an OpenAI-compatible "
            "server such as Ollama or vLLM) in the environment or in a .env file."
        )
    return AsyncOpenAI(
        api_key=settings.openai_api_key or "not-needed",
        base_url=settings.openai_base_url,
        timeout=settings.llm_timeout_seconds,
    )


def make_embedder(settings: Settings):
    if settings.embeddings == "openai":
        return OpenAIEmbedder(openai_client(settings), settings.openai_embedding_model)
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
