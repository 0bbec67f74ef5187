"""Wiring: Settings -> Redis (embedded or REDIS_URL) -> embedder -> memory -> agent.

The one place that turns configuration into running parts; everything below gets plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from adapters.discord_files import DiscordFileEnd
from adapters.shared_files import FileEnd, SharedFiles
from adapters.slack_files import SlackFileEnd
from app.settings import Settings
from bot.agent import Agent
from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.harness import ARTIFACTS, Harness
from bot.llm import LLMClient, RetryPolicy, openai_client
from bot.tools import toolbox
from bot.turns import TurnHandler
from bot.upkeep import UNINSTALLED_CHECK_SECONDS, Upkeep
from bot.watches import WatchService
from memory.connection import connect
from memory.context import ContextLimits
from memory.embeddings import CachedEmbedder, LocalEmbedder, OpenAIEmbedder
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis
from memory.retention import SWEEP
from memory.tasks import TaskStream
from memory.tokens import encoding_for

# The first sweep scheduling after a process starts: a bot lives long, a command (`ask`, a test's
# agent) rarely lives this long and so leaves the sweeps to the bots.
FIRST_SWEEP_SECONDS = 600.0

Turns = TypeVar("Turns", bound=TurnHandler)


def embedded_redis(settings: Settings) -> EmbeddedRedis:
    return EmbeddedRedis(
        settings.data_dir, server_binary=settings.redis_server, modules=settings.redis_modules
    )


def redis_url(settings: Settings) -> str:
    """REDIS_URL (or REDISCLOUD_URL), or the embedded Redis (started on first use; refused on
    Heroku, and on Fly unless ARXIVSCOUT_DATA_DIR names a volume: `embedded_redis_allowed`)."""
    if settings.redis_url:
        return settings.redis_url
    settings.embedded_redis_allowed()
    return embedded_redis(settings).ensure_running()


def make_embedder(settings: Settings):
    if settings.embeddings == "openai":
        client = openai_client(
            settings.openai_api_key, settings.openai_base_url, settings.llm_timeout_seconds
        )
        return OpenAIEmbedder(client, settings.openai_embedding_model, settings.embedding_dims)
    return LocalEmbedder()


def llm_client(settings: Settings, retry: RetryPolicy | None = None) -> LLMClient:
    return LLMClient(
        api_key=settings.openai_api_key,
        base_url=settings.openai_base_url,
        model=settings.openai_model,
        timeout_seconds=settings.llm_timeout_seconds,
        retry=retry,
    )


def arxiv_source(settings: Settings, redis) -> ArxivSource:
    """Every arXiv client of the process waits for the slot shared in Redis (`SharedPace`):
    the agent's searches and saves, digests and `ingest` keep arXiv's pace together."""
    delay = settings.arxiv_delay_seconds
    return ArxivSource(settings.arxiv_api_url, delay, pace=SharedPace(redis, delay))


async def open_memory(settings: Settings, check_indexes: bool = True) -> MemoryManager:
    """Connect, check the server, and open (or create) every store."""
    client = await connect(redis_url(settings), max_connections=settings.redis_max_connections)
    embedder = CachedEmbedder(make_embedder(settings), client)
    memory = MemoryManager(client, embedder, model=settings.openai_model)
    memory.retention.default_days = settings.retention_days
    memory.retention.sweep_seconds = settings.retention_sweep_seconds
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
    watches: WatchService | None = None  # topic watches: adapters attach their posters
    files: SharedFiles | None = None  # PDFs shared in chat: adapters attach their platform

    @property
    def harness(self) -> Harness:
        return self.agent.harness

    def turns(self, handler: type[Turns] = TurnHandler) -> Turns:  # type: ignore[assignment]
        """The turns of this agent, taken by `handler` (a TurnHandler of the caller's)."""
        return handler(self.agent, watches=self.watches, files=self.files)

    def _parts(self) -> list[WatchService | SharedFiles | Harness]:
        """The parts with background workers, in the order they are closed."""
        return [p for p in (self.watches, self.files) if p is not None] + [self.harness]

    async def stop_reading(self) -> None:
        """Close's first half: every part's background work stops reading and hands back its
        unstarted tasks, so none waits for another part's running batches (and the platform's
        kill) before it does. A process with more workers (an adapter's) calls this with
        theirs before closing any."""
        for part in self._parts():
            await part.stop_reading()

    async def close(self) -> None:
        await self.stop_reading()
        for part in self._parts():
            await part.close()
        await self.llm.aclose()
        await self.memory.close()


async def open_agent(settings: Settings, window: int | None = None) -> AgentRuntime:
    """The agent over memory: tools indexed in the toolbox store, background work running."""
    llm = llm_client(settings)  # fails first, and clearly, without a key
    memory = await open_memory(settings)
    try:
        await memory.toolbox.register([tool.record() for tool in toolbox])
        consolidator = Consolidator(memory, llm, window=window or settings.context_window)
        background = BackgroundWork(TaskStream(memory.redis, task_stream()))
        watches = watch_service(settings, memory)
        upkeep = Upkeep(memory, consolidator, background, ContextLimits(settings.memory_tokens),
                        removing=watches.removing,
                        uninstalled_keep_days=settings.uninstalled_keep_days)  # fmt: skip
        harness = Harness(
            memory, llm, toolbox, consolidator, arxiv_source(settings, memory.redis),
            encoding_for(settings.openai_model), background, upkeep,
            window=window or settings.context_window,
        )  # fmt: skip
        background.handle({**upkeep.handlers(), ARTIFACTS: harness.write_artifacts,
                           SWEEP: memory.retention.sweep_tasks})  # fmt: skip
        background.every(  # this process's turn at queueing the retention sweeps
            settings.retention_sweep_seconds,
            lambda: memory.retention.schedule(background.submit),
            first=min(FIRST_SWEEP_SECONDS, settings.retention_sweep_seconds),
        )
        await upkeep.backfill()  # once per Redis: messages stored before episodic memory
        agent = Agent(harness, timeout_seconds=settings.turn_timeout_seconds)
        background.every(settings.watch_check_seconds, watches.check)  # due digests, claimed
        background.every(UNINSTALLED_CHECK_SECONDS, upkeep.erase_uninstalled)  # removed teams
    except BaseException:
        await memory.close()
        await llm.aclose()
        raise
    return AgentRuntime(memory, llm, agent, watches, shared_files(settings, memory))


def shared_files(settings: Settings, memory: MemoryManager) -> SharedFiles:
    """The reader of PDFs shared in chat, for the platforms whose tokens this process has; a
    platform's stream is read once its adapter attaches (never in `chat` or `ask`)."""
    ends: dict[str, FileEnd] = {}
    if settings.slack_bot_token:
        ends["slack"] = SlackFileEnd(settings.slack_bot_token, settings.slack_api_url)
    if settings.discord_token:
        ends["discord"] = DiscordFileEnd(settings.discord_token, settings.discord_api_url)
    encoding = encoding_for(settings.openai_model)
    return SharedFiles(
        memory, encoding, ends, max_bytes=int(settings.max_pdf_mb * 1_000_000),
        max_pages=settings.max_pdf_pages,
    )  # fmt: skip


def watch_service(settings: Settings, memory: MemoryManager) -> WatchService:
    return WatchService(
        memory, arxiv_source(settings, memory.redis), encoding_for(settings.openai_model)
    )
