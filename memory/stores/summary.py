"""Summary memory: durable notes that replace older messages of a thread, expandable again."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from memory.scope import Scope
from memory.stores.base import Segment, decode
from memory.stores.records import ThreadRecordStore, UnknownRecord


class UnknownSummary(UnknownRecord):
    what = "summary"


@dataclass
class Summary:
    thread_id: str
    description: str
    text: str
    message_ids: list[str]
    id: str = field(default_factory=lambda: f"sum_{uuid.uuid4().hex[:10]}")
    created_at: float = field(default_factory=time.time)
    audience: str = ""


class SummaryStore(ThreadRecordStore[Summary]):
    KIND, PLURAL = "summary", "summaries"
    RECORD = Summary
    JSON_FIELDS = ("message_ids",)
    MISSING = UnknownSummary

    async def descriptions(self, scope: Scope) -> list[tuple[str, str]]:
        """(id, description) of a thread's summaries, oldest first, in one command: SORT over
        the thread's index (in its own order) fetching each summary hash's description."""
        rows = await self.redis.sort(
            self.thread_index(scope),
            by="nosort",
            get=["#", f"{self.key(scope.tenant, '*')}->description"],
        )
        return [(decode(rows[i]), decode(rows[i + 1]) or "") for i in range(0, len(rows), 2)]

    @staticmethod
    def segment(entries: list[tuple[str, str]]) -> Segment:
        return Segment(
            name="Summary",
            description="compressed older parts of this thread; each line is a summary id and what it covers.",
            usage="when a detail you need is only here, call expand_summary(summary_id) to get the summary and its original messages.",
            items=[f"[Summary ID: {sid}] {description}" for sid, description in entries],
            empty_note="(no summaries in this thread)",
        )
