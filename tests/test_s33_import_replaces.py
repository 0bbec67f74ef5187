"""An imported summary or tool log replaces one stored under its id whole: none of the stored
version's fields the file lacks survive, and the stored version's thread index (another
thread's, or its own when the file's is a merged child) no longer lists it
(memory/portability_write.py). A real Redis."""

from __future__ import annotations

import json
import uuid

import pytest

from memory.portability_export import dumps
from memory.scope import Scope
from memory.stores.base import decode
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry

OLD_ONLY = ("level", "children", "parent")  # the stored summary's fields the file leaves out


async def exported(memory, tenant: str) -> list[dict]:
    return [json.loads(dumps(r)) async for r in memory.portability.export_tenant(tenant)]


async def listed(memory, store, tenant: str, thread: str) -> set[str]:
    return {decode(i) for i in await memory.redis.zrange(store.thread_index(Scope(tenant, thread)), 0, -1)}  # fmt: skip


@pytest.mark.parametrize(
    ("stored_in", "merged"),
    [("T0", False), ("T1", True)],
    ids=["listed-in-another-thread", "listed-in-its-thread-imported-merged"],
)
async def test_an_imported_summary_replaces_the_stored_one_whole(
    memory, tenant, stored_in: str, merged: bool
):
    source, here = Scope(tenant, "T1"), Scope(f"t-{uuid.uuid4().hex[:10]}", "T1")
    said = await memory.conversation.append(source, "user", "the okapi grant is due Friday")
    summary = await memory.summaries.save(source, Summary("T1", "The grant", "Due Friday", [said.id]))  # fmt: skip
    records = await exported(memory, tenant)
    for record in records:
        if record["kind"] == "summary":
            for name in OLD_ONLY:
                record["summary"].pop(name)
            record["listed"] = None if merged else record["listed"]
    # the tenant imported into holds a summary under that id (no thread: it counts as empty),
    # merged from children into a parent, listed in `stored_in`'s index
    stored = Summary(
        stored_in, "Old", "Old text", ["m0"], id=summary.id, level=2, children=["sum_kid"],
        parent="sum_top",
    )  # fmt: skip
    await memory.summaries.save(Scope(here.tenant, stored_in), stored)

    await memory.portability.import_records(here.tenant, records)

    key = memory.summaries.key(here.tenant, summary.id)
    fields = {decode(k): decode(v) for k, v in (await memory.redis.hgetall(key)).items()}
    assert not set(OLD_ONLY) & set(fields)  # replaced whole, not merged
    assert (fields["thread_id"], fields["text"]) == ("T1", "Due Friday")
    assert await listed(memory, memory.summaries, here.tenant, "T1") == (
        set() if merged else {summary.id}
    )
    assert summary.id not in await listed(memory, memory.summaries, here.tenant, "T0")
    await memory.drop_tenant(here.tenant)


async def test_an_imported_tool_log_leaves_the_index_of_the_thread_it_was_stored_in(memory, tenant):
    source, here = Scope(tenant, "B"), Scope(f"t-{uuid.uuid4().hex[:10]}", "B")
    await memory.conversation.append(source, "user", "find okapi papers")
    entry = ToolLogEntry("B", "search_papers", {"query": "okapi"}, "two papers", "success")
    await memory.tool_logs.write(source, entry)
    records = await exported(memory, tenant)
    # the tenant imported into holds that log under thread A (no thread: it counts as empty)
    await memory.tool_logs.write(
        Scope(here.tenant, "A"),
        ToolLogEntry("A", "search_papers", {"query": "okapi"}, "old", "success", id=entry.id),
    )

    await memory.portability.import_records(here.tenant, records)

    assert await listed(memory, memory.tool_logs, here.tenant, "B") == {entry.id}
    assert await listed(memory, memory.tool_logs, here.tenant, "A") == set()
    assert (await memory.tool_logs.get(here, entry.id)).output == "two papers"
    await memory.drop_tenant(here.tenant)
