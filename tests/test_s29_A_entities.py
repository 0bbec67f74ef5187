"""An entity learned in one place never reaches another place's record (a name cannot forge a
private channel's key, and a write never widens a stored entity's audience), and a person's
edit too long to keep whole is refused, not cut. Real Redis."""

from __future__ import annotations

import pytest

from memory.scope import Scope, Visibility
from memory.stores.entity import MAX_DESCRIPTION, Entity

CHANNEL = "98765"  # a Discord channel's id: digits, the same lower-cased


def private(tenant: str) -> Scope:
    return Scope(tenant, "p1", channel=CHANNEL, visibility=Visibility.PRIVATE, user="U1")


def public(tenant: str) -> Scope:
    return Scope(tenant, "t1", channel="C1", user="U2")


async def test_a_public_name_never_writes_a_private_channels_entity(memory, tenant):
    entities = memory.entities
    await entities.upsert(private(tenant), [Entity("Project X", "project", "A secret merger.")])
    forged = f"{private(tenant).audience}|Project X"  # what a public channel's model may name
    await entities.upsert(public(tenant), [Entity(forged, "project", "A public note.")])

    kept = await entities.get(private(tenant), "Project X")
    assert kept is not None and kept.description == "A secret merger."
    key = entities.key(private(tenant), "Project X")
    assert (await memory.redis.hget(key, "audience")).decode() == private(tenant).audience
    seen = " ".join(e.line() for e in await entities.all(public(tenant)))
    assert "secret" not in seen
    learned = await entities.get(public(tenant), forged)  # the public name: its own record
    assert learned is not None and learned.description == "A public note."


async def test_a_write_never_widens_a_stored_entitys_audience(memory, tenant):
    """The backstop: a record at a key (however it was reached: a key made before names were
    escaped) stored for another audience is left as it is by a write from this place."""
    entities = memory.entities
    await entities.upsert(public(tenant), [Entity("Quokka", "project", "A public launch.")])
    key = entities.key(public(tenant), "Quokka")
    await memory.redis.hset(key, "audience", private(tenant).audience)  # another place's

    written = await entities.upsert(public(tenant), [Entity("Quokka", "project", "Due in May.")])
    assert written == []
    stored = await entities.get(public(tenant), "Quokka")
    assert stored is not None and stored.description == "A public launch."
    assert (await memory.redis.hget(key, "audience")).decode() == private(tenant).audience


async def test_an_edit_too_long_is_refused_not_cut(memory, tenant):
    entities = memory.entities
    await entities.upsert(public(tenant), [Entity("Kestrel", "system", "A billing service.")])
    entity_id = entities.key(public(tenant), "Kestrel").removeprefix(entities.key_prefix(tenant))
    with pytest.raises(ValueError, match=f"at most {MAX_DESCRIPTION:,} characters"):
        await memory.governance.edit_entity(tenant, entity_id, "x" * (MAX_DESCRIPTION + 1))
    assert (await entities.get(public(tenant), "Kestrel")).description == "A billing service."
    await memory.governance.edit_entity(tenant, entity_id, "y" * MAX_DESCRIPTION)
    assert (await entities.get(public(tenant), "Kestrel")).description == "y" * MAX_DESCRIPTION
