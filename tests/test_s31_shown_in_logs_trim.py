"""A tool log that goes leaves the shown-in-logs sets of what it showed
(memory/stores/tool_log.py `remove`, `forget_showing`, `unindex`): by retention (a thread in
part, a thread whole), by forgetting the log, a message it showed or its thread, by erasing its
author. Else every set keeps the ids of logs long gone, and a set no live log is in stays for
ever. A set another live log is in keeps that log, and so do the sets of a log of a thread an
erasure left (it changed meanwhile). A real Redis."""

from __future__ import annotations

import time
import uuid

from memory.governance_purge import Purge
from memory.governance_threads import ThreadEraser
from memory.keys import shown_in_logs_key
from memory.scope import Scope
from memory.stores.base import decode
from memory.stores.tool_log import ToolLogEntry, paper_shown

DAY = 86_400.0
KEPT, ALONE = "2310.08560", "2401.00001"  # a paper a live log showed too; one only the gone log


async def write_log(memory, scope: Scope, *shown: str, at: float | None = None) -> str:
    """A log in `scope.thread` that showed these (message ids or `paper_shown` ids)."""
    entry = ToolLogEntry(
        scope.thread, "search_papers", {"query": "memory"}, "passages", "success",
        message_ids=list(shown), author=scope.user,
    )  # fmt: skip
    if at is not None:
        entry.created_at = at
    return await memory.tool_logs.write(scope, entry)


async def members(memory, tenant: str, shown: str) -> set[str]:
    return {decode(m) for m in await memory.redis.smembers(shown_in_logs_key(tenant, shown))}


async def gone_but_kept(memory, tenant: str, live: str) -> None:
    """The gone log left both papers' sets: the one only it showed went, the other keeps `live`."""
    assert await members(memory, tenant, paper_shown(KEPT)) == {live}
    assert not await memory.redis.exists(shown_in_logs_key(tenant, paper_shown(ALONE)))


async def both_papers(memory, scope: Scope, at: float | None = None) -> str:
    return await write_log(memory, scope, paper_shown(KEPT), paper_shown(ALONE), at=at)


async def test_retention_of_part_of_a_thread_trims_the_sets(memory, tenant):
    old, new = time.time() - 3 * DAY, time.time() - 600
    mixed = Scope(tenant, "mixed")
    await memory.conversation.append(mixed, "user", "the pangolin deadline", timestamp=old)
    await memory.conversation.append(mixed, "user", "the narwhal review", timestamp=new)
    await both_papers(memory, mixed, at=old)
    live = await write_log(memory, mixed, paper_shown(KEPT), at=new)
    await memory.retention.set(tenant, 1)
    assert (await memory.retention.sweep(tenant)).tool_logs == 1
    assert await memory.tool_logs.ids(mixed) == [live]
    await gone_but_kept(memory, tenant, live)


async def test_retention_of_a_whole_thread_trims_the_sets(memory, tenant):
    old = time.time() - 3 * DAY
    stale, fresh = Scope(tenant, "stale"), Scope(tenant, "fresh")
    await memory.conversation.append(stale, "user", "the aardvark budget", timestamp=old)
    await memory.conversation.append(fresh, "user", "the okapi server", timestamp=time.time())
    await both_papers(memory, stale, at=old)
    live = await write_log(memory, fresh, paper_shown(KEPT))
    await memory.retention.set(tenant, 1)
    erasure = await memory.retention.sweep(tenant)
    assert erasure.threads == 1 and erasure.tool_logs == 1
    await gone_but_kept(memory, tenant, live)


async def test_forgetting_a_log_trims_the_sets(memory, tenant):
    scope = Scope(tenant, "T1")
    await memory.conversation.append(scope, "user", "what is MemGPT?")
    gone, live = await both_papers(memory, scope), await write_log(memory, scope, paper_shown(KEPT))
    assert (await memory.governance.forget_tool_log(tenant, gone)).tool_logs == 1
    await gone_but_kept(memory, tenant, live)


async def test_forgetting_a_message_a_log_showed_trims_its_other_sets(memory, tenant):
    scope = Scope(tenant, "T1")
    said = await memory.conversation.append(scope, "user", "my okapi password is hunter2")
    await write_log(memory, scope, said.id, paper_shown(KEPT), paper_shown(ALONE))
    live = await write_log(memory, scope, paper_shown(KEPT))
    erasure = await memory.governance.forget_message(tenant, scope.thread, said.id)
    assert erasure.tool_logs == 1
    assert not await memory.redis.exists(shown_in_logs_key(tenant, said.id))
    await gone_but_kept(memory, tenant, live)


async def test_forgetting_a_thread_trims_the_sets_its_logs_were_in(memory, tenant):
    doomed, other = Scope(tenant, "doomed"), Scope(tenant, "other")
    await memory.conversation.append(doomed, "user", "what is MemGPT?")
    await memory.conversation.append(other, "user", "and Reflexion?")
    await both_papers(memory, doomed)
    live = await write_log(memory, other, paper_shown(KEPT))
    assert (await memory.governance.forget_thread(tenant, doomed.thread)).tool_logs == 1
    await gone_but_kept(memory, tenant, live)


async def test_erasing_a_person_trims_the_sets_of_their_logs(memory, tenant):
    ada, bo = (Scope(tenant, "T1", "C1", user=u) for u in ("U1", "U2"))
    await memory.conversation.append(ada, "user", "what is MemGPT?")
    await memory.conversation.append(bo, "user", "and Reflexion?")
    await both_papers(memory, ada)
    live = await write_log(memory, bo, paper_shown(KEPT))
    assert (await memory.governance.forget_person(tenant, "U1")).tool_logs == 1
    await gone_but_kept(memory, tenant, live)


async def test_a_log_from_before_goes_with_others(memory, tenant):
    """A log kept no `message_ids` before they were kept: removing it with others trims theirs
    and fails on nothing."""
    scope, store = Scope(tenant, "T1"), memory.tool_logs
    before = f"log_{uuid.uuid4().hex[:12]}"
    await memory.redis.hset(store.key(tenant, before), mapping={"thread_id": "T1", "output": "x"})
    gone, live = await both_papers(memory, scope), await write_log(memory, scope, paper_shown(KEPT))
    assert await store.remove(tenant, {"T1": [before, gone]}) == 2
    await gone_but_kept(memory, tenant, live)


async def test_a_thread_that_changed_meanwhile_keeps_its_logs_in_their_sets(memory, tenant):
    """An erasure leaves a thread that grew after it was read (`erase_unchanged`): its logs
    stay, so do their shown-in-logs entries, and forgetting what they showed still finds them.
    Only the logs of the threads that went leave their sets."""
    doomed, grew, elsewhere = (Scope(tenant, t) for t in ("doomed", "grew", "elsewhere"))
    await memory.conversation.append(doomed, "user", "what is MemGPT?")
    await memory.conversation.append(grew, "user", "and Reflexion?")
    said = await memory.conversation.append(elsewhere, "user", "my okapi badge is 4471")
    gone = await write_log(memory, doomed, said.id, paper_shown(ALONE))
    live = await write_log(memory, grew, said.id)
    eraser = ThreadEraser(memory, Purge(memory))
    lists = await eraser.read(tenant, ["doomed", "grew"])
    await memory.conversation.append(grew, "user", "said after the lists were read")

    erasure, changed = await eraser.erase_unchanged(tenant, lists)

    assert changed == ["grew"] and erasure.threads == 1 and erasure.tool_logs == 1
    assert await members(memory, tenant, said.id) == {live}
    assert not await memory.redis.exists(shown_in_logs_key(tenant, paper_shown(ALONE)))
    assert (await memory.governance.forget_message(tenant, "elsewhere", said.id)).tool_logs == 1
    assert await memory.tool_logs.ids(grew) == []
    assert not await memory.redis.exists(memory.tool_logs.key(tenant, gone))


async def test_sets_that_cannot_be_trimmed_fail_no_forget(memory, tenant):
    """Leaving the sets is only tidying: when Redis refuses it (a set made a string answers
    WRONGTYPE; no code is patched), the forgets (`forget_showing`, `remove`) and the thread's
    erasure still end, their logs gone."""
    scope, doomed = Scope(tenant, "T1"), Scope(tenant, "doomed")
    said = await memory.conversation.append(scope, "user", "my okapi password is hunter2")
    await memory.conversation.append(doomed, "user", "what is MemGPT?")
    shower = await write_log(memory, scope, said.id, paper_shown(ALONE))
    erased = await write_log(memory, doomed, paper_shown(ALONE))
    removed = await write_log(memory, scope, paper_shown(ALONE))
    await memory.redis.set(shown_in_logs_key(tenant, paper_shown(ALONE)), "not a set")

    assert (await memory.governance.forget_message(tenant, "T1", said.id)).tool_logs == 1
    assert (await memory.governance.forget_tool_log(tenant, removed)).tool_logs == 1
    assert (await memory.governance.forget_thread(tenant, "doomed")).tool_logs == 1

    for log_id in (shower, removed, erased):
        assert not await memory.redis.exists(memory.tool_logs.key(tenant, log_id))
