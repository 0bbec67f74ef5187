"""Entity memory: the people, organisations, systems and papers a team's threads mention.

One record per (tenant, audience, name): what a DM or a private channel taught stays there (see
memory/scope.py). A new mention of a known name merges its description in, and its provenance:
`threads` (where it was learned) and `authors` (whose turns taught it), comma-separated tag
fields, so erasing a person finds what came from them. Records from before have neither.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
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


def joined(stored: Any, new: Iterable[str]) -> str:
    """A provenance tag field: the stored ids (comma-separated) and the new ones, once each."""
    ids = [i.strip() for i in (decode(stored) or "").split(",")]
    ids += [i.replace(",", " ").strip() for i in new]
    return ",".join(dict.fromkeys(i for i in ids if i))


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
            {"name": "threads", "type": "tag"},
            {"name": "authors", "type": "tag"},
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
        return await self._read(self.key(scope, name))

    async def by_id(self, tenant: str, entity_id: str) -> Entity | None:
        """The entity stored under this id, wherever it was learned (for governance)."""
        return await self._read(self.key_of(tenant, entity_id)) if entity_id else None

    async def _read(self, key: str) -> Entity | None:
        row = await self.redis.hmget(key, self.FIELDS)
        if row[0] is None:
            return None
        return Entity(*(decode(v) or "" for v in row))

    async def upsert(
        self, scope: Scope, entities: list[Entity], authors: Iterable[str] | None = None
    ) -> list[Entity]:
        """Write entities, merging each with the stored one of the same name; `scope.thread`
        and `authors` (default: `scope.user`) join its provenance."""
        authors = [scope.user] if authors is None else list(authors)
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
        pipe = self.redis.pipeline(transaction=False)
        for e in items:
            pipe.hmget(self.key(scope, e.name), ["threads", "authors"])
        known = await pipe.execute()
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
                        "threads": joined(threads, [scope.thread]),
                        "authors": joined(old_authors, authors),
                    },
                    v,
                )
                for e, v, (threads, old_authors) in zip(items, vectors, known, strict=True)
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

    async def describe(self, tenant: str, entity_id: str, description: str) -> tuple[str, str]:
        """Replace an entity's description and re-embed it; (old line, new line). KeyError
        when there is no such entity."""
        old = await self.by_id(tenant, entity_id)
        if old is None:
            raise KeyError(entity_id)
        new = Entity(old.name, old.type, description.strip()[:MAX_DESCRIPTION])
        vector = (await self.embedder.embed([new.line()]))[0]
        fields = {"description": new.description, "updated_at": time.time()}
        await self._write(tenant, [(self.key_of(tenant, entity_id), fields, vector)])
        return old.line(), new.line()

    @staticmethod
    def segment(entities: list[Entity]) -> Segment:
        return Segment(
            name="Entity",
            description="people, organisations, systems and papers that came up in this team's threads.",
            usage="use them to tell apart names and references; they are background, not sources to cite.",
            items=[e.line() for e in entities],
            empty_note="(no related entities)",
        )
