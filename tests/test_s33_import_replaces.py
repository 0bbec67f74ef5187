"""An imported summary or tool log replaces one stored under its id whole: none of the stored
version's fields the file lacks survive, the stored version's thread index (another thread's,
or its own when the file's is a merged child) no longer lists it, while the one the file lists
it in does (its own too), and a stored summary's parent and children let go of it
(memory/portability_write.py); a file whose summary or tool log names another thread than its
record's is refused (memory/portability_check.py). A real Redis."""

from __future__ import annotations

import json
import uuid

import pytest

from memory.portability import BadExportLine
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
    [("T0", False), ("T1", True), ("T1", False)],
    ids=[
        "listed-in-another-thread",
        "listed-in-its-thread-imported-merged",
        "listed-in-the-same-thread",
    ],
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


@pytest.mark.parametrize("stored_in", ["A", "B"], ids=["another-thread", "the-same-thread"])
async def test_an_imported_tool_log_is_listed_only_in_the_thread_the_file_lists_it_in(
    memory, tenant, stored_in: str
):
    source, here = Scope(tenant, "B"), Scope(f"t-{uuid.uuid4().hex[:10]}", "B")
    await memory.conversation.append(source, "user", "find okapi papers")
    entry = ToolLogEntry("B", "search_papers", {"query": "okapi"}, "two papers", "success")
    await memory.tool_logs.write(source, entry)
    records = await exported(memory, tenant)
    # the tenant imported into holds that log under `stored_in` (no thread: it counts as empty)
    await memory.tool_logs.write(
        Scope(here.tenant, stored_in),
        ToolLogEntry(stored_in, "search_papers", {"query": "okapi"}, "old", "success", id=entry.id),
    )

    await memory.portability.import_records(here.tenant, records)

    assert await listed(memory, memory.tool_logs, here.tenant, "B") == {entry.id}
    assert await listed(memory, memory.tool_logs, here.tenant, "A") == set()
    assert (await memory.tool_logs.get(here, entry.id)).output == "two papers"
    await memory.drop_tenant(here.tenant)


@pytest.mark.parametrize("kind", ["summary", "tool_log"])
@pytest.mark.parametrize("thread_id", ["T0", "   "], ids=["another-thread", "blank"])
async def test_a_record_naming_another_thread_than_its_line_is_refused(
    memory, tenant, kind: str, thread_id: str
):
    """The import lists a record in its line's thread and writes the file's `thread_id`, which
    an import replacing it later unlists it by: the two must be one."""
    source, here = Scope(tenant, "T1"), f"t-{uuid.uuid4().hex[:10]}"
    said = await memory.conversation.append(source, "user", "find okapi papers")
    await memory.summaries.save(source, Summary("T1", "Okapis", "Okapi papers", [said.id]))
    await memory.tool_logs.write(
        source, ToolLogEntry("T1", "search_papers", {"query": "okapi"}, "two papers", "success")
    )
    records = await exported(memory, tenant)
    next(r for r in records if r["kind"] == kind)[kind]["thread_id"] = thread_id

    with pytest.raises(BadExportLine, match=f"its {kind} belongs to another thread"):
        await memory.portability.import_records(here, records)
    assert await memory.portability.is_empty(here)


@pytest.mark.parametrize("file_parent", ["", "sum_top"], ids=["top-level", "same-parent"])
async def test_an_imported_summary_leaves_the_stored_versions_place_in_the_summary_tree(
    memory, tenant, file_parent: str
):
    """The stored version was merged into `sum_top` (thread T0's summary), from three children:
    one the file's version names too, one merged from it, one moved since (its parent is
    another). Imported top-level, it leaves `sum_top`'s children, and the child only the stored
    version had is deleted; imported under `sum_top` too, it stays among its children."""
    source, here = Scope(tenant, "T1"), f"t-{uuid.uuid4().hex[:10]}"
    said = await memory.conversation.append(source, "user", "the okapi grant is due Friday")
    summary = await memory.summaries.save(source, Summary("T1", "The grant", "Due Friday", [said.id]))  # fmt: skip
    records = await exported(memory, tenant)
    for record in records:
        if record["kind"] == "summary":
            record["summary"].update(parent=file_parent, children=["sum_named"])
    old = Scope(here, "T0")  # the tenant imported into (no thread: it counts as empty)
    await memory.summaries.save(old, Summary(
        "T0", "Top", "merged", ["m0", "m1"], id="sum_top", level=2,
        children=[summary.id, "sum_sibling"],
    ))  # fmt: skip
    for stored in (
        Summary("T0", "Old", "Old text", ["m0"], id=summary.id, level=1, parent="sum_top",
                children=["sum_named", "sum_gone", "sum_moved"]),
        Summary("T0", "Sibling", "m1's", ["m1"], id="sum_sibling", parent="sum_top"),
        Summary("T0", "Named", "m0's", ["m0"], id="sum_named", parent=summary.id),
        Summary("T0", "Gone", "m0's too", ["m0"], id="sum_gone", parent=summary.id),
        Summary("T0", "Moved", "m0's again", ["m0"], id="sum_moved", parent="sum_other"),
    ):  # fmt: skip
        await memory.summaries.store(here, stored)

    await memory.portability.import_records(here, records)

    found = await memory.summaries.get_many(here, ["sum_top", summary.id, "sum_named", "sum_gone", "sum_moved", "sum_sibling"])  # fmt: skip
    assert found["sum_top"].children == (
        [summary.id, "sum_sibling"] if file_parent else ["sum_sibling"]
    )
    assert set(found) == {"sum_top", summary.id, "sum_named", "sum_moved", "sum_sibling"}
    assert (found[summary.id].text, found[summary.id].parent) == ("Due Friday", file_parent)
    if not file_parent:  # forgetting the stored parent leaves the imported summary as it is
        await memory.governance.forget_summary(here, "sum_top")
        imported = (await memory.summaries.get_many(here, [summary.id]))[summary.id]
        assert (imported.text, imported.parent) == ("Due Friday", "")
    await memory.drop_tenant(here)
