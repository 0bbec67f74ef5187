"""Topic watches in a tenant's export and import (memory/portability.py) against the real Redis:
they go out with the tenant (not with one thread), come back into an empty tenant with their
place, filters, creator and posted papers, paused (an export's file may name anyone's channel:
`/watch resume` asks the platform first), and run there once resumed; a malformed watch line is named and nothing is written."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict

import pytest

from bot.watch_commands import WatchCommands
from bot.watch_places import WatchPlace
from memory.keys import watches_due_key
from memory.portability import BadExportLine, TenantNotEmpty
from memory.scope import Scope, Visibility
from memory.stores.watches import DAY, Watch, WatchStore
from tests.test_portability import comparable, export

WEEK = 7 * DAY
POSTED = "2401.00001"


@pytest.fixture
def other() -> str:
    """The empty tenant imported into."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
async def no_watch_left(memory, tenant, other):
    """The due index is every tenant's: a watch left in it here would be due for the bot
    processes of later tests (tests/test_watches_processes.py), and post there."""
    yield
    store = WatchStore(memory.redis)
    for name in (tenant, other):
        for watch in await store.all(name):
            await store.remove(name, watch.id)


def stored(watch: Watch) -> dict:
    """A watch as its tenant's export holds it: everything but the tenant."""
    return {k: v for k, v in asdict(watch).items() if k != "tenant"}


async def due_at(memory, tenant: str, watch_id: str) -> float | None:
    return await memory.redis.zscore(watches_due_key(), f"{tenant}|{watch_id}")


async def two_watches(memory, tenant: str, now: float) -> tuple[Watch, Watch]:
    """An active weekly watch (one digest posted, the next due in 4 days) and a paused daily
    one of a private channel, beside a conversation."""
    store = WatchStore(memory.redis)
    channel = Scope(tenant, f"slack:{tenant}:C1:1.1", channel="C1", user="U1")
    await memory.conversation.append(channel, "user", "watch state-space models weekly")
    active = await store.create(
        channel, "state-space models", WEEK, platform="slack", channel="C1",
        categories=["cs.LG"], authors=["Gu"], now=now - 10 * DAY,
    )  # fmt: skip
    due = await store.claim(active, now - 3 * DAY)
    await store.finish(active, str(due), until=now - 3 * DAY, now=now - 3 * DAY, posted=[POSTED])
    private = Scope(tenant, channel="G7", user="U2", visibility=Visibility.PRIVATE)
    paused = await store.create(
        private, "quokka sleep", DAY, platform="slack", channel="G7", now=now - 2 * DAY
    )
    await store.pause(paused, "paused by U2")
    return await store.get(tenant, active.id), await store.get(tenant, paused.id)


async def test_watches_go_out_with_the_tenant_and_keep_running_after_import(memory, tenant):
    now = time.time()
    active, paused = await two_watches(memory, tenant, now)
    assert active.next_due == int(now - 10 * DAY + 2 * WEEK) and active.since == now - 3 * DAY
    records = await export(memory, tenant)
    watches = [r for r in records if r["kind"] == "watch"]
    assert [r["watch"] for r in watches] == [stored(active), stored(paused)]
    assert watches[0]["posted"] == {POSTED: pytest.approx(now - 3 * DAY)}
    assert watches[1]["watch"]["paused"] == "paused by U2" and watches[1]["posted"] == {}
    thread = await export(memory, tenant, f"slack:{tenant}:C1:1.1")
    assert "watch" not in {r["kind"] for r in thread}  # a thread's export holds no watches

    await memory.drop_tenant(tenant)  # moved: the same tenant, into a new Redis
    assert await due_at(memory, tenant, active.id) is None  # dropped, so off the due index
    counts = await memory.portability.import_records(tenant, records)
    assert counts["watches"] == 2 and counts["paused_watch_imports"] == 1
    store = WatchStore(memory.redis)
    restored = await store.all(tenant)
    # paused, however the file reads (its header may lie): resumed where it posts, once the
    # platform says the channel is the tenant's
    held = f"imported: `/watch resume {active.id}` where it posts"
    assert [stored(w) for w in restored] == [{**stored(active), "paused": held}, stored(paused)]
    assert {w.tenant for w in restored} == {tenant}
    as_held = json.loads(json.dumps(records))
    next(r for r in as_held if r["kind"] == "watch")["watch"]["paused"] = held
    assert comparable(await export(memory, tenant)) == comparable(as_held)

    # listed where they post; neither is due until resumed
    commands = WatchCommands(store, {}, lambda: now)
    here = await commands.list_text(Scope(tenant, channel="C1"), WatchPlace("slack", "C1"))
    assert active.id in here and paused.id not in here and "*paused* (imported" in here
    in_private = await commands.list_text(
        Scope(tenant, channel="G7", visibility=Visibility.PRIVATE), WatchPlace("slack", "G7")
    )
    assert paused.id in in_private and "*paused* (paused by U2)" in in_private
    assert await due_at(memory, tenant, active.id) is None
    assert await due_at(memory, tenant, paused.id) is None
    assert (tenant, active.id) not in await store.due(active.next_due)  # nothing posted
    moved = await store.get(tenant, active.id)
    await store.resume(moved, now)  # as `/watch resume` does, once Slack says C1 is ours
    assert await store.claim(moved, now + 1) == int(now)  # it runs
    assert await store.posted(moved, [POSTED, "2401.99999"]) == {POSTED}  # not posted again


async def test_a_next_due_already_past_posts_nothing_until_resumed(memory, tenant, other):
    now = time.time()
    store = WatchStore(memory.redis)
    made = await store.create(
        Scope(tenant, channel="C1", user="U1"), "quokkas", WEEK, platform="slack",
        channel="C1", now=now - 9 * DAY,
    )  # fmt: skip
    assert made.next_due < now  # its first digest never ran
    records = await export(memory, tenant)
    await memory.drop_tenant(tenant)
    await memory.portability.import_records(tenant, records)
    restored = await store.get(tenant, made.id)
    assert restored.paused and await due_at(memory, tenant, made.id) is None  # nothing at once
    await store.resume(restored, now)
    assert await due_at(memory, tenant, made.id) == int(now)
    assert restored.since == made.since  # the next digest covers everything since


async def test_a_copy_under_another_tenant_name_is_paused(memory, tenant, other):
    """Its channels are the original's, which may still post there, and their slash commands
    look in the original tenant: a copy posts nothing until resumed."""
    now = time.time()
    active, paused = await two_watches(memory, tenant, now)
    await memory.portability.import_records(other, await export(memory, tenant))
    store = WatchStore(memory.redis)
    copied = {w.id: w for w in await store.all(other)}
    assert copied[active.id].paused == f"copied from tenant {tenant} by an import"
    assert copied[paused.id].paused == "paused by U2"
    assert await due_at(memory, other, active.id) is None
    assert await due_at(memory, tenant, active.id) == active.next_due  # the original runs on


async def test_a_clock_ahead_and_impossible_times(memory, tenant, other):
    """A creation time from an exporting clock ahead of ours is taken as now (or the import
    would look like a tenant used since); NaN or infinite times are refused."""
    now = time.time()
    store = WatchStore(memory.redis)
    made = await store.create(Scope(tenant, channel="C1", user="U1"), "quokkas", WEEK,
                              platform="slack", channel="C1", now=now)  # fmt: skip
    records = await export(memory, tenant)
    ahead = json.loads(json.dumps(records))
    next(r for r in ahead if r["kind"] == "watch")["watch"]["created_at"] = now + 120
    await memory.portability.import_records(other, ahead)
    assert (await store.get(other, made.id)).created_at <= time.time()
    for value in (float("nan"), float("inf")):
        broken = json.loads(json.dumps(records))
        next(r for r in broken if r["kind"] == "watch")["watch"]["since"] = value
        third = f"t-{uuid.uuid4().hex[:10]}"
        with pytest.raises(BadExportLine, match="'since' must be a number"):
            await memory.portability.import_records(third, broken)
        assert await store.all(third) == []


def _broken(records: list[dict], how: str) -> list[dict]:
    records = json.loads(json.dumps(records))
    watch = next(r for r in records if r["kind"] == "watch")
    if how == "short period":
        watch["watch"]["period"] = 60
    elif how == "no channel":
        del watch["watch"]["channel"]
    elif how == "unknown platform":
        watch["watch"]["platform"] = "irc"
    elif how == "id with a bar":
        watch["watch"]["id"] = "a|b"
    elif how == "categories not a list":
        watch["watch"]["categories"] = "cs.LG"
    elif how == "nothing to watch":
        watch["watch"].update(query="", categories=[], authors=[])
    elif how == "next_due not whole":
        watch["watch"]["next_due"] = "soon"
    elif how == "posted not times":
        watch["posted"] = {POSTED: "yesterday"}
    elif how == "watch twice":
        records.append(watch)
    else:
        raise AssertionError(how)
    return records


@pytest.mark.parametrize(
    ("how", "why"),
    [("short period", "period must be a whole number of seconds, at least 3600"),
     ("no channel", "needs a platform (slack, discord, terminal) and a channel"),
     ("unknown platform", "needs a platform"), ("id with a bar", "watch id holds one of"),
     ("categories not a list", "'categories' must be a list of strings"),
     ("nothing to watch", "needs a topic, a category or an author"),
     ("next_due not whole", "'next_due' must be a whole number"),
     ("posted not times", "'posted' must be an object of arXiv ids and times"),
     ("watch twice", "appears twice")],
)  # fmt: skip
async def test_a_malformed_watch_is_named_and_nothing_is_written(memory, tenant, other, how, why):
    now = time.time()
    active, _ = await two_watches(memory, tenant, now)
    records = _broken(await export(memory, tenant), how)
    lines = [i for i, r in enumerate(records, 1) if r["kind"] == "watch"]
    line = lines[-1] if how == "watch twice" else lines[0]
    with pytest.raises(BadExportLine) as refused:
        await memory.portability.import_records(other, records)
    assert refused.value.line_no == line
    assert why in str(refused.value) and "Nothing was imported" in str(refused.value)
    assert await memory.portability.is_empty(other)
    assert await WatchStore(memory.redis).all(other) == []
    assert await due_at(memory, other, active.id) is None


async def test_a_tenant_that_holds_a_watch_is_not_empty(memory, tenant, other):
    await two_watches(memory, tenant, time.time())
    records = await export(memory, tenant)
    await WatchStore(memory.redis).create(
        Scope(other, channel="C9", user="U9"), "walruses", DAY, platform="slack", channel="C9"
    )
    with pytest.raises(TenantNotEmpty):
        await memory.portability.import_records(other, records)
    assert [w.query for w in await WatchStore(memory.redis).all(other)] == ["walruses"]
