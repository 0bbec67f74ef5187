"""Entity memory: the people, organisations, systems and papers a team's threads mention.

One record per (tenant, audience, name): what a DM or a private channel taught stays there (see
memory/scope.py). A new mention of a known name merges its description in.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory.keys import ENTITY_INDEX, ENTITY_PREFIX
from memory.scope import PUBLIC, Scope
from memory.stores.base import Segment, VectorStore, decode

MAX_DESCRIPTION = 1000


@dataclass
class Entity:
    name: str
    type: str
    description: str

    def line(self) -> str:
        return f"{self.name} ({self.type}): {self.description}"


def _slug(name: str) -> str:
    return re.sub(r"\s+", " ", name.strip().lower())


def merge_descriptions(old: str, new: str) -> str:
    """Keep what was known and add what is new, without repeating a sentence."""
    if not old:
        return new[:MAX_DESCRIPTION]
    if not new or new.lower() in old.lower():
        return old
    return f"{old} {new}"[-MAX_DESCRIPTION:]


class EntityStore(VectorStore):
    SCHEMA = {
        "index": {"name": ENTITY_INDEX, "prefix": ENTITY_PREFIX},
        "fields": [
            {"name": "name", "type": "text"},
            {"name": "type", "type": "tag"},
            {"name": "description", "type": "text"},
            {"name": "updated_at", "type": "numeric", "attrs": {"sortable": True}},
            {"name": "audience", "type": "tag"},
        ],
    }
    DEFAULTS = {"audience": PUBLIC}  # entities from before scopes were learned team-wide
    FIELDS = ["name", "type", "description"]

    def embedding_text(self, record: dict[str, Any]) -> str:
        return Entity(
            record.get("name", ""), record.get("type", ""), record.get("description", "")
        ).line()

    def key(self, scope: Scope, name: str) -> str:
        place = "" if scope.audience == PUBLIC else f"{scope.audience}|"
        return f"{self.key_prefix(scope.tenant)}{place}{_slug(name)}"

    async def get(self, scope: Scope, name: str) -> Entity | None:
        """The entity of that name learned in `scope`'s own place (public, or this channel)."""
        row = await self.redis.hmget(self.key(scope, name), self.FIELDS)
        if row[0] is None:
            return None
        return Entity(*(decode(v) or "" for v in row))

    async def upsert(self, scope: Scope, entities: list[Entity]) -> list[Entity]:
        """Write entities, merging each with the stored one of the same name."""
        merged: dict[str, Entity] = {}
        for entity in entities:
            name = entity.name.strip()
            if not name:
                continue
            slug = _slug(name)
            known = merged.get(slug) or await self.get(scope, name)
            if known:
                entity = Entity(
                    known.name,
                    known.type or entity.type,
                    merge_descriptions(known.description, entity.description.strip()),
                )
            merged[slug] = Entity(
                entity.name.strip(),
                entity.type.strip().lower() or "other",
                entity.description.strip(),
            )
        if not merged:
            return []
        items = list(merged.values())
        vectors = await self.embedder.embed([e.line() for e in items])
        now = time.time()
        await self._write(
            scope.tenant,
            [
                (
                    self.key(scope, e.name),
                    {
                        "tenant": scope.tenant,
                        "name": e.name,
                        "type": e.type,
                        "description": e.description,
                        "updated_at": now,
                        "audience": scope.audience,
                    },
                    v,
                )
                for e, v in zip(items, vectors, strict=True)
            ],
        )
        return items

    async def similar(self, scope: Scope, vector: np.ndarray, k: int = 5) -> list[Entity]:
        """The entities nearest the question among those `scope` may see."""
        rows = await self._nearest(
            scope.tenant, vector, k, self.FIELDS, self.audience_filter(scope)
        )
        return [Entity(*(decode(r.get(f, "")) for f in self.FIELDS)) for r in rows]

    async def all(self, scope: Scope, limit: int = 200, everywhere: bool = False) -> list[Entity]:
        """Those `scope` may see; `everywhere`: the whole tenant's (for its operator)."""
        where = None if everywhere else self.audience_filter(scope)
        rows = await self._list(scope.tenant, self.FIELDS, limit, where, sort_by="updated_at")
        return [Entity(*(decode(r.get(f, "")) for f in self.FIELDS)) for r in rows]

    @staticmethod
    def segment(entities: list[Entity]) -> Segment:
        return Segment(
            name="Entity",
            description="people, organisations, systems and papers that came up in this team's threads.",
            usage="use them to tell apart names and references; they are background, not sources to cite.",
            items=[e.line() for e in entities],
            empty_note="(no related entities)",
        )
