"""The Memory Manager: the seven stores, and the state bot processes share, over one Redis
connection and one embedder. Code above `memory/` reaches Redis only through it."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from redis.exceptions import RedisError

from memory.browse import Browse
from memory.coordination import EventLog, ThreadPresence, TurnQueue, Upgrades
from memory.embeddings import Embedder
from memory.governance import Governance
from memory.keys import forgetting_key, import_partial_key, import_running_key, tenant_key
from memory.migrate import migrate_to_hash_tags, tidy_shown_in_logs
from memory.portability import Portability
from memory.retention import Retention
from memory.sharing import SharingChanges
from memory.stores.base import VectorStore, decode, delete_keys
from memory.stores.conversation import ConversationStore
from memory.stores.entity import EntityStore
from memory.stores.episodic import EpisodicStore
from memory.stores.knowledge_base import KnowledgeBase
from memory.stores.summary import SummaryStore
from memory.stores.tool_log import ToolLogStore
from memory.stores.toolbox import ToolboxStore
from memory.stores.turn_records import TurnRecords
from memory.stores.watches import WatchStore
from memory.stores.workflow import WorkflowStore

DROP_BATCH = 500  # keys deleted per round trip when a tenant is dropped


class MemoryManager:
    """Owns the stores; `open()` moves keys of an older layout, then creates or checks the
    stores' indexes."""

    def __init__(self, redis: Redis, embedder: Embedder, model: str = "gpt-5-mini") -> None:
        self.redis = redis
        self.embedder = embedder
        self.model = model
        self.conversation = ConversationStore(redis)
        self.knowledge_base = KnowledgeBase(redis, embedder)
        self.workflows = WorkflowStore(redis, embedder)
        self.toolbox = ToolboxStore(redis, embedder)
        self.entities = EntityStore(redis, embedder)
        self.episodes = EpisodicStore(redis, embedder)
        self.summaries = SummaryStore(redis)
        self.tool_logs = ToolLogStore(redis)
        self.turn_records = TurnRecords(redis)  # each answered turn, its usage and feedback
        self.events = EventLog(redis)
        self.turns = TurnQueue(redis)
        self.presence = ThreadPresence(redis)
        self.sharing = SharingChanges(redis)  # Slack channels' sharing changes, for every process
        self.upgrades = Upgrades(redis)
        self.portability = Portability(self)  # export and import as JSON Lines
        self.retention = Retention(self)  # its default and sweep interval: app/runtime.py
        self.governance = Governance(self)  # forget, erase a person, retention, edits
        self.browse = Browse(self)  # the memory page's reads
        self.tidying: asyncio.Task[int] | None = None  # `open`'s background upgrade step

    @property
    def vector_stores(self) -> list[VectorStore]:
        return [self.knowledge_base, self.workflows, self.toolbox, self.entities, self.episodes]

    async def open(self) -> MemoryManager:
        """The move of keys is awaited (nothing may read before the keys are where it looks);
        the tidying of the shown-in-logs sets runs in the background (`tidying`): it SCANs the
        whole keyspace, which no start-up, a short CLI command's least, should wait for."""
        await migrate_to_hash_tags(self.redis, self.upgrades)  # keys from before hash tags
        await asyncio.gather(*(store.open() for store in self.vector_stores))
        self.tidying = asyncio.create_task(  # once the stores opened: no task left if they fail
            tidy_shown_in_logs(self.redis, self.upgrades, self.tool_logs),  # once, then done
            name="tidy-shown-in-logs",
        )
        return self

    async def reindex(self) -> dict[str, int]:
        """Re-embed every vector store with the configured embedder."""
        return {store.family(): await store.reindex() for store in self.vector_stores}

    async def drop_tenant(self, tenant: str) -> None:
        """Erase everything a tenant's memory holds (temporary tenants of evaluations, what a
        failed import wrote), its watches off the due index every tenant shares too. Not its
        erasure lock: the erasure that holds it (memory/governance_tenants.py) keeps it to the
        end, and releases it; a lock nobody renews lapses on its own. Nor an import's running
        key (`import_running_key`): an import that clears a tenant keeps refusing the bot's
        messages while it does, and releases that key at its end. The marker of an import
        (`import_partial_key`) goes last: a drop that fails midway leaves it, so the next import
        clears what is left (the vector stores' documents) rather than refusing the tenant as
        one that holds memory.

        The tenant's own keys go before its vector stores' documents (under their own
        prefixes): a background task (indexing messages, learning from a turn) checks after
        writing documents that what it learned from is still stored, and takes them out if not.
        Its write lands either before the stores are dropped (the drop takes it) or after,
        when the messages and learned records are gone already (its check takes it out)."""
        await WatchStore(self.redis).unschedule_all(tenant)
        spared = {forgetting_key(tenant), import_partial_key(tenant), import_running_key(tenant)}
        batch: list = []
        async for key in self.redis.scan_iter(match=tenant_key(tenant, "*"), count=1000):
            if decode(key) not in spared:
                batch.append(key)
            if len(batch) >= DROP_BATCH:
                await delete_keys(self.redis, batch)
                batch = []
        await delete_keys(self.redis, batch)
        for store in self.vector_stores:
            if store.TENANT_SCOPED:
                await store.drop_tenant(tenant)
        await self.redis.delete(import_partial_key(tenant))

    async def ping(self, timeout: float = 5.0) -> bool:
        """True when Redis answers in time (health checks). Only a yes or no: the error's text
        (hosts, auth failures) is not for whoever asks `/healthz`."""
        try:
            async with asyncio.timeout(timeout):
                return bool(await self.redis.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        """The tidying still running is cancelled (it releases its claim, and the next start
        runs it again) and awaited before the connection it uses closes."""
        await self.governance.settle()  # forgotten messages' episodic documents, deleted
        if self.tidying is not None:
            self.tidying.cancel()  # a no-op once it is done
            await asyncio.gather(self.tidying, return_exceptions=True)  # its CancelledError
        close = getattr(self.embedder, "aclose", None)
        if close is not None:
            await close()
        await self.redis.aclose()
