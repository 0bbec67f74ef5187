"""Which question taught which part of an entity's description.

An entity keeps its `pieces`, a JSON list of [question id, piece] pairs in the order they were
learned; its description is always `merge_descriptions` folded over them, so forgetting a
question (memory/governance_learned.py) rebuilds the description from the others' pieces. A
record from before pieces were kept has its description as one piece no question owns ("").
A piece's owner is the question's id and a short hash of the text it was learned from
(`version_of`): a task learning from an edited question's old text takes out only its own
version's pieces, an edit all but the new text's, a forget every version (`taught_by`).

The background's merge takes no erasure lock, so every write of an entity is a compare-and-set
on its hash (`ENTITY_CAS`): it applies only if the entity exists (or not) and its pieces are as
read; a merge and a removal that cross read again, and neither loses the other's piece. One
key each: entity keys carry no hash tag (memory/keys.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memory.stores.base import decode

MAX_DESCRIPTION = 1000
PIECES = "pieces"
UNOWNED = ""  # the question id of a piece no question owns (a legacy or an edited description)

Piece = tuple[str, str]

# KEYS: the entity; ARGV: "1"/"0" (it has a name, as read), its pieces as read ("" when none),
# "delete" or "write", then field, value pairs to write. 1 when applied, 0 when it changed.
ENTITY_CAS = """
if tostring(redis.call('HEXISTS', KEYS[1], 'name')) ~= ARGV[1] then return 0 end
local pieces = redis.call('HGET', KEYS[1], 'pieces') or ''
if pieces ~= ARGV[2] then return 0 end
if ARGV[3] == 'delete' then redis.call('DEL', KEYS[1]) return 1 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
return 1
"""


def version_of(question_id: str, text: str | None) -> str:
    """The owner of the pieces learned from this text of the question ("id#hash"); the bare
    id for a task that names no text (queued before versions were kept)."""
    if not question_id or text is None:
        return question_id
    return f"{question_id}#{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def question_of(owner: str) -> str:
    """The question id of a piece's owner (any version)."""
    return owner.split("#", 1)[0]


def taught_by(question_ids: set[str], keep: str = "") -> Callable[[str], bool]:
    """Whether a piece's owner is any version of these questions (except the owner `keep`)."""
    return lambda owner: bool(owner) and owner != keep and question_of(owner) in question_ids


def merge_descriptions(old: str, new: str) -> str:
    """Keep what was known and add what is new, without repeating a sentence."""
    if not old:
        return new[:MAX_DESCRIPTION]
    if not new or new.lower() in old.lower():
        return old
    return f"{old} {new}"[-MAX_DESCRIPTION:]


def described(pieces: list[Piece]) -> str:
    """The description the pieces make, in the order they were learned."""
    description = ""
    for _, piece in pieces:
        description = merge_descriptions(description, piece)
    return description


def bounded(pieces: list[Piece]) -> list[Piece]:
    """Drop the oldest pieces while the later ones alone fill a description: they are cut
    from it anyway (`merge_descriptions` keeps the last MAX_DESCRIPTION characters)."""
    pieces = [(q, p[:MAX_DESCRIPTION]) for q, p in pieces]
    while len(pieces) > 1 and len(described(pieces[1:])) >= MAX_DESCRIPTION:
        pieces = pieces[1:]
    return pieces


@dataclass
class Snapshot:
    """An entity's hash as read: what a compare-and-set compares, and its fields."""

    fields: dict[str, str]

    @classmethod
    def of(cls, names: list[str], row: list[Any]) -> Snapshot:
        return cls({n: decode(v) for n, v in zip(names, row, strict=True) if v is not None})

    @property
    def raw_pieces(self) -> str:
        """Its pieces as stored ("" when the record keeps none)."""
        return self.fields.get(PIECES, "")

    @property
    def exists(self) -> bool:
        return "name" in self.fields

    @property
    def pieces(self) -> list[Piece]:
        """Its pieces; a record from before them: its description, owned by no question."""
        if self.raw_pieces:
            return [(str(q), str(p)) for q, p in json.loads(self.raw_pieces)]
        description = self.fields.get("description", "")
        return [(UNOWNED, description)] if description else []

    def expect(self) -> list[str]:
        """The script's first arguments: the entity as read."""
        return ["1" if self.exists else "0", self.raw_pieces]


def pieces_json(pieces: list[Piece]) -> str:
    return json.dumps([list(p) for p in pieces], ensure_ascii=False)
