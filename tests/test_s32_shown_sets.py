"""The shown-in-logs sets keep only logs that showed their message: an import replacing a
stored log takes it out of the sets of what only the stored version showed
(memory/portability_write.py), and the one-time upgrade (memory/migrate.py
`tidy_shown_in_logs`) takes out the ids of logs gone before deletions trimmed the sets, while a
log written meanwhile keeps its entry. A real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from redis.asyncio import Redis

from memory.connection import connect
from memory.coordination import Upgrades
from memory.keys import place_threads_key, shown_in_logs_key, upgrade_key
from memory.manager import MemoryManager
from memory.migrate import SHOWN_SETS, drop_leftover_shown, tidy_shown_in_logs
from memory.portability_export import dumps
from memory.scope import Scope
from memory.stores.base import decode
from memory.stores.tool_log import ToolLogEntry


def log_id() -> str:
    return f"log_{uuid.uuid4().hex[:12]}"


async def write_log(
    memory, scope: Scope, *shown: str, entry_id: str | None = None, error: str = ""
) -> str:
    """A log in `scope.thread` (under `entry_id`, if given) that showed these messages."""
    entry = ToolLogEntry(
        scope.thread, "search_memory", {"query": "okapi"}, "what was said", "success",
        error=error, message_ids=list(shown),
    )  # fmt: skip
    entry.id = entry_id or entry.id
    return await memory.tool_logs.write(scope, entry)


async def members(memory, tenant: str, shown: str) -> set[str]:
    return {decode(m) for m in await memory.redis.smembers(shown_in_logs_key(tenant, shown))}


async def leak(memory, tenant: str, shown: str) -> str:
    """An id of no log in the set of `shown`, as a deletion before trimming left it."""
    gone = log_id()
    await memory.redis.sadd(shown_in_logs_key(tenant, shown), gone)
    return gone


async def test_an_imported_log_replacing_a_stored_one_leaves_the_sets_only_that_showed(
    memory, tenant
):
    source, here = Scope(tenant, "T1"), Scope(f"t-{uuid.uuid4().hex[:10]}", "T1")
    said = await memory.conversation.append(source, "user", "the okapi grant is due Friday")
    replaced = log_id()
    await write_log(memory, source, said.id, "both", entry_id=replaced)  # the version imported
    records = [json.loads(dumps(r)) async for r in memory.portability.export_tenant(tenant)]
    # the tenant imported into holds a log under that id (no thread: it counts as empty), with
    # a field the imported record lacks
    await write_log(memory, here, "m1", "both", entry_id=replaced, error="it timed out")
    other = await write_log(memory, here, "m1")
    for record in records:
        record.get("tool_log", {}).pop("error", None)

    await memory.portability.import_records(here.tenant, records)

    assert await members(memory, here.tenant, "m1") == {other}  # the stored version's only
    assert await members(memory, here.tenant, said.id) == {replaced}
    assert await members(memory, here.tenant, "both") == {replaced}
    stored = memory.tool_logs.key(here.tenant, replaced)
    assert not await memory.redis.hexists(stored, "error")  # replaced whole, not merged
    assert (await memory.tool_logs.shown(here.tenant, [replaced]))[replaced] == [said.id, "both"]
    assert (await memory.governance.forget_message(here.tenant, "T1", said.id)).tool_logs == 1
    assert not await memory.redis.exists(memory.tool_logs.key(here.tenant, replaced))


async def test_the_upgrade_takes_out_ids_of_logs_gone_and_keeps_live_ones(memory, tenant):
    scope = Scope(tenant, "T1")
    live = await write_log(memory, scope, "m1", "m2")
    await leak(memory, tenant, "m1")
    await leak(memory, tenant, "m3")  # a set no live log is in
    # a set of another kind whose name the pattern matches through a channel's name
    lookalike = place_threads_key(tenant, "}:shown-in-logs:m4")
    await memory.redis.sadd(lookalike, "1234")

    assert await drop_leftover_shown(memory.redis, memory.tool_logs) >= 2

    assert await members(memory, tenant, "m1") == {live}
    assert await members(memory, tenant, "m2") == {live}
    assert not await memory.redis.exists(shown_in_logs_key(tenant, "m3"))
    assert await memory.redis.smembers(lookalike) == {b"1234"}


async def test_the_upgrade_runs_once_at_start_and_again_is_harmless(memory, tenant):
    scope, upgrades = Scope(tenant, "T1"), Upgrades(memory.redis)
    live = await write_log(memory, scope, "m1")
    await leak(memory, tenant, "m1")
    await memory.redis.delete(upgrade_key(SHOWN_SETS))  # as on a Redis before this version

    assert await tidy_shown_in_logs(memory.redis, upgrades, memory.tool_logs) >= 1
    assert await upgrades.done(SHOWN_SETS)
    assert await members(memory, tenant, "m1") == {live}

    later = await write_log(memory, scope, "m1", "m2")  # a log written after
    assert await drop_leftover_shown(memory.redis, memory.tool_logs) == 0  # run again
    assert await tidy_shown_in_logs(memory.redis, upgrades, memory.tool_logs) == 0  # done
    assert await members(memory, tenant, "m1") == {live, later}
    assert await members(memory, tenant, "m2") == {later}


async def test_a_process_starting_runs_the_upgrade(memory, tenant, client):
    live = await write_log(memory, Scope(tenant, "T1"), "m1")
    await leak(memory, tenant, "m1")
    await memory.redis.delete(upgrade_key(SHOWN_SETS))  # as on a Redis before this version

    starting = await MemoryManager(client, memory.embedder).open()  # (the test's connection)
    assert starting.tidying is not None
    assert await starting.tidying >= 1  # run in the background: awaited here

    assert await Upgrades(memory.redis).done(SHOWN_SETS)
    assert await members(memory, tenant, "m1") == {live}


async def test_a_process_finding_the_upgrade_claimed_goes_on_without_it(memory, tenant):
    """Another process runs it: this one neither waits nor records it done."""
    gone = await leak(memory, tenant, "m1")
    await memory.redis.set(upgrade_key(SHOWN_SETS), Upgrades.RUNNING, ex=60)  # its claim
    try:
        assert await tidy_shown_in_logs(memory.redis, memory.upgrades, memory.tool_logs) == 0
        assert decode(await memory.redis.get(upgrade_key(SHOWN_SETS))) == Upgrades.RUNNING
        assert await members(memory, tenant, "m1") == {gone}
    finally:
        await memory.redis.delete(upgrade_key(SHOWN_SETS))


async def test_a_redis_error_midway_releases_the_claim_and_start_up_completes(
    memory, tenant, redis_url, caplog
):
    """A real failure: a Redis user that may not read sets (SMEMBERS refused by its ACL), so
    the sets are found but not read. The step is not done and its claim is freed for the next
    start; the manager opens all the same."""
    user, password = f"nosets-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await memory.redis.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all", "-smembers"
    )
    await leak(memory, tenant, "m1")
    await memory.redis.delete(upgrade_key(SHOWN_SETS))
    server = urlsplit(redis_url)
    refused = await connect(f"redis://{user}:{password}@{server.netloc.split('@')[-1]}", warm=0)
    try:
        starting = await MemoryManager(refused, memory.embedder).open()
        assert starting.tidying is not None
        assert await starting.tidying == 0
        await starting.close()
        assert "shown-in-logs sets were not tidied" in caplog.text
        assert not await memory.redis.exists(upgrade_key(SHOWN_SETS))  # released, not done
    finally:
        await memory.redis.execute_command("ACL", "DELUSER", user)
        await memory.redis.delete(upgrade_key(SHOWN_SETS))  # whatever it was left as


class StalledScan(Redis):
    """A Redis whose SCAN never ends (a keyspace too big to walk before the process stops)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scanning = asyncio.Event()

    async def scan_iter(self, *args, **kwargs) -> AsyncIterator[bytes]:
        self.scanning.set()
        await asyncio.Event().wait()
        yield b""  # never reached: an async generator, as `Redis.scan_iter`


async def test_closing_the_manager_cancels_the_upgrade_and_frees_its_claim(memory, redis_url):
    await memory.redis.delete(upgrade_key(SHOWN_SETS))
    stalled = StalledScan.from_url(redis_url)
    starting = await MemoryManager(stalled, memory.embedder).open()
    await stalled.scanning.wait()  # claimed, and walking the keyspace
    assert decode(await memory.redis.get(upgrade_key(SHOWN_SETS))) == Upgrades.RUNNING

    await starting.close()

    assert starting.tidying is not None and starting.tidying.cancelled()
    assert not await memory.redis.exists(upgrade_key(SHOWN_SETS))  # the next start runs it


async def test_a_log_written_while_the_sets_are_tidied_keeps_its_entry(memory, tenant):
    """The sets read, then a log written under an id read as absent: it is checked as it is
    removed, so it stays."""
    scope = Scope(tenant, "T1")
    gone = await leak(memory, tenant, "m1")
    read = await memory.tool_logs.indexed([(tenant, "m1")])
    assert read == {(tenant, "m1"): [gone]}
    await write_log(memory, scope, "m1", entry_id=gone)  # meanwhile

    assert await memory.tool_logs.drop_absent(read) == 0
    assert await members(memory, tenant, "m1") == {gone}
