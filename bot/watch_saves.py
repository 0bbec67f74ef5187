"""The Save button of a digest: a durable `save` task, answered once where it was pressed.

The adapter answers the press at once (`saving_text`) and queues a `save` task on the platform's
digest stream; the task runs fetch_and_save, then its answer goes where the button was pressed
through the platform's `Poster`. A failed save is answered too (never retried: the person may
press Save again), and a re-run of the batch does not answer twice. An answer that could not be
posted fails the task, so it runs again (bot/background.py) and says the answer it worked out
the first time: a person who saw "Saving…" hears back once the platform takes it (on the
task's last delivery it is given up: the platform refuses it for good). A task dead-lettered
unrun (its last run took its process down) is answered by its hook (`given_up`: set aside for
the operator, not "press Save again", which might take a process down once more). A Save queued
before its whole tenant was erased neither saves nor answers: its worker drops it unrun
(bot/watches.py, `gone_with_tenant`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from bot.spent_tasks import last_delivery
from bot.watch_places import Poster
from memory.embeddings import background_embedding
from memory.ingest.arxiv_source import ArxivSource, check_arxiv_id
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save
from memory.save_answers import SaveAnswers
from memory.scope import Scope
from memory.stores.watches import WatchStore
from memory.tasks import TaskStream

log = logging.getLogger(__name__)

SAVE = "save"  # the task's name on a platform's stream
# A Save dead-lettered unrun (`given_up`): its last run never ended, and saving that paper may
# take a process down each time, so no "press Save again"; the operator sees the dead letter
# (`arxivscout tasks dead`) and may requeue it.
GIVEN_UP = (
    "Could not save arXiv:{arxiv_id}: saving it stopped part-way on its last try, so it was set"
    " aside; the operator can see it in the dead letters."
)


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
        self.answers = SaveAnswers(memory.redis)

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
        """Each Save answered once, whatever happened to it; an answer not posted fails the
        batch after the others are answered, so it is tried again."""
        unanswered: list[Exception] = []
        for payload in payloads:
            try:
                await self._answer(payload)
            except Exception as exc:  # the platform (or Redis) away: the task runs again
                log.warning("could not answer a Save of %s: %r", payload.get("arxiv_id"), exc)
                unanswered.append(exc)
        if unanswered:
            raise unanswered[0]

    async def _answer(self, payload: dict) -> None:
        """Save the paper and say how it went, unless an earlier run of the task has
        (memory/save_answers.py: claimed before it is posted, given back if it was not)."""
        tenant, arxiv_id = payload["tenant"], payload["arxiv_id"]
        poster = self.posters.get(payload.get("platform", ""))
        marker = answer_marker(payload)
        if poster is not None and await self.answers.answered(marker):
            return  # said by an earlier run of this task
        kept = await self.answers.kept(marker) if poster is not None else None
        text = kept
        if not text:
            try:
                text = await self.save(tenant, arxiv_id, payload.get("user", ""))
            except Exception as exc:  # Redis, the embedder: nothing half-saved is shown
                log.warning("a Save of %s failed: %r", arxiv_id, exc)
                text = f"Could not save arXiv:{arxiv_id} right now; press Save again in a minute."
        if poster is None or not await self.answers.claim(marker):
            return  # no platform here to say it, or another copy is saying it now
        try:
            await poster.answer(payload.get("reply") or {}, text)
        except Exception:
            if last_delivery():  # refused for good (an expired interaction, a removed channel)
                log.warning("a Save answer of %s could not be posted; given up", arxiv_id)
                await self.answers.drop_kept(marker)
                return
            await self.answers.give_back(marker, text)  # said as it was next time: "Saved"
            raise
        if kept:
            await self.answers.drop_kept(marker)

    async def given_up(self, payload: dict) -> None:
        """The Save's task is dead-lettered unrun (its last run never ended: it took its
        process down, say): answered all the same, once, unless a run said it. A failed post
        raises, so the hook is tried again on the next claim (bot/spent_tasks.py)."""
        poster = self.posters.get(payload.get("platform", ""))
        if poster is None:
            return
        marker = answer_marker(payload)
        kept = await self.answers.kept(marker)  # what a run worked out and could not post
        text = kept or GIVEN_UP.format(arxiv_id=payload["arxiv_id"])
        if not await self.answers.claim(marker):
            return  # said by a run of the task, or being said
        try:
            await poster.answer(payload.get("reply") or {}, text)
        except Exception:
            await self.answers.give_back(marker, text)
            raise
        if kept:
            await self.answers.drop_kept(marker)

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


def answer_marker(payload: dict) -> str:
    """What names a Save task's answer (the same for every run of the task)."""
    return hashlib.blake2b(repr(sorted(payload.items())).encode(), digest_size=12).hexdigest()
