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
compare-and-set and each workflow deleted only while it is still that question's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memory.governance_erasure import Erasure
from memory.governance_purge import Purge
from memory.keys import learned_key, turn_messages_key
from memory.stores.base import decode
from memory.stores.turn_records import TurnRecord, UnknownTurn

QUERY, STEPS = "QUERY: ", "\nSTEPS:"

# KEYS: a workflow; ARGV: question ids. Deletes it only while one of them is its question.
_DELETE_IF_TAUGHT = """
local question = redis.call('HGET', KEYS[1], 'question')
for i = 1, #ARGV do
  if question == ARGV[i] then return redis.call('DEL', KEYS[1]) end
end
return 0
"""


class Learned:
    def __init__(self, memory: Any, purge: Purge) -> None:
        self.memory = memory
        self.redis = memory.redis
        self._purge = purge
        self._delete_if_taught = memory.redis.register_script(_DELETE_IF_TAUGHT)

    async def note(self, tenant: str, question: str, keys: Iterable[str]) -> None:
        """Record that the stored question `question` teaches these entity and workflow keys
        (before they are written: a forget then finds them, whenever it comes)."""
        keys = list(keys)
        if question and keys:
            await self.redis.sadd(learned_key(tenant, question), *keys)

    async def forget(self, tenant: str, questions: Iterable[str]) -> Erasure:
        """The questions were forgotten: their workflows go, and their pieces of each entity
        (an entity left with none goes). Run again, it finds nothing left."""
        asked = list(dict.fromkeys(q for q in questions if q))
        keys = [learned_key(tenant, q) for q in asked]
        if not keys:
            return Erasure()
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.smembers(key)
        taught = {decode(k) for members in await pipe.execute() for k in members}
        erasure = await self._unteach(tenant, asked, sorted(taught))
        await self.redis.delete(*keys)  # the tenant's keys: one slot
        return erasure

    async def discard(self, tenant: str, question: str, keys: Iterable[str]) -> Erasure:
        """What a turn wrote while its question was forgotten: only that question's pieces and
        its workflow go (what other turns taught the same entities stays)."""
        erasure = await self._unteach(tenant, [question], list(keys))
        await self.redis.delete(learned_key(tenant, question))  # noted after the forget read it
        return erasure

    async def edited(self, tenant: str, question: str, text: str) -> None:
        """The question now says `text` (an edit on the platform): the entity pieces its old
        text taught go, and its workflow's QUERY line says `text`."""
        key = learned_key(tenant, question)
        taught = [decode(k) for k in await self.redis.smembers(key)]
        entities = [k for k in taught if self._is_entity(tenant, k)]
        await self._unteach(tenant, [question], entities)
        if entities:
            await self.redis.srem(key, *entities)
        for workflow in (k for k in taught if k not in entities):
            await self._requery(tenant, question, workflow, text)

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

    async def _unteach(self, tenant: str, questions: list[str], keys: list[str]) -> Erasure:
        """Take the pieces `questions` taught out of the entities at `keys`, and delete the
        workflows there that one of them taught; each entity and workflow counts once."""
        entities = workflows = 0
        stale: list[str] = []  # texts whose cached vectors go
        for key in keys:
            if self._is_entity(tenant, key):
                changed = await self.memory.entities.unlearn(tenant, key, set(questions))
                if changed is not None:
                    entities += 1
                    old, new = changed
                    stale += [old] if old != new else []
            elif key.startswith(self.memory.workflows.key_prefix(tenant)):
                text = decode(await self.redis.hget(key, "text"))
                if text is not None and await self._delete_if_taught(keys=[key], args=questions):
                    workflows += 1
                    stale.append(text)
        cached = await self._purge.uncache(stale)
        return Erasure(entities=entities, workflows=workflows, cached_embeddings=cached)

    async def _requery(self, tenant: str, question: str, key: str, text: str) -> None:
        """Rewrite the QUERY line of the workflow at `key`, when `question` taught it."""
        store = self.memory.workflows
        old, owner = (decode(v) for v in await self.redis.hmget(key, ["text", "question"]))
        if old is None or owner != question or not old.startswith(QUERY) or STEPS not in old:
            return
        new = f"{QUERY}{text}{STEPS}{old.split(STEPS, 1)[1]}"
        if new != old:
            await store.rewrite(tenant, key.removeprefix(store.key_prefix(tenant)), new)
            await self._purge.uncache([old])
