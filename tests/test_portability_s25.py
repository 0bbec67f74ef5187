"""Export and import after review (memory/portability*.py, the memory page's transfer.py), on
the real Redis and MiniLM: a message or record the stores could not read back is refused; a
Discord thread keeps its channel; a file cut short is refused (an older version's without an
end line still imports); the import's lock is kept while it embeds, and an import that lost it
stops without touching what another wrote (also one that fails before its keeper noticed);
a turn's workflow key moves to the importing tenant;
a member's thread export leaves the summarized-prefix counter out; a page import that fails
while it writes says what the tenant holds. After a second review: a tool log's input of any
JSON imports, a version 1 summary's extra fields are dropped, a turn's workflow in a third
tenant is not kept, and a file whose end line counts other lines is refused."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest

from adapters.memory_page.transfer import visible
from adapters.memory_page.viewer import Viewer
from memory.governance_places import DeletedPlace
from memory.keys import (
    import_lock_key,
    import_partial_key,
    import_running_key,
    messages_key,
    papers_key,
    threads_key,
)
from memory.portability import BadExportLine, ImportLost, Portability, dumps
from memory.scope import Scope, Visibility
from tests.test_memory_page_powers import Known, flash_after, import_form, sign_in, site
from tests.test_memory_stores import add_memgpt
from tests.test_portability import PUBLIC_THREAD, export, places, populate

SHORT_LOCK_MS = 6000  # the keeper renews it every 2 s: a stalled event loop does not lapse it


@pytest.fixture
def other() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def lines_of(records: list[dict]) -> list[str]:
    return [dumps(r) + "\n" for r in records]


async def import_file(memory, tenant: str, lines: list[str]) -> dict[str, int]:
    return await memory.portability.import_lines(tenant, lambda: iter(lines))


# -- 1. only what the stores read back ---------------------------------------------------------


def _unreadable(records: list[dict], how: str) -> tuple[list[dict], int, str]:
    records = json.loads(json.dumps(records))
    at = {kind: next(i for i, r in enumerate(records) if r["kind"] == kind)
          for kind in ("message", "summary", "tool_log")}  # fmt: skip
    if how == "message with reactions":
        records[at["message"]]["message"]["reactions"] = []
        return records, at["message"] + 1, "does not have: 'reactions'"
    if how == "message seq as text":
        records[at["message"]]["message"]["seq"] = "3"
        return records, at["message"] + 1, "'seq' must be a whole number"
    if how == "summary time as text":
        records[at["summary"]]["summary"]["created_at"] = "yesterday"
        return records, at["summary"] + 1, "'created_at' must be a number"
    if how == "tool log without its output":
        del records[at["tool_log"]]["tool_log"]["output"]
        return records, at["tool_log"] + 1, "has no 'output'"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    ["message with reactions", "message seq as text", "summary time as text",
     "tool log without its output"],
)  # fmt: skip
async def test_a_record_the_stores_cannot_read_is_refused(memory, tenant, other, how):
    await populate(memory, tenant)
    records, line, why = _unreadable(await export(memory, tenant), how)
    with pytest.raises(BadExportLine) as refused:
        await memory.portability.import_records(other, records)
    assert refused.value.line_no == line and why in str(refused.value)
    assert await memory.portability.is_empty(other)


# -- 2. a Discord thread's channel ---------------------------------------------------------------


async def test_an_imported_discord_thread_goes_with_its_channel(memory):
    server = str(uuid.uuid4().int % 10**18)
    channel, child = "100", "201"
    thread = f"discord:{server}:{child}"
    scope = Scope(server, thread, channel=child, user="U1")
    try:
        await memory.conversation.append(scope, "user", "The walrus plan, in a thread.")
        await memory.governance.places.note_thread(server, channel, child)
        records = await export(memory, server)
        line = next(r for r in records if r["kind"] == "thread")
        assert line["parent"] == channel
        await memory.drop_tenant(server)
        await import_file(memory, server, lines_of(records))  # under its own name

        await memory.governance.forget_place(DeletedPlace(server, "discord", channel))
        assert await memory.conversation.all(scope, forgotten=True) == []
    finally:
        await memory.drop_tenant(server)


# -- 3. a file cut short -------------------------------------------------------------------------


async def test_a_file_cut_short_is_refused_but_an_older_one_imports(memory, tenant, other):
    await populate(memory, tenant)
    records = await export(memory, tenant)
    end = records[-1]
    assert end["kind"] == "end" and end["counts"]["messages"] == 10
    lines = lines_of(records)
    for cut in (1, 6):  # the end line lost, or more, at a line's end
        with pytest.raises(BadExportLine, match="looks cut short") as refused:
            await import_file(memory, other, lines[:-cut])
        assert refused.value.line_no == len(lines) - cut + 1
        assert await memory.portability.is_empty(other)
    with pytest.raises(BadExportLine, match="after the export's end line"):
        joined = {"kind": "thread", "thread": "slack:T1:C2:300.3", "last_active": 1.0}
        await import_file(memory, other, lines + lines_of([joined]))
    assert await memory.portability.is_empty(other)

    # a version 1 file (no end line, no parent) still imports
    older = [{**records[0], "version": 1}, *records[1:-1]]
    counts = await import_file(memory, other, lines_of(older))
    assert counts["messages"] == 10 and "end" not in counts


# -- 4. the import's lock ------------------------------------------------------------------------


def finish_write(tenant: str) -> bytes:
    """The papers hash's write, the last of an import (`Writer.finish`), as it goes to Redis."""
    key = papers_key(tenant)
    return f"HSET\r\n${len(key)}\r\n{key}".encode()


async def test_the_import_lock_is_kept_while_it_writes(memory, gated, tenant, other):
    through_gate, gate = gated
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    portability = Portability(through_gate, lock_ttl_ms=SHORT_LOCK_MS)
    gate.hold(finish_write(other))
    running = asyncio.create_task(portability.import_records(other, records))
    try:
        await gate.held.wait()  # its last write: the lock is renewed meanwhile all the same
        first = await memory.redis.pttl(import_lock_key(other))
        await asyncio.wait_for(renewed(memory, import_lock_key(other), first), 30)
        gate.release.set()
        counts = await running
    finally:
        gate.release.set()
        await asyncio.gather(running, return_exceptions=True)
    assert counts["papers"] == 1
    assert await memory.redis.get(import_lock_key(other)) is None
    assert not await memory.redis.exists(import_partial_key(other))
    await memory.drop_tenant(other)


async def renewed(memory, key: str, first: int) -> None:
    """Until the key's time to live dropped below `first` (milliseconds), then grew again: it
    was renewed (`first` may have been read right at a renewal, at the whole lifetime)."""
    low = first
    while (now := await memory.redis.pttl(key)) >= low:
        await asyncio.sleep(0.05)
    low = now
    while (now := await memory.redis.pttl(key)) <= low:
        low = min(low, now)
        await asyncio.sleep(0.05)


async def said(caplog, text: str) -> None:
    while not any(text in r.getMessage() for r in caplog.records):
        await asyncio.sleep(0.05)


async def test_an_import_that_lost_its_lock_stops_and_keeps_the_others(memory, gated, tenant,
                                                                      other, caplog):  # fmt: skip
    """Its lock lapsed and another import took the tenant over (its own lock and marker): this
    one stops, and clears nothing nor the other's marker."""
    caplog.set_level(logging.WARNING, logger="memory.portability")
    through_gate, gate = gated
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    portability = Portability(through_gate, lock_ttl_ms=SHORT_LOCK_MS)
    gate.hold(finish_write(other))
    running = asyncio.create_task(portability.import_records(other, records))
    try:
        await gate.held.wait()
        await memory.redis.set(import_lock_key(other), "the-other-import")
        await memory.redis.set(import_partial_key(other), "1234.5")
        await asyncio.wait_for(said(caplog, "was lost"), 30)  # its keeper's next renewal
        gate.release.set()
        with pytest.raises(ImportLost, match="lost its lock"):
            await running
    finally:
        gate.release.set()
        await asyncio.gather(running, return_exceptions=True)
    assert await memory.redis.get(import_partial_key(other)) == b"1234.5"
    assert await memory.redis.get(import_lock_key(other)) == b"the-other-import"
    assert not await memory.redis.exists(import_running_key(other))
    assert not await memory.portability.is_empty(other)  # nothing cleared under the other
    await memory.redis.delete(import_lock_key(other))
    await memory.drop_tenant(other)


def message_write(tenant: str) -> bytes:
    """The first write of a thread's messages, as it goes to Redis."""
    key = messages_key(tenant, PUBLIC_THREAD)
    return f"RPUSH\r\n${len(key)}\r\n{key}".encode()


async def test_an_import_failing_after_its_lock_lapsed_clears_nothing(memory, gated, tenant,
                                                                     other):  # fmt: skip
    """Its lock lapsed and another import took the tenant over and wrote, then this one fails
    before its keeper's next beat (a long lock: it renews once in minutes): it checks the lock
    before clearing, stops (`ImportLost`) and leaves the other's writes."""
    through_gate, gate = gated
    await populate(memory, tenant)
    records = await export(memory, tenant)
    portability = Portability(through_gate, lock_ttl_ms=600_000)
    gate.hold(message_write(other))
    running = asyncio.create_task(portability.import_records(other, records))
    try:
        await gate.held.wait()
        await memory.redis.set(import_lock_key(other), "the-other-import")
        await memory.redis.set(import_partial_key(other), "1234.5")
        await memory.redis.zadd(threads_key(other), {"theirs": 1000.0})
        await memory.redis.set(messages_key(other, PUBLIC_THREAD), "theirs")  # ours fails
        gate.release.set()
        with pytest.raises(ImportLost, match="lost its lock"):
            await running
    finally:
        gate.release.set()
        await asyncio.gather(running, return_exceptions=True)
    assert await memory.redis.zscore(threads_key(other), "theirs") == 1000.0
    assert await memory.redis.get(messages_key(other, PUBLIC_THREAD)) == b"theirs"
    assert await memory.redis.get(import_partial_key(other)) == b"1234.5"
    assert await memory.redis.get(import_lock_key(other)) == b"the-other-import"
    assert not await memory.redis.exists(import_running_key(other))
    await memory.redis.delete(import_lock_key(other))
    await memory.drop_tenant(other)


# -- 5. a turn's workflow ------------------------------------------------------------------------


async def test_a_turn_s_workflow_key_moves_to_the_importing_tenant(memory, tenant, other):
    await populate(memory, tenant)
    workflows = memory.workflows
    [workflow_id] = [r["id"] for r in await export(memory, tenant) if r["kind"] == "workflow"]
    assert await memory.turn_records.set_workflow(tenant, "turn-1", workflows.key_of(tenant,
                                                                                     workflow_id))  # fmt: skip
    await memory.portability.import_records(other, await export(memory, tenant))
    turn = await memory.turn_records.get(other, "turn-1")
    assert turn.workflow == workflows.key_of(other, workflow_id)
    assert await memory.redis.exists(turn.workflow)
    await memory.drop_tenant(other)


# -- 6. a member's thread export -----------------------------------------------------------------


async def test_a_member_s_thread_export_leaves_the_counter_out(memory, tenant, other):
    public, _ = places(tenant)
    await populate(memory, tenant)
    walled = Scope(tenant, PUBLIC_THREAD, channel="C1", user="U7", user_name="wally",
                   visibility=Visibility.PUBLIC, walled=True)  # fmt: skip
    await memory.conversation.append(walled, "user", "A walled aside about narwhals.")
    member = Viewer(tenant, "U1", "slack")
    records = [
        json.loads(dumps(r))
        async for r in visible(memory.portability.export_thread(tenant, PUBLIC_THREAD), member)
    ]
    thread_line = next(r for r in records if r["kind"] == "thread")
    assert "summarized" not in thread_line
    kept = sum(r["kind"] == "message" for r in records)
    assert "narwhals" not in json.dumps(records) and records[-1]["counts"]["messages"] == kept

    await import_file(memory, other, lines_of(records))
    public_b, _ = places(other)
    mine = [m.content for m in await memory.conversation.unsummarized(public)]
    assert [m.content for m in await memory.conversation.unsummarized(public_b)] == [
        c for c in mine if "narwhals" not in c
    ]
    stored = [json.loads(r) for r in await memory.redis.lrange(messages_key(other, PUBLIC_THREAD),
                                                               0, -1)]  # fmt: skip
    assert [m["seq"] for m in stored] == list(range(len(stored)))
    await memory.drop_tenant(other)


# -- 7. a page import that fails while it writes ------------------------------------------------


async def test_a_page_import_that_fails_midway_says_the_tenant_is_as_before(memory, tenant,
                                                                          other):  # fmt: skip
    await populate(memory, tenant)
    content = "".join(lines_of(await export(memory, tenant))).encode()
    await memory.redis.set(messages_key(other, PUBLIC_THREAD), "not a list")  # writes fail
    admin = Viewer(other, "U1", "slack", admin=True, name="ada")
    async with site(memory, Known(admin)) as (client, links):
        csrf = await sign_in(client, links, other, "U1", "slack")
        response = await client.post("/memory/import", data=import_form(csrf, content),
                                     allow_redirects=False)  # fmt: skip
        said = await flash_after(client, response)
    assert "failed while it wrote" in said and "the tenant is as it was before" in said
    assert await memory.portability.is_empty(other)
    assert not await memory.redis.exists(import_partial_key(other))
    assert not await memory.redis.exists(import_running_key(other))
    await memory.drop_tenant(other)


# -- 8. what the stores write imports (fixes after a second review) ------------------------------


@pytest.mark.parametrize("tool_input", [["quokka", 2], 3, None, True])
async def test_a_tool_log_s_input_of_any_json_imports(memory, tenant, other, tool_input):
    """A tool's input is the model's JSON arguments as parsed (bot/harness.py): any value."""
    await populate(memory, tenant)
    records = await export(memory, tenant)
    log_line = next(r for r in records if r["kind"] == "tool_log")
    log_line["tool_log"]["tool_input"] = tool_input
    await import_file(memory, other, lines_of(records))
    [entry] = (await memory.tool_logs.get_many(other, [log_line["tool_log"]["id"]])).values()
    assert entry.tool_input == tool_input
    await memory.drop_tenant(other)


async def test_a_version_1_summary_s_extra_fields_are_dropped(memory, tenant, other):
    """The first exporter wrote every field of a summary's or tool log's hash; their stores
    skip the ones their type lacks, and so does the import (a message's are refused: above)."""
    await populate(memory, tenant)
    records = await export(memory, tenant)
    older = [{**records[0], "version": 1}, *records[1:-1]]
    summary = next(r for r in older if r["kind"] == "summary")["summary"]
    tool_log = next(r for r in older if r["kind"] == "tool_log")["tool_log"]
    summary["mood"], tool_log["scratch"] = "happy", "left over"
    await import_file(memory, other, lines_of(older))
    assert await memory.redis.hget(memory.summaries.key(other, summary["id"]), "mood") is None
    assert await memory.redis.hget(memory.tool_logs.key(other, tool_log["id"]), "scratch") is None
    assert (await memory.summaries.get_many(other, [summary["id"]]))[summary["id"]].text
    await memory.drop_tenant(other)


# -- 9. a turn's workflow key of a third tenant --------------------------------------------------


async def test_a_turn_s_workflow_of_another_tenant_is_not_kept(memory, tenant, other):
    """A crafted file naming a third tenant's workflow: the imported turn has none (a 👎 on it
    would have rejected the third tenant's workflow); a workflow that is not text is refused."""
    third = f"t-{uuid.uuid4().hex[:10]}"
    await populate(memory, tenant)
    await populate(memory, third)
    [workflow_id] = [r["id"] for r in await export(memory, third) if r["kind"] == "workflow"]
    records = await export(memory, tenant)
    turn = next(r for r in records if r["kind"] == "turn")
    for workflow in (None, 7):
        turn["turn"]["workflow"] = workflow
        with pytest.raises(BadExportLine, match="'workflow' must be a string"):
            await import_file(memory, other, lines_of(records))
    turn["turn"]["workflow"] = memory.workflows.key_of(third, workflow_id)
    await import_file(memory, other, lines_of(records))
    assert (await memory.turn_records.get(other, turn["turn"]["id"])).workflow == ""
    await memory.drop_tenant(other)
    await memory.drop_tenant(third)


# -- 10. the end line's counts -------------------------------------------------------------------


async def test_a_file_with_lines_missing_in_the_middle_is_refused(memory, tenant, other):
    await populate(memory, tenant)
    records = await export(memory, tenant)
    at = next(i for i, r in enumerate(records) if r["kind"] == "message")
    lines = lines_of(records)
    broken = lines[:at] + lines[at + 1 :]  # a message's line lost
    with pytest.raises(BadExportLine, match="missing from the middle") as refused:
        await import_file(memory, other, broken)
    assert refused.value.line_no == len(broken)  # the end line
    assert await memory.portability.is_empty(other)
