"""Entity memory: the people, organisations, systems and papers a team's threads mention.

One record per (tenant, audience, name): what a DM or a private channel taught stays there (see
memory/scope.py). A new mention of a known name merges its description in, and its provenance:
`threads` (where it was learned) and `authors` (whose turns taught it), comma-separated tag
fields, so erasing a person finds what came from them. Records from before have neither.
Each also keeps which question taught which piece of its description, and who taught it where
(memory/stores/entity_pieces.py), so forgetting a question takes out only what it taught, and
the tags only it brought. Its lines are
embedded uncached (`line_embedder`, the cache's inner embedder): each edit of a description
makes a new line, and none of them may outlive the entity in the embedding cache.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory.keys import ENTITY_INDEX, ENTITY_PREFIX
from memory.scope import PUBLIC, Scope
from memory.stores.base import Segment, VectorStore, decode, vector_bytes
from memory.stores.entity_pieces import (
    COMPARED,
    ENTITY_CAS,
    MAX_DESCRIPTION,
    PIECES,
    PROVENANCE,
    TAGS,
    UNOWNED,
    Piece,
    Snapshot,
    among,
    bounded,
    described,
    merge_descriptions,
    pieces_json,
    provenance_json,
    still_tagged,
    taught_with,
)

__all__ = [
    "MAX_DESCRIPTION", "Entity", "EntityChanging", "EntityStore", "joined", "merge_descriptions",
]  # fmt: skip
log = logging.getLogger(__name__)
RETRIES = 20  # compare-and-set rounds against a concurrent merge or removal of the same entity
READ = ["name", "type", "description", "audience", *COMPARED]
# A compare-and-set round's plan: per key read, the fields to write (None: delete the entity)
# and what to return once written; a key left out needs nothing.
Plan = Callable[[dict[str, Snapshot]], Awaitable[dict[str, tuple[dict[str, Any] | None, Any]]]]


class EntityChanging(RuntimeError):
    """An entity kept changing under a write (a merge or a removal crossing it every round):
    nothing was written. Its own type, so an edit's page can keep the text typed and say why;
    a RuntimeError still, as callers that retry or log any RuntimeError expect."""


@dataclass
class Entity:
    name: str
    type: str
    description: str

    def line(self) -> str:
        return f"{self.name} ({self.type}): {self.description}"


def _slug(name: str) -> str:
    """A name's part of its key. A private place's keys are "<audience>|<slug>": no slug holds
    a '|', so no name learned in one place (a public one's "private:98765|Project X") forges
    another place's key."""
    return re.sub(r"\s+", " ", name.replace("|", " ").strip().lower())


def joined(stored: Any, new: Iterable[str]) -> str:
    """A provenance tag field: the stored ids (comma-separated) and the new ones, once each."""
    ids = [i.strip() for i in (decode(stored) or "").split(",")]
    ids += [i.replace(",", " ").strip() for i in new]
    return ",".join(dict.fromkeys(i for i in ids if i))


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

    def __init__(self, redis: Any, embedder: Any) -> None:
        super().__init__(redis, embedder)
        self.line_embedder = getattr(embedder, "inner", embedder)  # nothing of them cached
        self._cas = redis.register_script(ENTITY_CAS)

    @property
    def record_embedder(self) -> Any:
        """`reindex` embeds entity lines uncached too."""
        return self.line_embedder

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

    async def owners(self, key: str) -> list[str] | None:
        """The owners of the entity's pieces (UNOWNED: a person's edit, or a legacy record);
        None when there is no such entity."""
        snap = (await self._snapshots([key]))[0]
        return [owner for owner, _ in snap.pieces] if snap.exists else None

    async def _read(self, key: str) -> Entity | None:
        row = await self.redis.hmget(key, self.FIELDS)
        if row[0] is None:
            return None
        return Entity(*(decode(v) or "" for v in row))

    async def upsert(
        self,
        scope: Scope,
        entities: list[Entity],
        authors: Iterable[str] | None = None,
        question: str = UNOWNED,
    ) -> list[Entity]:
        """Write entities, merging each with the stored one of the same name; `scope.thread`
        and `authors` (default: `scope.user`) join its provenance, and each description joins
        its pieces as taught by `question` (the stored question's id). The written ones; an
        entity stored for another audience than `scope`'s is left alone (a backstop: no name
        reaches another place's key, `_slug`), never widened to this place's audience."""
        authors = [scope.user] if authors is None else list(authors)
        taught: dict[str, tuple[Entity, list[Piece]]] = {}  # key -> (first mention, pieces)
        for entity in entities:
            name = entity.name.strip()
            if not name:
                continue
            key = self.key(scope, name)
            first, pieces = taught.get(key, (entity, []))
            taught[key] = (first, [*pieces, (question, entity.description.strip())])

        async def plan(snapshots: dict[str, Snapshot]) -> dict[str, tuple[dict[str, Any], Entity]]:
            now, updates = time.time(), {}
            for key, snap in snapshots.items():
                if snap.exists and (snap.fields.get("audience") or PUBLIC) != scope.audience:
                    log.warning("entity %s is another place's: not written from %s", key,
                                scope.audience)  # fmt: skip
                    continue  # another place's entity: its audience is never widened
                new, pieces = taught[key]
                # a retried task replaces its own version's pieces (worded anew), never adds twice
                old = [p for p in snap.pieces if question == UNOWNED or p[0] != question]
                kept = bounded(old + [p for p in dict.fromkeys(pieces) if p not in old])
                entity = Entity(
                    snap.fields.get("name") or new.name.strip(),
                    snap.fields.get("type") or new.type.strip().lower() or "other",
                    described(kept),
                )
                sources = taught_with(snap.provenance, question, authors, scope.thread)
                updates[key] = ({
                    "tenant": scope.tenant, "name": entity.name, "type": entity.type,
                    "description": entity.description, "updated_at": now,
                    "audience": scope.audience, PIECES: pieces_json(kept),
                    PROVENANCE: provenance_json(among(sources, kept)),
                    "threads": joined(snap.fields.get("threads"), [scope.thread]),
                    "authors": joined(snap.fields.get("authors"), authors),
                }, entity)  # fmt: skip
            vectors = await self.line_embedder.embed([e.line() for _, e in updates.values()])
            await self._index(scope.tenant)
            for (fields, _), vector in zip(updates.values(), vectors, strict=True):
                fields[self.VECTOR_FIELD] = vector
            return updates

        failed = "An entity kept changing while it was written; try again."
        written = await self._compare_and_set(list(taught), plan, failed)
        return [written[k] for k in taught if k in written]

    async def unlearn(
        self, tenant: str, key: str, owned: Callable[[str], bool]
    ) -> tuple[str, str | None] | None:
        """Take the pieces whose owner is `owned` (memory/stores/entity_pieces.py `taught_by`)
        out of the entity at `key`: its description is rebuilt from the rest and embedded
        again, and its authors and threads tags lose what only those pieces brought
        (`still_tagged`); or the entity goes when none is left. Returns (old line, new line,
        None when it went), or None when it taught it nothing (or it is gone)."""

        async def plan(snapshots: dict[str, Snapshot]) -> dict[str, tuple[Any, Any]]:
            snap = snapshots[key]
            old = snap.pieces
            kept = [p for p in old if not owned(p[0])]
            if not snap.exists or len(kept) == len(old):
                return {}
            was = self._entity(snap)
            if not kept:  # nothing left that another question (or no question) taught
                return {key: (None, (was.line(), None))}
            entity = Entity(was.name, was.type, described(kept))
            vector = (await self.line_embedder.embed([entity.line()]))[0]
            gone, provenance = [p for p in old if owned(p[0])], snap.provenance
            tags = {t: still_tagged(snap.tags(t), t, gone, kept, provenance) for t in TAGS}
            fields = {
                "description": entity.description, PIECES: pieces_json(kept),
                PROVENANCE: provenance_json(among(provenance, kept)),
                **{t: ",".join(ids) for t, ids in tags.items()},
                "updated_at": time.time(), self.VECTOR_FIELD: vector,
            }  # fmt: skip
            return {key: (fields, (was.line(), entity.line()))}

        failed = "An entity kept changing while a question was forgotten; try again."
        return (await self._compare_and_set([key], plan, failed)).get(key)

    async def _compare_and_set(self, keys: list[str], plan: Plan, failed: str) -> dict[str, Any]:
        """Rounds of compare-and-set writes: `plan` decides each key's write from the entity as
        read; a key that changed meanwhile is read and planned again. What each written key's
        plan returned (a key that needed nothing: absent). EntityChanging(`failed`) after
        RETRIES rounds."""
        done: dict[str, Any] = {}
        pending = list(dict.fromkeys(keys))
        for _ in range(RETRIES):
            if not pending:
                break
            snapshots = dict(zip(pending, await self._snapshots(pending), strict=True))
            planned = await plan(snapshots)
            again = []
            for key, (fields, result) in planned.items():
                if await self._swap(key, snapshots[key], fields):
                    done[key] = result
                else:
                    again.append(key)
            pending = again
        if pending:
            raise EntityChanging(failed)
        return done

    async def _snapshots(self, keys: list[str]) -> list[Snapshot]:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, READ)
        return [Snapshot.of(READ, row) for row in await pipe.execute()]

    async def _swap(self, key: str, snap: Snapshot, fields: dict[str, Any] | None) -> bool:
        """Write `fields` (None: delete the entity) if it is still as `snap` read it."""
        args: list[Any] = [*snap.expect(), "delete" if fields is None else "write"]
        for name, value in (fields or {}).items():
            is_vector = name == self.VECTOR_FIELD
            args += [name, vector_bytes(value) if is_vector else value]
        return bool(await self._cas(keys=[key], args=args))

    @staticmethod
    def _entity(snap: Snapshot) -> Entity:
        f = snap.fields
        return Entity(f.get("name", ""), f.get("type", ""), f.get("description", ""))

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
        when there is no such entity. The new description is a piece no question owns: a
        person wrote it, and forgetting a question no longer changes it. ValueError when it
        is longer than MAX_DESCRIPTION: cut, it would be saved other than the person wrote it.
        EntityChanging when a merge kept crossing it."""
        if not entity_id:
            raise KeyError(entity_id)
        description = description.strip()
        if len(description) > MAX_DESCRIPTION:
            raise ValueError(
                f"An entity's description may be at most {MAX_DESCRIPTION:,} characters; "
                f"this one has {len(description):,}. Shorten it and save again."
            )
        key = self.key_of(tenant, entity_id)

        async def plan(snapshots: dict[str, Snapshot]) -> dict[str, tuple[Any, Any]]:
            snap = snapshots[key]
            if not snap.exists:
                raise KeyError(entity_id)
            old = self._entity(snap)
            new = Entity(old.name, old.type, description)
            vector = (await self.line_embedder.embed([new.line()]))[0]
            fields = {
                "description": new.description, "updated_at": time.time(),
                PIECES: pieces_json([(UNOWNED, new.description)]), PROVENANCE: "{}",
                self.VECTOR_FIELD: vector,
            }  # fmt: skip
            return {key: (fields, (old.line(), new.line()))}

        failed = "The entity kept changing while it was edited; try again."
        return (await self._compare_and_set([key], plan, failed))[key]

    @staticmethod
    def segment(entities: list[Entity]) -> Segment:
        return Segment(
            name="Entity",
            description="people, organisations, systems and papers that came up in this team's threads.",
            usage="use them to tell apart names and references; they are background, not sources to cite.",
            items=[e.line() for e in entities],
            empty_note="(no related entities)",
        )
