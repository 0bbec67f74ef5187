"""Feedback on answers (👍 / 👎 and a comment), the same for every platform.

A vote is kept with the turn's record (one per person: a later vote replaces theirs). A turn
with a 👎 has its workflow rejected, so the procedure it learned is never offered again; once
no 👎 is left, the workflow is offered again. The workflow may be written after the vote (it is
background work): `Harness.write_artifacts` checks the votes after it wrote it, and this checks
the turn's workflow after it wrote the vote, so one of the two always sees the other.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from memory.errors import memory_unavailable
from memory.manager import MemoryManager
from memory.stores.turn_records import TurnRecord, UnknownTurn, Vote

log = logging.getLogger(__name__)

REASONS = {  # what a 👎 form offers to tick, by value
    "wrong": "Wrong or outdated",
    "source": "Missing source",
    "off_topic": "Not what I asked",
}
MAX_COMMENT = 2000
THANKS = "Thanks for the feedback!"
SORRY = "Thanks: noted what was wrong. I will not reuse how I answered this."
GONE = "That answer is no longer in my memory (it was forgotten), so feedback cannot be kept."
NOT_HERE = "That answer is not here, so I did not keep the feedback."
UNAVAILABLE = (
    "My memory (Redis) is unreachable right now, so I could not keep that; try again soon."
)
FAILED = "Something went wrong and I could not keep that feedback; please try again later."


class NotHere(Exception):
    """The turn was answered in another channel than the one the button was pressed in."""


@dataclass
class FeedbackService:
    memory: MemoryManager

    async def vote(
        self, tenant: str, turn_id: str, user: str, rating: int, name: str = "",
        channel: str | None = None,
    ) -> str:  # fmt: skip
        """Record `user`'s 👍 (+1) or 👎 (-1) on a turn answered in `channel` (None: anywhere);
        what to tell them (THANKS when kept). Never raises: every failure is a message."""
        try:
            record = await self._record(tenant, turn_id, channel)
            old = record.feedback.get(user)
            vote = Vote(user, 1 if rating > 0 else -1, name)
            if old is not None and old.rating == vote.rating:  # pressed again: keep the comment
                vote.comment, vote.reasons = old.comment, old.reasons
            downs = await self.memory.turn_records.vote(tenant, turn_id, vote)
            await self._follow(tenant, turn_id, downs)
        except Exception as exc:
            return self._failed(exc, "feedback", turn_id, tenant)
        return THANKS

    async def comment(
        self, tenant: str, turn_id: str, user: str, comment: str, reasons: Iterable[str] = (),
        name: str = "", channel: str | None = None,
    ) -> str:  # fmt: skip
        """A 👎's "what was wrong" (and the reasons ticked); what to tell them. Never raises."""
        reasons = [r for r in reasons if r in REASONS]
        try:
            await self._record(tenant, turn_id, channel)
            downs = await self.memory.turn_records.comment(
                tenant, turn_id, user, comment[:MAX_COMMENT], reasons, name
            )
            await self._follow(tenant, turn_id, downs)
        except Exception as exc:
            return self._failed(exc, "feedback comment", turn_id, tenant)
        return SORRY

    async def _record(self, tenant: str, turn_id: str, channel: str | None) -> TurnRecord:
        record = await self.memory.turn_records.get(tenant, turn_id)
        if channel is not None and record.channel and record.channel != channel:
            raise NotHere(turn_id)
        return record

    @staticmethod
    def _failed(exc: Exception, what: str, turn_id: str, tenant: str) -> str:
        """What to tell the person whose feedback was not kept (and the log)."""
        if isinstance(exc, UnknownTurn):
            return GONE
        if isinstance(exc, NotHere):
            log.info("%s on %s refused: pressed outside its channel", what, turn_id)
            return NOT_HERE
        if memory_unavailable(exc):
            log.warning("%s on %s not kept: memory unavailable", what, turn_id)
            return UNAVAILABLE
        log.exception("%s on %s (tenant %r) not kept", what, turn_id, tenant)
        return FAILED

    async def _follow(self, tenant: str, turn_id: str, downs: int) -> None:
        """The turn's workflow rejected while it has a 👎, offered again once it has none."""
        await self.memory.turn_records.follow(tenant, turn_id, downs, self.memory.workflows.reject)
