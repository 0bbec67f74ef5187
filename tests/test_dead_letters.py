"""`arxivscout tasks dead|requeue` against the real Redis: dead letters listed with their
credentials redacted, requeued (one, all of a kind) as fresh tasks that a consumer runs, and a
requeue that moves its dead letter in one atomic step (never lost, never doubled)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from redis.crc import key_slot

from app import cli
from bot.background import BackgroundWork
from memory.dead_letters import REGISTRY_UPGRADE, dead_letter_streams, dead_letters, requeue
from memory.keys import task_stream, task_stream_name, upgrade_key
from memory.tasks import TaskStream
from tests.support.task_deliveries import payload_deliveries
from tests.test_cli_memory import arxivscout

RESPONSE_URL = "https://hooks.slack.com/commands/T0001/1234/s3cr3tToken"


@pytest.fixture
async def stream(client):
    """A task stream of the deployment's own naming (found by `tasks dead`), removed after."""
    name = f"dlq-{uuid.uuid4().hex[:10]}"
    stream = TaskStream(client, task_stream(name))
    yield stream
    await stream.destroy()


async def dead_lettered(stream: TaskStream, tasks: list[tuple[str, dict]]) -> None:
    """Run `tasks` through a consumer whose handlers always fail: each is dead-lettered."""

    async def fail(payloads: list[dict]) -> None:
        raise ValueError(f"boom {len(payloads)}")

    work = BackgroundWork(
        TaskStream(stream.redis, stream.stream, consumer="failing"),
        {kind: fail for kind, _ in tasks},
        max_deliveries=1, claim_idle_ms=200, block_ms=100,
    )  # fmt: skip
    with work.foreground():  # one read, then batches of one kind
        for kind, payload in tasks:
            await work.submit(kind, payload)
    async with asyncio.timeout(10):
        await work.drain()
    await work.close()


async def test_dead_letters_are_listed_redacted_and_requeued_one_or_all_of_a_kind(
    client, stream, capsys
):
    await dead_lettered(stream, [
        ("index", {"n": 1, "reply": {"response_url": RESPONSE_URL}}),
        ("index", {"n": 2, "note": f"posted to {RESPONSE_URL}"}),
        ("index", {"n": 3}),
        ("summary", {"n": 4}),
    ])  # fmt: skip
    name = task_stream_name(stream.stream)
    code, out, _ = await arxivscout(capsys, "tasks", "dead", "--stream", name)
    assert code == 0 and out.count(f"{name}/") == 4
    assert "index" in out and "summary" in out and "ValueError: boom" in out
    assert "1 delivery" in out and "[redacted]" in out
    assert "s3cr3t" not in out and "hooks.slack.com" not in out

    code, out, _ = await arxivscout(capsys, "tasks", "dead", "--stream", name, "--json")
    listed = sorted(json.loads(out), key=lambda row: row["payload"]["n"])  # batches race
    assert code == 0 and [row["kind"] for row in listed] == ["index"] * 3 + ["summary"]
    assert listed[0]["payload"] == {"n": 1, "reply": {"response_url": "[redacted]"}}
    assert listed[1]["payload"] == {"n": 2, "note": "posted to [redacted]"}
    assert all(row["deliveries"] == 1 and row["error"].startswith("ValueError") for row in listed)

    # one, by its id
    code, out, _ = await arxivscout(capsys, "tasks", "requeue", listed[0]["id"])
    assert code == 0 and "1 requeued." in out
    code, _, err = await arxivscout(capsys, "tasks", "requeue", listed[0]["id"])
    assert code == 2 and "No dead letter" in err  # gone from the dead letters: not twice
    # all of a kind
    code, out, _ = await arxivscout(
        capsys, "tasks", "requeue", "--all", "--stream", name, "--kind", "index"
    )
    assert code == 0 and "2 requeued." in out
    assert await stream.pending_count() == 3
    [left] = await dead_letters(stream)  # the dead stream emptied only of those
    assert left.kind == "summary" and left.payload == {"n": 4}

    # a consumer runs them afresh (deliveries from 0: this run is their first) and acks them
    ran: list[tuple[dict, int]] = []

    async def index(payloads: list[dict]) -> None:
        ran.extend([(payload, await payload_deliveries(stream, payload)) for payload in payloads])

    work = BackgroundWork(  # no retry here: claimed only when idle 1.5 s, never as it runs
        TaskStream(client, stream.stream, consumer="fixed"), {"index": index},
        claim_idle_ms=1500, block_ms=100,
    )  # fmt: skip
    work.start()
    async with asyncio.timeout(10):
        await work.drain()
    await work.close()
    assert sorted(p["n"] for p, _ in ran) == [1, 2, 3] and {d for _, d in ran} == {1}
    # the payload itself is requeued whole: only what is shown is redacted
    assert any(p.get("reply") == {"response_url": RESPONSE_URL} for p, _ in ran)
    assert await stream.pending_count() == 0
    assert (await client.xpending(stream.stream, "workers"))["pending"] == 0
    assert [d.kind for d in await dead_letters(stream)] == ["summary"]


async def test_a_requeue_moves_its_dead_letter_in_one_atomic_step(client, stream):
    await dead_lettered(stream, [("index", {"n": 1})])
    [letter] = await dead_letters(stream)
    assert key_slot(stream.stream.encode()) == key_slot(stream.dead_stream.encode())
    async with client.monitor() as monitor:
        requeued = await requeue(stream, letter.id)
        seen = []
        while not any(c["command"].startswith("XDEL") for c in seen):
            seen.append(await monitor.next_command())
    moves = [c for c in seen if c["command"].split(" ", 1)[0] in ("XADD", "XDEL")]
    # added and removed inside one script: nothing can run between them, nor stop after one
    assert [c["command"].split(" ", 1)[0] for c in moves] == ["XADD", "XDEL"]
    assert all(c["client_type"] == "lua" for c in moves)
    assert requeued and await stream.pending_count() == 1 and await dead_letters(stream) == []


async def test_two_requeues_of_one_dead_letter_at_once_queue_it_once(client, stream):
    await dead_lettered(stream, [("index", {"n": 1})])
    [letter] = await dead_letters(stream)
    twice = [TaskStream(client, stream.stream) for _ in range(2)]
    results = await asyncio.gather(*(requeue(s, letter.id) for s in twice))
    assert sorted(r is None for r in results) == [False, True]
    assert await stream.pending_count() == 1 and await dead_letters(stream) == []


def test_requeue_with_neither_ids_nor_all_is_a_usage_error(capsys):
    """Said as argparse says a usage error (the usage, exit status 2), Redis never reached."""
    for args in (["tasks", "requeue"], ["tasks", "requeue", "tasks/1-1", "--all"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(args)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.startswith("usage: arxivscout tasks requeue")
        assert "error: give dead letters' ids (STREAM/ID, as `tasks dead` lists) or --all" in err


async def test_streams_with_dead_letters_are_noted_not_scanned_for_and_older_ones_found_once(
    client, stream
):
    """Erasures look for dead letters at every step (memory/dead_letters.py): the streams that
    have some are noted when a task is given up, not found by scanning every key; those of
    before the note are found once."""
    older = TaskStream(client, task_stream(f"dlq-old-{uuid.uuid4().hex[:10]}"))
    await client.xadd(older.dead_stream, {"id": "0-1", "kind": "index", "payload": "{}"})
    await client.delete(upgrade_key(REGISTRY_UPGRADE))  # as before this version
    try:
        assert older.stream in {s.stream for s in await dead_letter_streams(client)}
        unnoted = TaskStream(client, task_stream(f"dlq-unnoted-{uuid.uuid4().hex[:10]}"))
        await client.xadd(unnoted.dead_stream, {"id": "0-1", "kind": "index", "payload": "{}"})
        await dead_lettered(stream, [("index", {"n": 1})])
        found = {s.stream for s in await dead_letter_streams(client)}
        assert stream.stream in found and older.stream in found
        assert unnoted.stream not in found  # not scanned for again
        await unnoted.destroy()
    finally:
        await older.destroy()
    assert older.stream not in {s.stream for s in await dead_letter_streams(client)}
