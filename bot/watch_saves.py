"""The Save button of a digest: a durable `save` task, answered once where it was pressed.

The adapter answers the press at once (`saving_text`) and queues a `save` task on the platform's
digest stream; the task runs fetch_and_save, then its answer goes where the button was pressed
through the platform's `Poster`. A task is never failed: a person who saw "Saving…" always hears
back, and a re-run of the batch does not answer twice.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from bot.watch_places import Poster
from memory.embeddings import background_embedding
from memory.ingest.arxiv_source import ArxivSource, check_arxiv_id
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save
from memory.scope import Scope
from memory.stores.watches import WatchStore
from memory.tasks import TaskStream

log = logging.getLogger(__name__)

SAVE = "save"  # the task's name on a platform's stream


class SaveTasks:
    """The Save tasks of one process: queued by its adapters, answered through their posters."""

    def __init__(
        self, memory, store: WatchStore, arxiv: ArxivSource, encoding,
        posters: dict[str, Poster], stream: Callable[[str], TaskStream],
    ) -> None:  # fmt: skip
        self.memory = memory
        self.store = store
        self.arxiv = arxiv
        self.encoding = encoding
        self.posters = posters  # shared with the service: `attach` adds to it
        self.stream = stream

    async def queue(
        self, platform: str, tenant: str, arxiv_id: str, user: str, reply: dict[str, Any]
    ) -> None:
        """Queue a pressed Save (the adapter has said `saving_text`); its answer goes to
        `reply` through the platform's poster. IngestError for a malformed id."""
        arxiv_id = check_arxiv_id(arxiv_id)
        payload = {"tenant": tenant, "arxiv_id": arxiv_id, "user": user, "reply": reply,
                   "platform": platform}  # fmt: skip
        await self.stream(platform).add(SAVE, payload)

    async def run(self, payloads: list[dict]) -> None:
        """Each Save answered once, whatever happened to it (a task is never failed: a person
        who saw "Saving…" always hears back)."""
        for payload in payloads:
            tenant, arxiv_id = payload["tenant"], payload["arxiv_id"]
            try:
                text = await self.save(tenant, arxiv_id, payload.get("user", ""))
            except Exception as exc:  # Redis, the embedder: nothing half-saved is shown
                log.warning("a Save of %s failed: %r", arxiv_id, exc)
                text = f"Could not save arXiv:{arxiv_id} right now; press Save again in a minute."
            poster = self.posters.get(payload.get("platform", ""))
            if poster is None:
                continue
            try:
                marker = hashlib.blake2b(repr(sorted(payload.items())).encode(),
                                         digest_size=12).hexdigest()  # fmt: skip
                if await self.store.once(marker):
                    await poster.answer(payload.get("reply") or {}, text)
            except Exception:  # the paper is saved; a lost answer is not worth a retry
                log.warning("could not answer a Save of %s", arxiv_id, exc_info=True)

    async def save(self, tenant: str, arxiv_id: str, user: str = "") -> str:
        """The paper fetched and saved to the tenant's knowledge base; the answer to show."""
        scope = Scope(tenant, user=user)
        try:
            with background_embedding():
                paper, chunks, already = await fetch_and_save(
                    arxiv_id, scope, self.memory.knowledge_base, self.memory.embedder,
                    self.encoding, self.arxiv,
                )  # fmt: skip
        except IngestError as exc:
            return f"Could not save arXiv:{arxiv_id}: {exc}"
        if already:
            return f"“{paper.title}” was already in the team knowledge base ({chunks} passages)."
        return f"Saved “{paper.title}” to the team knowledge base ({chunks} passages)."
