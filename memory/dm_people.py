"""Whose DM a place is, told from its messages (memory/keys.py `dm_people_key`): for threads
stored before appends kept that record (memory/governance_sweeps.py `Sweeps._dm_places`) and
for an import of a file from before exports kept it (memory/portability_write.py). One rule
for both: a message's place is its audience, or for a message from before audiences were kept
its thread's (`legacy_audience`); a DM place is someone's when exactly one person wrote there,
across all its threads (a DM has one person; two: none is told). Tombstones keep no author:
a place whose messages are all tombstones cannot be told from them, so an export keeps the
record itself (a DM thread line's `dm_person`), and an import takes it where its writers cannot
tell (what the messages show comes first: a file's record is not to override them)."""

from __future__ import annotations

from memory.scope import legacy_audience


class DmAuthors:
    """The people who wrote in each DM place, gathered message by message."""

    def __init__(self) -> None:
        self.authors: dict[str, set[str]] = {}
        self.declared: dict[str, set[str]] = {}  # as a record says it (an export's)

    def add(self, thread: str, role: str, author: str, audience: str) -> None:
        place = audience or legacy_audience(thread)
        if role == "user" and author and place.startswith("dm:"):
            self.authors.setdefault(place, set()).add(author)

    def declare(self, thread: str, person: str, audience: str) -> None:
        """The thread's DM place is `person`'s, as a record says (not a writer's message)."""
        place = audience or legacy_audience(thread)
        if person and place.startswith("dm:"):
            self.declared.setdefault(place, set()).add(person)

    def people(self) -> dict[str, str]:
        """Each DM place whose one person is known: place -> that person. Its one writer tells
        it; a place's record (when its records agree) tells a place its writers cannot (no
        writer left, or two)."""
        told = {place: next(iter(a)) for place, a in self.declared.items() if len(a) == 1}
        told.update((p, next(iter(a))) for p, a in self.authors.items() if len(a) == 1)
        return told
