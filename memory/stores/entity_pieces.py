"""Which question taught which part of an entity's description.

An entity keeps its `pieces`, a JSON list of [question id, piece] pairs in the order they were
learned; its description is always `described` of them, so forgetting a
question (memory/governance_learned.py) rebuilds the description from the others' pieces. A
record from before pieces were kept has its description as one piece no question owns ("").
A piece's owner is the question's id and a short hash of the text it was learned from
(`version_of`): a task learning from an edited question's old text takes out only its own
version's pieces, an edit all but the new text's, a forget every version (`taught_by`).

Each owner's provenance is kept beside the pieces (`provenance`: JSON {owner: {"authors": [..],
"threads": [..]}}, a field of its own: the pieces stay [owner, text] pairs, as exports carry
them), so a forget takes out the entity's `authors` and `threads` tags that only the forgotten
pieces brought (`still_tagged`); a person's erasure then spares an entity nothing of theirs is
left in. A piece no question owns, or one learned before provenance was kept, proves nothing:
the tags stay as they were.

The background's merge takes no erasure lock, so every write of an entity is a compare-and-set
on its hash (`ENTITY_CAS`): it applies only if the entity exists (or not) and its pieces,
provenance and tags are as read; a merge and a removal that cross read again, and neither loses
the other's piece or tag. One key each: entity keys carry no hash tag (memory/keys.py).
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
PROVENANCE = "provenance"
TAGS = ("authors", "threads")  # the provenance tag fields a forget may narrow
UNOWNED = ""  # the question id of a piece no question owns (a legacy or an edited description)
COMPARED = (PIECES, PROVENANCE, *TAGS)  # what a compare-and-set checks is as read

Piece = tuple[str, str]
Provenance = dict[str, dict[str, list[str]]]  # owner -> {"authors": [...], "threads": [...]}

# KEYS: the entity; ARGV: "1"/"0" (it has a name, as read), the COMPARED fields as read ("" when
# missing), "delete" or "write", then field, value pairs to write. 1 when applied, 0 when changed.
ENTITY_CAS = """
if tostring(redis.call('HEXISTS', KEYS[1], 'name')) ~= ARGV[1] then return 0 end
local compared = {COMPARED}
for i, field in ipairs(compared) do
  if (redis.call('HGET', KEYS[1], field) or '') ~= ARGV[1 + i] then return 0 end
end
local at = #compared + 2
if ARGV[at] == 'delete' then redis.call('DEL', KEYS[1]) return 1 end
redis.call('HSET', KEYS[1], unpack(ARGV, at + 1))
return 1
""".replace("{COMPARED}", "{" + ", ".join(f"'{name}'" for name in COMPARED) + "}")


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
    """Keep what was known and add what is new, without repeating a sentence; past
    MAX_DESCRIPTION the older text goes whole (only a single over-long newest text is cut)."""
    return _joined([old, new])


def described(pieces: list[Piece]) -> str:
    """The description the pieces make, in the order they were learned."""
    return _joined([piece for _, piece in pieces])


def _joined(parts: list[str]) -> str:
    return " ".join(parts[i] for i in _said(parts))[:MAX_DESCRIPTION]


def _said(parts: list[str]) -> list[int]:
    """Which parts the description says: each not said already; while they are too long the
    oldest goes whole (the newest alone is cut to MAX_DESCRIPTION), and what is said already
    is judged again without it (a part it covered is said again)."""
    start = 0
    while True:
        said: list[int] = []
        for index in range(start, len(parts)):
            if parts[index] and parts[index].lower() not in _text(parts, said).lower():
                said.append(index)
        if len(said) <= 1 or len(_text(parts, said)) <= MAX_DESCRIPTION:
            return said
        start = said[0] + 1


def _text(parts: list[str], said: list[int]) -> str:
    return " ".join(parts[i] for i in said)


def bounded(pieces: list[Piece]) -> list[Piece]:
    """Drop the oldest pieces the description no longer says (`described` drops whole oldest
    pieces past MAX_DESCRIPTION)."""
    pieces = [(q, p[:MAX_DESCRIPTION]) for q, p in pieces]
    said = _said([p for _, p in pieces])
    return pieces[said[0] :] if said else pieces


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

    @property
    def provenance(self) -> Provenance:
        """Who taught each owner's pieces, where; {} for a record from before it was kept (or
        one that does not parse: it proves nothing)."""
        try:
            data = json.loads(self.fields.get(PROVENANCE) or "{}")
        except ValueError:
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            str(owner): {tag: tag_ids(tags.get(tag) or []) for tag in TAGS}
            for owner, tags in data.items()
            if owner and isinstance(tags, dict)
        }

    def tags(self, tag: str) -> list[str]:
        """The ids of a provenance tag field ("authors" or "threads"), as stored."""
        return tag_ids((self.fields.get(tag) or "").split(","))

    def expect(self) -> list[str]:
        """The script's first arguments: the entity as read."""
        return ["1" if self.exists else "0", *(self.fields.get(f, "") for f in COMPARED)]


def pieces_json(pieces: list[Piece]) -> str:
    return json.dumps([list(p) for p in pieces], ensure_ascii=False)


def tag_ids(ids: Any) -> list[str]:
    """Ids as a tag field keeps them: no comma (its separator) or outer spaces, once each."""
    cleaned = (str(i).replace(",", " ").strip() for i in ids) if isinstance(ids, list) else ()
    return list(dict.fromkeys(i for i in cleaned if i))


def taught_with(provenance: Provenance, owner: str, authors: list[str], thread: str) -> Provenance:
    """`provenance` once `owner` (a question's version) taught a piece by `authors` in `thread`;
    a piece no question owns adds nothing (it proves nothing)."""
    if owner == UNOWNED:
        return provenance
    was = provenance.get(owner, {})
    return {**provenance, owner: {
        "authors": tag_ids([*was.get("authors", []), *authors]),
        "threads": tag_ids([*was.get("threads", []), thread]),
    }}  # fmt: skip


def among(provenance: Provenance, pieces: list[Piece]) -> Provenance:
    """The provenance of the owners still among `pieces` (one dropped or forgotten goes)."""
    owners = {owner for owner, _ in pieces}
    return {owner: tags for owner, tags in provenance.items() if owner in owners}


def still_tagged(
    tags: list[str], tag: str, gone: list[Piece], kept: list[Piece], provenance: Provenance
) -> list[str]:
    """The `tag` ids ("authors" or "threads") an entity keeps once the `gone` pieces are out:
    an id goes only when a gone piece's owner brought it and every kept piece's owner is known
    (none unowned or from before provenance) and none brought it. Anything else stays."""
    if any(owner not in provenance for owner, _ in kept):
        return tags  # a kept piece of unknown provenance may be anyone's
    brought = {i for owner, _ in gone for i in provenance.get(owner, {}).get(tag, [])}
    supported = {i for owner, _ in kept for i in provenance[owner].get(tag, [])}
    return [i for i in tags if i not in brought or i in supported]


def provenance_json(provenance: Provenance) -> str:
    return json.dumps(provenance, ensure_ascii=False, sort_keys=True)
