"""Export and import (memory/portability.py) against the real Redis and MiniLM: a tenant with
every kind of record goes out as JSON Lines and comes back into an empty tenant equal, and
behaves the same there (thread list, recent window, summaries, episodic recall with its
privacy, knowledge-base search, retention); a malformed file or a tenant that holds memory is
refused before anything is written."""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import asdict

import pytest
import redis

from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import Upkeep
from memory.governance import NotFound
from memory.keys import import_partial_key, task_stream, threads_key
from memory.portability import BadExportLine, ImportInterrupted, Left, TenantNotEmpty, dumps
from memory.scope import Scope, Visibility
from memory.stores.conversation import Message
from memory.stores.entity import Entity
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry, UnknownToolLog
from memory.stores.turn_records import TurnRecord, TurnUsage, Vote
from memory.tasks import TaskStream
from tests.test_memory_stores import add_memgpt

PUBLIC_THREAD, DM_THREAD = "slack:T1:C1:100.1", "slack:T1:D9:200.2"


def places(tenant: str) -> tuple[Scope, Scope]:
    public = Scope(tenant, PUBLIC_THREAD, channel="C1", user="U1", user_name="alice")
    dm = Scope(tenant, DM_THREAD, channel="D9", visibility=Visibility.DM, user="U2",
               user_name="bob")  # fmt: skip
    return public, dm


async def index(memory, scope: Scope, messages: list[Message]) -> None:
    """Episodic indexing as the bot does it after a turn (bot/upkeep.py)."""
    stream = TaskStream(memory.redis, task_stream(f"port-{uuid.uuid4().hex[:6]}"))
    upkeep = Upkeep(memory, Consolidator(memory, None), BackgroundWork(stream))
    await upkeep.index_episodes(
        [{"scope": scope.to_dict(), "messages": [asdict(m) for m in messages]}]
    )


async def summarize(memory, scope: Scope, n: int, description: str) -> Summary:
    first, raw = await memory.conversation.unsummarized_snapshot(scope)
    ids = [Message.from_json(r).id for r in raw[:n]]
    summary = Summary(scope.thread, description, f"{description}, in full", ids)
    await memory.summaries.save(scope, summary)
    await memory.conversation.mark_summarized(scope, first, raw[:n], summary.id)
    return summary


async def populate(memory, tenant: str) -> list[Message]:
    """A tenant with every kind of record: two threads (public, DM), summaries merged into one,
    a tool log, a forgotten message, a paper, an entity, a workflow, a retention setting."""
    public, dm = places(tenant)
    start = time.time() - 3 * 86400
    texts = ["Can you find the quokka paper?", "Here is the quokka paper on marsupial memory.",
             "Who wrote it?", "Three authors from Perth.", "Save it please.", "My PIN is zanzibar.",
             "Saved to the knowledge base.", "What does it say about sleep?"]  # fmt: skip
    said = [
        await memory.conversation.append(
            public, "user" if i % 2 == 0 else "assistant", text, timestamp=start + 60 * i
        )
        for i, text in enumerate(texts)
    ]
    private = [
        await memory.conversation.append(dm, "user", "My walrus plan is secret.", timestamp=start),
        await memory.conversation.append(
            dm, "assistant", "Noted, the walrus plan.", timestamp=start + 5
        ),
    ]
    await index(memory, public, said)
    await index(memory, dm, private)
    first = await summarize(memory, public, 2, "finding the quokka paper")
    second = await summarize(memory, public, 2, "who wrote it")
    merged = Summary(public.thread, "the quokka paper", "found, by three authors",
                     first.message_ids + second.message_ids, level=1)  # fmt: skip
    await memory.summaries.merge(public, merged, [first, second])
    await memory.tool_logs.write(public, ToolLogEntry(public.thread, "arxiv_search",
                                                      {"query": "quokka"}, "found 1", "success"))  # fmt: skip
    await memory.governance.forget_message(tenant, public.thread, said[5].id)
    await add_memgpt(memory, tenant)
    await memory.entities.upsert(public, [Entity("Quokka", "animal", "A small marsupial.")])
    await memory.workflows.add(public, "find a paper", ["arxiv_search(quokka)"], "found it")
    await memory.retention.set(tenant, 30)
    await memory.turn_records.save(TurnRecord(
        "turn-1", tenant, public.thread, texts[0], texts[1], audience=public.audience,
        channel=public.channel, asker="U1", created_at=start + 60, question_id=said[0].id,
        answer_id=said[1].id, memory={"passages": ["2310.08560#0"]},
        shown=[{"number": 1, "id": "2310.08560#0"}], cited=[{"number": 1, "id": "2310.08560#0"}],
        usage=TurnUsage(100, 20, 2, 1),
    ))  # fmt: skip
    await memory.turn_records.vote(
        tenant, "turn-1", Vote("U2", -1, "Bob", "wrong paper", ["wrong"], at=start + 120)
    )
    return said


async def export(memory, tenant: str, thread: str | None = None) -> list[dict]:
    portability = memory.portability
    records = (
        portability.export_thread(tenant, thread) if thread else portability.export_tenant(tenant)
    )
    return [json.loads(dumps(r)) async for r in records]  # as a file would hold them


def comparable(records: list[dict]) -> list[dict]:
    """An export without what differs between two tenants' exports: the tenant, the time."""
    header = {k: v for k, v in records[0].items() if k not in ("tenant", "exported_at")}
    return [header, *records[1:]]


@pytest.fixture
def other() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def test_round_trip_is_equal_and_behaves_the_same(memory, tenant, other):
    said = await populate(memory, tenant)
    original = await export(memory, tenant)
    kinds = [r["kind"] for r in original]
    assert kinds[0] == "arxivscout-export" and original[0]["tenant"] == tenant
    for kind in ("retention", "thread", "message", "summary", "tool_log", "paper", "chunk",
                 "entity", "workflow", "turn"):  # fmt: skip
        assert kind in kinds, kind
    tombstone = next(r["message"] for r in original if r["kind"] == "message"
                     and r["message"]["id"] == said[5].id)  # fmt: skip
    assert tombstone["forgotten"] and "zanzibar" not in json.dumps(original)

    counts = await memory.portability.import_records(other, original)
    assert counts["threads"] == 2 and counts["messages"] == 10 and counts["summaries"] == 3
    assert counts["episodes"] == 9  # every message but the tombstone, indexed again
    again = await export(memory, other)
    assert again[0]["tenant"] == other
    assert comparable(again) == comparable(original)

    public, _ = places(tenant)
    public_b, dm_b = places(other)
    conversation = memory.conversation
    assert await conversation.threads(other) == await conversation.threads(tenant)
    assert [m.content for m in await conversation.unsummarized(public_b)] == [
        m.content for m in await conversation.unsummarized(public)
    ]
    assert await memory.summaries.descriptions(public_b) == await memory.summaries.descriptions(
        public
    )
    assert await memory.retention.get(other) == 30
    vector = await memory.embedder.embed_one("the walrus plan")
    found_dm = await memory.episodes.search(dm_b, "walrus plan", vector)
    assert found_dm and found_dm[0].text == "My walrus plan is secret."
    assert found_dm[0].channel == "D9" and found_dm[0].audience == "dm:D9"
    seen_in_public = await memory.episodes.search(public_b, "walrus plan", vector)
    assert all("walrus" not in e.text for e in seen_in_public)  # the DM stays in the DM
    question = "main context and external context"
    passages = await memory.knowledge_base.search(
        public_b, question, await memory.embedder.embed_one(question)
    )
    assert passages and passages[0].arxiv_id == "2310.08560"
    assert [e.name for e in await memory.entities.all(public_b)] == ["Quokka"]
    turn = await memory.turn_records.get(other, "turn-1")  # its indexes and usage too
    assert (turn.tenant, turn.feedback["U2"].comment, turn.cited[0]["number"]) == (
        other, "wrong paper", 1
    )  # fmt: skip
    records = memory.turn_records
    assert await records.usage(other, public_b.thread) == await records.usage(tenant, public.thread)
    assert [r.id for r in await memory.turn_records.with_feedback(other)] == ["turn-1"]
    assert await memory.turn_records.forget_where(other, asker="U1") == 1


async def test_a_thread_exports_alone_and_imports_into_an_empty_tenant(memory, tenant, other):
    await populate(memory, tenant)
    records = await export(memory, tenant, DM_THREAD)
    assert records[0]["thread"] == DM_THREAD
    assert {r["kind"] for r in records[1:]} == {"thread", "message", "end"}
    assert "quokka" not in json.dumps(records).lower()
    await memory.portability.import_records(other, records)
    assert [t for t, _ in await memory.conversation.threads(other)] == [DM_THREAD]
    assert comparable(await export(memory, other, DM_THREAD)) == comparable(records)
    with pytest.raises(NotFound):
        await export(memory, tenant, "slack:T1:C1:no-such-thread")


async def test_a_tenant_that_holds_memory_is_refused(memory, tenant, other):
    await populate(memory, tenant)
    records = await export(memory, tenant)
    public, _ = places(other)
    await memory.conversation.append(public, "user", "I was here first.")
    with pytest.raises(TenantNotEmpty, match="already holds memory"):
        await memory.portability.import_records(other, records)
    assert [m.content for m in await memory.conversation.all(public)] == ["I was here first."]
    assert await memory.knowledge_base.papers(public) == []
    alone = f"t-{uuid.uuid4().hex[:10]}"  # a retention setting is memory too
    await memory.retention.set(alone, 7)
    with pytest.raises(TenantNotEmpty):
        await memory.portability.import_records(alone, records)


def _broken(records: list[dict], how: str) -> tuple[list[dict], int]:
    records = json.loads(json.dumps(records))
    at = {kind: next(i for i, r in enumerate(records) if r["kind"] == kind)
          for kind in ("message", "chunk", "thread")}  # fmt: skip
    if how == "unknown kind":
        records.insert(3, {"kind": "spaceship"})
        return records, 4
    if how == "message before its thread":
        records.insert(1, records[at["message"]])
        return records, 2
    if how == "short vector":
        records[at["chunk"]]["vector"] = base64.b64encode(b"\0" * 12).decode()
        return records, at["chunk"] + 1
    if how == "no header":
        return records[1:], 1
    if how == "newer version":
        records[0]["version"] = 99
        return records, 1
    if how == "thread twice":
        records.append(records[at["thread"]])
        return records, len(records)
    if how == "bad retention":
        records.insert(1, {"kind": "retention", "days": -3})
        return records, 2
    if how == "bad pieces":
        entity = next(i for i, r in enumerate(records) if r["kind"] == "entity")
        records[entity]["fields"]["pieces"] = '[["q1", 3]]'
        return records, entity + 1
    if how == "bad provenance":  # an owner without its authors
        entity = next(i for i, r in enumerate(records) if r["kind"] == "entity")
        records[entity]["fields"]["provenance"] = '{"q1#ab": {"threads": ["t1"]}}'
        return records, entity + 1
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    ["unknown kind", "message before its thread", "short vector", "no header", "newer version",
     "thread twice", "bad retention", "bad pieces", "bad provenance"],
)  # fmt: skip
async def test_a_malformed_line_is_named_and_nothing_is_written(memory, tenant, other, how):
    await populate(memory, tenant)
    records, line = _broken(await export(memory, tenant), how)
    with pytest.raises(BadExportLine) as refused:
        await memory.portability.import_records(other, records)
    assert refused.value.line_no == line and "Nothing was imported" in str(refused.value)
    assert await memory.portability.is_empty(other)


async def test_a_file_is_read_twice_not_held_and_bad_json_is_named(memory, tenant, other, tmp_path):
    public = Scope(tenant, "long", channel="terminal")
    for i in range(1100):  # more than a page of LRANGE, more than a batch of embeddings
        await memory.conversation.append(public, "user" if i % 2 else "assistant",
                                         f"note {i} about topic {i % 7}")  # fmt: skip
    path = tmp_path / "export.jsonl"
    path.write_text("".join(dumps(r) + "\n" for r in await export(memory, tenant)))
    opened = []

    def lines():
        opened.append(1)
        with path.open(encoding="utf-8") as handle:
            yield from handle

    counts = await memory.portability.import_lines(other, lines)
    assert len(opened) == 2 and counts["messages"] == 1100 and counts["episodes"] == 1100
    copied = await memory.conversation.all(Scope(other, "long"))
    assert [m.content for m in copied] == [f"note {i} about topic {i % 7}" for i in range(1100)]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().replace('"kind":"message"', '"kind":"message",', 1))
    third = f"t-{uuid.uuid4().hex[:10]}"
    with pytest.raises(BadExportLine, match="Line 3 of the export: it is not JSON"):
        await memory.portability.import_lines(third, lambda: iter(bad.read_text().splitlines()))
    assert await memory.portability.is_empty(third)


async def test_another_embedding_model_is_embedded_again(memory, tenant, other):
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    records[0]["embeddings"] = {"model": "text-embedding-3-small", "dims": 1536}
    for record in records:
        if "vector" in record:
            record["vector"] = ""  # another model's vectors: not used
    counts = await memory.portability.import_records(other, records)
    assert counts["re-embedded"] == counts["chunks"] > 0
    question = "main context and external context"
    passages = await memory.knowledge_base.search(
        Scope(other), question, await memory.embedder.embed_one(question)
    )
    assert passages and passages[0].arxiv_id == "2310.08560"
    mine = {r["id"]: r["vector"] for r in await export(memory, tenant) if r["kind"] == "chunk"}
    theirs = {r["id"]: r["vector"] for r in await export(memory, other) if r["kind"] == "chunk"}
    assert mine.keys() == theirs.keys()


async def test_an_export_from_before_audiences_is_searchable_by_the_team(memory, tenant, other):
    await add_memgpt(memory, tenant)
    records = await export(memory, tenant)
    stripped = 0
    for record in records:  # as an export written before chunks carried an audience
        if isinstance(record.get("fields"), dict) and "audience" in record["fields"]:
            del record["fields"]["audience"]
            stripped += record["kind"] == "chunk"
    assert stripped > 0
    await memory.portability.import_records(other, records)
    question = "main context and external context"
    passages = await memory.knowledge_base.search(
        Scope(other), question, await memory.embedder.embed_one(question)
    )
    assert passages and passages[0].arxiv_id == "2310.08560"
    assert passages[0].audience == "public"


def failing_file(path, fail_at: int = 12, meanwhile=None):
    """JSON Lines read from `path`, the disk failing at line `fail_at` of the second (writing)
    pass, after `meanwhile()` ran (what else happens to the tenant during the import)."""
    passes = []

    def lines():
        passes.append(1)
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle):
                if len(passes) == 2 and number == fail_at:
                    if meanwhile:
                        meanwhile()
                    raise OSError("I/O error")
                yield line

    return lines


async def test_a_failed_import_clears_what_it_wrote(memory, tenant, other, tmp_path, redis_url):
    await populate(memory, tenant)
    path = tmp_path / "export.jsonl"
    path.write_text("".join(dumps(r) + "\n" for r in await export(memory, tenant)))

    with pytest.raises(ImportInterrupted, match="I/O error") as failed:
        await memory.portability.import_lines(other, failing_file(path))
    assert failed.value.left is Left.CLEARED
    assert not await memory.redis.exists(import_partial_key(other))
    assert await memory.portability.is_empty(other)  # what it wrote is gone at once

    def read():
        with path.open(encoding="utf-8") as handle:
            yield from handle

    await memory.portability.import_lines(other, read)
    assert not await memory.redis.exists(import_partial_key(other))
    assert comparable(await export(memory, other)) == comparable(await export(memory, tenant))

    # used while it ran (a bot answering there): the failed import keeps what is there
    third = f"t-{uuid.uuid4().hex[:10]}"
    with redis.Redis.from_url(redis_url) as live:

        def said_meanwhile() -> None:
            live.zadd(threads_key(third), {"live": time.time() + 1})

        with pytest.raises(ImportInterrupted) as failed:
            await memory.portability.import_lines(third, failing_file(path, 12, said_meanwhile))
    assert failed.value.left is Left.USED
    assert await memory.redis.zscore(threads_key(third), "live")
    with pytest.raises(TenantNotEmpty, match="used after that"):
        await memory.portability.import_lines(third, read)
    assert await memory.redis.zscore(threads_key(third), "live")


async def test_a_crashed_import_is_redone_unless_the_tenant_was_used_since(memory, tenant, other):
    await populate(memory, tenant)
    records = await export(memory, tenant)
    public, _ = places(other)

    async def crash(into: str) -> None:
        """What a process that died mid-import leaves: part of it, and its marker."""
        started = time.time()
        await memory.portability.import_records(into, records[:12])
        await memory.redis.set(import_partial_key(into), repr(started))

    await crash(other)
    await memory.conversation.append(public, "user", "Said after the crash.")
    with pytest.raises(TenantNotEmpty, match=r"stopped on .* used after that") as refused:
        await memory.portability.import_records(other, records)
    assert "Nothing was imported" in str(refused.value)
    said = [m.content for m in await memory.conversation.all(public)]
    assert said[-1] == "Said after the crash."  # not wiped
    assert await memory.redis.exists(import_partial_key(other))

    unused = f"t-{uuid.uuid4().hex[:10]}"
    await crash(unused)
    await memory.portability.import_records(unused, records)  # cleared, then imported whole
    assert not await memory.redis.exists(import_partial_key(unused))
    assert comparable(await export(memory, unused)) == comparable(records)


async def test_an_imported_log_goes_when_a_message_it_showed_is_forgotten(memory, tenant, other):
    """A tool log keeps the messages its output showed; an imported one is indexed by them too."""
    said = await populate(memory, tenant)
    public, _ = places(tenant)
    shown = ToolLogEntry(public.thread, "search_conversations", {"query": "authors"},
                         f"- {said[3].content}", "success", message_ids=[said[3].id])  # fmt: skip
    await memory.tool_logs.write(public, shown)
    await memory.portability.import_records(other, await export(memory, tenant))
    public_b, _ = places(other)
    assert await memory.tool_logs.get(public_b, shown.id)
    erasure = await memory.governance.forget_message(other, public_b.thread, said[3].id)
    assert erasure.tool_logs >= 1
    with pytest.raises(UnknownToolLog):
        await memory.tool_logs.get(public_b, shown.id)
