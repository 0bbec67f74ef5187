"""Every multi-key call the suite made kept to one hash slot, so memory runs on a sharded Redis
(Redis Cloud or Redis Software with several shards). tests/conftest.py records the calls; this
file runs last (file order) and checks them, and first that the recorder can see an offender."""

from __future__ import annotations

from redis.crc import key_slot

from memory.keys import tenant_key
from memory.scope import Scope
from memory.stores.base import delete_keys
from memory.stores.summary import Summary


def two_slots(tenant: str) -> tuple[str, str]:
    """Keys of two tenants that hash to different slots."""
    first = tenant_key(f"{tenant}-a", "x")
    for n in range(10):
        other = tenant_key(f"{tenant}-b{n}", "x")
        if key_slot(other.encode()) != key_slot(first.encode()):
            return first, other
    raise AssertionError("no second slot found")


async def test_the_recorder_sees_the_stores_multi_key_calls(memory, tenant, slot_recorder):
    scope = Scope(tenant, "T1")
    before = slot_recorder.checked
    message = await memory.conversation.append(scope, "user", "hello")  # a script over 2 keys
    await memory.summaries.save(scope, Summary("T1", "d", "t", [message.id]))  # a MULTI
    assert slot_recorder.checked >= before + 2


async def test_a_cross_slot_script_is_an_offender_and_its_one_slot_twin_is_not(
    memory, tenant, slot_recorder
):
    script = memory.redis.register_script("return #KEYS")
    apart = two_slots(tenant)
    together = [tenant_key(tenant, "x"), tenant_key(tenant, "y")]
    with slot_recorder.apart() as offenders:
        assert await script(keys=list(together)) == 2
        assert offenders == []
        assert await script(keys=list(apart)) == 2  # a single Redis runs it; a sharded one not
    assert offenders and all(apart[0] in o and apart[1] in o for o in offenders)
    assert offenders[0].startswith("EVAL")


async def test_a_cross_slot_transaction_is_an_offender(memory, tenant, slot_recorder):
    first, second = two_slots(tenant)
    with slot_recorder.apart() as offenders:
        pipe = memory.redis.pipeline(transaction=True)
        pipe.set(first, 1)
        pipe.set(second, 1)
        await pipe.execute()
    assert offenders == [f"MULTI SET SET EXEC: {first}, {second}"]
    await memory.redis.delete(first)
    await memory.redis.delete(second)


async def test_documents_of_many_slots_are_deleted_one_del_per_slot(memory, tenant, slot_recorder):
    keys = [f"{memory.episodes.key_prefix(tenant)}{n}" for n in range(6)]
    assert len({key_slot(k.encode()) for k in keys}) > 1  # documents spread over the shards
    for key in keys[::2]:
        await memory.redis.set(key, 1)
    with slot_recorder.apart() as offenders:
        assert await delete_keys(memory.redis, keys) == 3
    assert offenders == []
    assert [await memory.redis.exists(key) for key in keys] == [0] * len(keys)


def test_every_multi_key_call_of_the_suite_kept_to_one_slot(slot_recorder):
    offenders = list(dict.fromkeys(slot_recorder.offenders))
    assert offenders == [], f"{len(offenders)} calls across slots:\n" + "\n".join(offenders[:40])
