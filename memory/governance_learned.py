"""What a turn taught goes with its question: the entities and workflow learned from it.

A turn's background write (bot/harness.py `write_artifacts`) notes, before it writes, the keys
of the workflow and entities it teaches under the question's stored id (`learned_key`). When
that question is forgotten (a message, a deletion on the platform, a whole thread or place;
not retention, which keeps them by design, nor a person's erasure, which drops every entity
and workflow their turns taught), its workflow goes and each entity loses the pieces of its
description that question taught (memory/stores/entity_pieces.py): the description is rebuilt
from the others' and embedded again, and an entity with nothing left goes. An edit on the
platform takes out what the old text taught and rewrites its workflow's QUERY line; the turn's
entities are then learned again from the new text (bot/upkeep.py queues it).

Erasures hold the tenant's lock; the background write does not, so each entity is changed by
compare-and-set and each workflow deleted only while it is still that question's. Pieces are
owned by a version of the question (its id and its text's hash, memory/stores/entity_pieces.py):
a task that learned from an edited question's old text takes out only that version's pieces,
an edit every version but the new text's, a forget them all. A forget does not delete the
record: it marks it forgotten for a day (`FORGOTTEN`), reading it in the same step, and `note`
then refuses (its writer writes nothing), so a late or redelivered task cannot teach a forgotten
question again; a task that noted before the mark sees it when it checks after writing, and
takes out what it wrote. A task applies once per version (`DONE`), and a turn's workflow is
written once (`TOLD`): delivered again, it would undo a correction made on the memory page
meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from memory.governance_erasure import Erasure
from memory.governance_purge import Purge
from memory.keys import learned_key, turn_messages_key
from memory.stores.base import decode
from memory.stores.entity_pieces import UNOWNED, question_of, taught_by, version_of
from memory.stores.turn_records import TurnRecord, UnknownTurn

QUERY, STEPS = "QUERY: ", "\nSTEPS:"
FORGOTTEN = "!forgotten"  # the member marking a record forgotten (no store key starts so)
FORGOTTEN_SECONDS = 86_400  # a marked record outlives any late or redelivered task
DONE = "!done:"  # + a version: the member marking that version's task written (applied once)
TOLD = "!told"  # the member marking the turn's workflow written (by its own task: it has steps)
REPLACED = "!replaced:"  # + an entity key: a person's edit replaced what the question taught it


def _is_key(member: str | None) -> bool:
    """A record's member naming a store key (not a mark)."""
    return bool(member) and not member.startswith("!")


# KEYS: a question's record; ARGV: the marker, then keys. 0 (nothing added) when forgotten.
_NOTE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('SADD', KEYS[1], unpack(ARGV, 2))
return 1
"""

# KEYS: a workflow; ARGV: question ids. Deletes it only while one of them is its question.
_DELETE_IF_TAUGHT = """
local question = redis.call('HGET', KEYS[1], 'question')
for i = 1, #ARGV do
  if question == ARGV[i] then return redis.call('DEL', KEYS[1]) end
end
return 0
"""


# KEYS: questions' records (one tenant's: one slot); ARGV: the marker, its seconds. Marks each
# record that exists (a question that taught nothing has none: a writer that notes later is
# caught by its own check after writing) and returns what they list.
_MARK = """
local taught = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('SADD', KEYS[i], ARGV[1])
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    for _, member in ipairs(redis.call('SMEMBERS', KEYS[i])) do table.insert(taught, member) end
  end
end
return taught
"""
MARK_BATCH = 500  # records marked per script call


async def mark_forgotten(
    redis: Any, tenant: str, questions: Iterable[str], script: Any = None
) -> set[str]:
    """Mark the questions' records forgotten for a day, in one step with reading them: what
    they taught (the keys noted). Later notes are refused. Only records that exist: a large
    thread's or a retention sweep's questions mostly taught nothing, and leave no key."""
    keys, mark = [learned_key(tenant, q) for q in questions], script or redis.register_script(_MARK)
    taught: set[str] = set()
    for start in range(0, len(keys), MARK_BATCH):
        members = await mark(keys=keys[start : start + MARK_BATCH],
                             args=[FORGOTTEN, FORGOTTEN_SECONDS])  # fmt: skip
        taught |= {k for k in map(decode, members) if _is_key(k)}
    return taught


class Learned:
    def __init__(self, memory: Any, purge: Purge) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._purge = purge
        self._delete_if_taught = memory.redis.register_script(_DELETE_IF_TAUGHT)
        self._note = memory.redis.register_script(_NOTE)
        self._mark = memory.redis.register_script(_MARK)

    async def note(self, tenant: str, question: str, keys: Iterable[str]) -> bool:
        """Record that the stored question `question` teaches these entity and workflow keys
        (before they are written: a forget then finds them, whenever it comes). False when
        the question was forgotten: its writer writes nothing."""
        keys = list(keys)
        if not question or not keys:
            return True
        record = learned_key(tenant, question)
        return bool(await self._note(keys=[record], args=[FORGOTTEN, *keys]))

    async def forget(
        self, tenant: str, questions: Iterable[str], also: Iterable[str] = ()
    ) -> Erasure:
        """The questions were forgotten: their records are marked forgotten (a day) first, and
        read in the same step; then their workflows go, and every version's pieces of each
        entity (an entity left with none goes). A writer that noted before the mark is in what
        was read, and its task, seeing the mark (`forgotten`), calls this again once it has
        written; one after the mark is refused. `also`: keys a caller knows were written for
        them (a record another erasure dropped). Run again, it finds nothing left."""
        asked = list(dict.fromkeys(q for q in questions if q))
        if not asked:
            return Erasure()
        taught = await mark_forgotten(self.redis, tenant, asked, self._mark) | set(also)
        return await self._unteach(tenant, asked, sorted(taught), taught_by(set(asked)))

    async def learned(self, tenant: str, question: str, version: str) -> bool:
        """Whether a task for this version of the question wrote what it taught already: run
        again (a batch redelivered), it would undo a person's edit on the memory page."""
        return bool(await self.redis.sismember(learned_key(tenant, question), DONE + version))

    async def untold(self, tenant: str, question: str) -> bool:
        """Whether the question's turn's workflow is not written yet (`TOLD`: noted as soon as
        the workflow is written, bot/harness.py, so a task that failed after it, on the
        entities, does not write it again over a memory-page edit); always True for a turn with
        no successful step (no workflow to write). Its turn's task, finding the question edited, then learns the
        text it says now, with the turn's steps (bot/harness.py `write_artifacts`), rather than
        nothing: an edit's relearn has no steps."""
        return not await self.redis.sismember(learned_key(tenant, question), TOLD)

    async def written(self, tenant: str, question: str, version: str, told: bool = False) -> None:
        """Mark this version's task written (the record exists: it noted what it wrote);
        `told`: it wrote the turn's workflow too."""
        marks = [DONE + version, TOLD] if told else [DONE + version]
        await self.redis.sadd(learned_key(tenant, question), *marks)

    async def unwritten(self, tenant: str, question: str, version: str) -> None:
        """Take back a version's done mark set after an edit away from it took the marks out
        (`edited`): editing back to that text must learn it again."""
        await self.redis.srem(learned_key(tenant, question), DONE + version)

    async def forgotten(self, tenant: str, question: str) -> bool:
        """Whether the question's record was marked forgotten (in the last day)."""
        return bool(await self.redis.sismember(learned_key(tenant, question), FORGOTTEN))

    async def discard(self, tenant: str, version: str, keys: Iterable[str]) -> Erasure:
        """What a turn learned from a text its question no longer says (an edit while it was
        written): only that version's pieces go; the workflow stays (the edit rewrote it)."""
        entities = [k for k in keys if self._is_entity(tenant, k)]
        return await self._unteach(tenant, [], entities, lambda owner: owner == version)

    async def replaced(self, tenant: str, question: str) -> list[str]:
        """The entity keys whose pieces of this question a person's edit replaced (found by
        `edited`): learning the question again (its edit's relearn) leaves them as edited."""
        members = await self.redis.smembers(learned_key(tenant, question))
        return sorted(m[len(REPLACED) :] for m in map(decode, members) if m.startswith(REPLACED))

    async def taught(self, tenant: str, question: str) -> list[str]:
        """The keys noted under this question (the marker aside)."""
        members = await self.redis.smembers(learned_key(tenant, question))
        return sorted(k for k in map(decode, members) if _is_key(k))

    async def edited(self, tenant: str, question: str, text: str) -> None:
        """The question now says `text` (an edit on the platform): the entity pieces any other
        text of it taught go (every version but the new text's), and its workflow's QUERY line
        says `text`. The other texts' done marks go with their pieces: a text said before (A,
        B, back to A) is learned again; the new text's stays (this edit followed again finds
        its relearn done)."""
        version, record = version_of(question, text), learned_key(tenant, question)
        members = map(decode, await self.redis.smembers(record))
        if stale := [m for m in members if m.startswith(DONE) and m != DONE + version]:
            await self.redis.srem(record, *stale)
        taught = await self.taught(tenant, question)
        entities = [k for k in taught if self._is_entity(tenant, k)]
        replaced = []  # a person's edit on the memory page took the question's pieces out
        for key in entities:
            owners = await self.memory.entities.owners(key)
            if owners and UNOWNED in owners and not any(map(taught_by({question}), owners)):
                replaced.append(key)
        if replaced:
            await self.redis.sadd(learned_key(tenant, question), *(REPLACED + k for k in replaced))
        await self._unteach(tenant, [], entities, taught_by({question}, keep=version))
        for workflow in self.workflows(tenant, taught):
            await self.requery(tenant, question, workflow, text)

    async def deleting(self, tenant: str, key: str) -> None:
        """A person deletes the entity at `key` (the memory page): each question that taught
        one of its pieces gets the mark an edit leaves (`REPLACED`), before it goes, so an
        edit of that question, learning it again, does not bring the entity back."""
        owners = await self.memory.entities.owners(key) or []
        questions = sorted({question_of(o) for o in owners if o != UNOWNED})
        if questions:
            pipe = self.redis.pipeline(transaction=False)  # one key a command
            for question in questions:
                pipe.sadd(learned_key(tenant, question), REPLACED + key)
            await pipe.execute()

    async def turn_of(self, tenant: str, question: str) -> TurnRecord | None:
        """The record of the turn that answered this stored question, if any."""
        turn = decode(await self.redis.hget(turn_messages_key(tenant), question))
        try:
            record = await self.memory.turn_records.get(tenant, turn) if turn else None
        except UnknownTurn:
            return None
        return record if record is not None and record.question_id == question else None

    # -- the records ----------------------------------------------------------------------------

    def _is_entity(self, tenant: str, key: str) -> bool:
        return key.startswith(self.memory.entities.key_prefix(tenant))

    def workflows(self, tenant: str, keys: Iterable[str]) -> list[str]:
        """The workflow keys among `keys` (a record lists entities' and workflows')."""
        prefix = self.memory.workflows.key_prefix(tenant)
        return [k for k in keys if k.startswith(prefix)]

    async def _unteach(
        self, tenant: str, questions: list[str], keys: list[str], owned: Callable[[str], bool]
    ) -> Erasure:
        """Take the pieces whose owner is `owned` out of the entities at `keys`, and delete the
        workflows there that one of `questions` taught; each entity and workflow counts once."""
        entities = workflows = 0
        stale: list[str] = []  # texts whose cached vectors go
        for key in keys:
            if self._is_entity(tenant, key):
                changed = await self.memory.entities.unlearn(tenant, key, owned)
                if changed is not None:
                    entities += 1
                    old, new = changed
                    stale += [old] if old != new else []
            elif questions and key.startswith(self.memory.workflows.key_prefix(tenant)):
                text = decode(await self.redis.hget(key, "text"))
                if text is not None and await self._delete_if_taught(keys=[key], args=questions):
                    workflows += 1
                    stale.append(text)
        cached = await self._purge.uncache(stale)
        return Erasure(entities=entities, workflows=workflows, cached_embeddings=cached)

    async def requery(self, tenant: str, question: str, key: str, text: str) -> None:
        """Rewrite the QUERY line of the workflow at `key`, when `question` taught it."""
        store = self.memory.workflows
        old, owner = (decode(v) for v in await self.redis.hmget(key, ["text", "question"]))
        if old is None or owner != question or not old.startswith(QUERY) or STEPS not in old:
            return
        new = f"{QUERY}{text}{STEPS}{old.split(STEPS, 1)[1]}"
        if new != old and await store.requery(key, question, old, new):
            await self._purge.uncache([old])
