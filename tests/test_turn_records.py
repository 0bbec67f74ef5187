"""Turn records, usage and feedback against the real agent (scripted model) and real Redis: what
a turn's record holds, usage summed per turn, thread, tenant and day, a 👎 turn's workflow never
offered again, and `arxivscout memory usage` / `eval feedback`."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from app import cli
from bot.feedback import FAILED, GONE, NOT_HERE, SORRY, THANKS, FeedbackService
from bot.harness import ENTITY_INSTRUCTIONS
from memory.scope import Scope, Visibility
from memory.stores.turn_records import TurnRecord, TurnUsage, Vote, counts, day_of
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.scripted_openai import call, text, tool_calls


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def prompt_words(body: dict) -> int:
    """Prompt tokens as the scripted model counts them: words of every message."""
    return sum(len(str(m.get("content") or "").split()) for m in body["messages"])


def scope_of(tenant: str, thread: str = "t1", user: str = "U1") -> Scope:
    return Scope(tenant, thread, "C1", Visibility.PUBLIC, user, "Ada")


async def test_a_turn_record_holds_the_turn_and_its_usage_per_thread_and_tenant(world, tenant):
    memory, scope = world.runtime.memory, scope_of(tenant)
    world.model.script(
        tool_calls(call("search_knowledge_base", {"query": "virtual context"})),
        text("nothing saved on that yet"),
        text("you are welcome"),
    )
    first = await world.agent.run_turn(scope, "search the knowledge base for virtual context")
    asked = world.model_requests()
    second = await world.agent.run_turn(scope, "thanks a lot")
    await world.runtime.harness.drain()

    record = await memory.turn_records.get(tenant, first.turn_id)
    assert first.turn_id.startswith("turn_")  # no job id: a fresh one
    assert (record.thread, record.asker, record.asker_name) == ("t1", "U1", "Ada")
    assert (record.audience, record.stop_reason) == ("public", "final")
    assert record.question == "search the knowledge base for virtual context"
    assert record.answer == first.answer
    assert record.tools == [
        {"name": "search_knowledge_base", "status": "success", "log_id": first.steps[0].log_id}
    ]
    stored = await memory.conversation.all(scope)
    assert (record.question_id, record.answer_id) == (stored[0].id, stored[1].id)
    assert set(record.memory) == {
        "passages", "episodes", "messages", "summaries", "workflows", "entities"
    }  # fmt: skip
    # usage: what the scripted model reported for the two calls of the loop
    out = (len(json.dumps({"query": "virtual context"}).split()) + 1) + 5
    assert record.usage.model_calls == 2 and record.usage.tool_calls == 1
    assert record.usage.tokens_in == sum(prompt_words(b) for b in asked)
    assert record.usage.tokens_out == out

    later = await memory.turn_records.get(tenant, second.turn_id)
    assert later.memory["messages"] == [stored[0].id, stored[1].id]  # the recent window
    assert (later.usage.model_calls, later.usage.tool_calls, later.usage.tokens_out) == (1, 0, 3)
    both = {
        "tokens_in": record.usage.tokens_in + later.usage.tokens_in,
        "tokens_out": out + 3, "model_calls": 3, "tool_calls": 1, "turns": 2,
    }  # fmt: skip
    assert await memory.turn_records.usage(tenant, "t1") == both
    assert await memory.turn_records.usage(tenant) == both
    assert await memory.turn_records.usage(tenant, day=day_of(time.time())) == both
    assert await memory.turn_records.ids(tenant, "t1") == [second.turn_id, first.turn_id]

    # a re-run of the same turn id writes nothing and counts nothing again
    assert not await memory.turn_records.save(record)
    assert await memory.turn_records.usage(tenant) == both


async def test_a_job_id_names_the_record_and_background_calls_count_to_the_thread(world, tenant):
    memory, scope = world.runtime.memory, scope_of(tenant, "t2")
    world.entities = [{"name": "MemGPT", "type": "system", "description": "pages memory"}]
    world.model.script(text("MemGPT pages memory like an OS."))
    result = await world.agent.run_turn(scope, "what does MemGPT do?", turn_id="job123")
    await world.runtime.harness.drain()  # entity extraction: one more model call
    assert result.turn_id == "job123"
    record = await memory.turn_records.get(tenant, "job123")
    assert record.usage.model_calls == 1
    thread = await memory.turn_records.usage(tenant, "t2")
    assert thread["model_calls"] == 2 and thread["turns"] == 1
    assert thread["tokens_in"] > record.usage.tokens_in
    assert (await memory.turn_records.usage(tenant))["model_calls"] == 2
    [(top, counts)] = await memory.turn_records.top_threads(tenant)
    assert top == "t2" and counts == thread


async def test_votes_replace_each_other_and_a_thumbs_down_workflow_is_never_reused(world, tenant):
    memory, scope = world.runtime.memory, scope_of(tenant)
    feedback = FeedbackService(memory)
    world.model.script(
        tool_calls(call("search_knowledge_base", {"query": "virtual context"})),
        text("nothing saved on that yet"),
    )
    result = await world.agent.run_turn(scope, "search the knowledge base for virtual context")
    await world.runtime.harness.drain()
    record = await memory.turn_records.get(tenant, result.turn_id)
    assert record.workflow  # written in the background, named on the record
    vector = (await memory.embedder.embed(["search the knowledge base for virtual context"]))[0]
    assert len(await memory.workflows.similar(scope, vector)) == 1

    assert await feedback.vote(tenant, result.turn_id, "U2", -1, "Grace") == THANKS
    assert await memory.workflows.similar(scope, vector) == []  # rejected: not offered
    said = await feedback.comment(tenant, result.turn_id, "U2", "it missed the paper", ["source"])
    assert said == SORRY
    assert await feedback.vote(tenant, result.turn_id, "U3", 1) == THANKS
    votes = (await memory.turn_records.get(tenant, result.turn_id)).feedback
    assert (votes["U2"].rating, votes["U2"].comment, votes["U2"].reasons) == (
        -1, "it missed the paper", ["source"]
    )  # fmt: skip
    assert votes["U3"].rating == 1 and votes["U2"].name == "Grace"
    assert await memory.workflows.similar(scope, vector) == []  # one 👎 is enough

    await feedback.vote(tenant, result.turn_id, "U2", 1)  # Grace changes her mind
    votes = (await memory.turn_records.get(tenant, result.turn_id)).feedback
    assert {u: v.rating for u, v in votes.items()} == {"U2": 1, "U3": 1}
    assert len(await memory.workflows.similar(scope, vector)) == 1  # offered again
    assert await feedback.vote(tenant, "turn_nope", "U2", 1) == GONE


async def test_a_thumbs_down_before_the_workflow_is_written_rejects_it(world, tenant):
    memory, scope = world.runtime.memory, scope_of(tenant, "t3")
    world.model.script(text("here is how"))
    result = await world.agent.run_turn(scope, "plain question without tools")
    await world.runtime.harness.drain()
    await FeedbackService(memory).vote(tenant, result.turn_id, "U2", -1)
    question = "plain question without tools"
    task = {"scope": scope.to_dict(), "question": question, "answer": "here is how",
            "steps": ["search_knowledge_base({}) -> success"], "turn": result.turn_id,
            "asked": None}  # fmt: skip
    await world.runtime.harness.write_artifacts([task])  # the background runs after the 👎
    record = await memory.turn_records.get(tenant, result.turn_id)
    assert record.workflow
    assert await memory.redis.hget(record.workflow, "rejected") == b"1"
    vector = (await memory.embedder.embed([question]))[0]
    assert await memory.workflows.similar(scope, vector) == []


async def test_forgetting_a_thread_or_a_person_drops_their_turn_records(world, tenant):
    memory = world.runtime.memory
    world.model.script(text("one"), text("two"), text("three"))
    a = await world.agent.run_turn(scope_of(tenant, "ta", "U1"), "first question")
    b = await world.agent.run_turn(scope_of(tenant, "tb", "U2"), "second question")
    c = await world.agent.run_turn(scope_of(tenant, "tc", "U3"), "third question")
    await world.runtime.harness.drain()
    await FeedbackService(memory).vote(tenant, c.turn_id, "U2", -1, "Grace")
    await memory.governance.forget_thread(tenant, "ta")
    await memory.governance.forget_person(tenant, "U2")
    left = await memory.turn_records.get_many(tenant, [a.turn_id, b.turn_id, c.turn_id])
    assert list(left) == [c.turn_id] and left[c.turn_id].feedback == {}  # her vote went too
    thread = await memory.conversation.all(scope_of(tenant, "tc"))
    await memory.governance.forget_message(tenant, "tc", thread[0].id)
    assert await memory.turn_records.get_many(tenant, [c.turn_id]) == {}


async def arxivscout(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


async def test_memory_usage_and_eval_feedback_commands(world, tenant, capsys, tmp_path):
    memory = world.runtime.memory
    world.model.script(
        tool_calls(call("search_knowledge_base", {"query": "virtual context"})),
        text("nothing saved on that yet"),
        text("fine"),
    )
    first = await world.agent.run_turn(scope_of(tenant, "t1"), "search for virtual context")
    second = await world.agent.run_turn(scope_of(tenant, "t2"), "just chatting")
    await world.runtime.harness.drain()
    service = FeedbackService(memory)
    await service.vote(tenant, first.turn_id, "U2", -1, "Grace")
    await service.comment(tenant, first.turn_id, "U2", "no sources given")
    await service.vote(tenant, second.turn_id, "U1", 1, "Ada")

    code, out, _ = await arxivscout(capsys, "memory", "usage", "--tenant", tenant, "--json")
    data = json.loads(out)
    assert code == 0 and data["total"] == await memory.turn_records.usage(tenant)
    assert data["total"]["model_calls"] == 3 and data["total"]["turns"] == 2
    assert [t["thread"] for t in data["threads"]] == ["t1", "t2"]  # the most tokens first
    code, out, _ = await arxivscout(capsys, "memory", "usage", "--tenant", tenant)
    assert code == 0 and f"Usage of tenant {tenant!r}: " in out and "3 model calls" in out
    assert out.index("  t1") < out.index("  t2")
    code, out, _ = await arxivscout(
        capsys, "memory", "usage", "--tenant", tenant, "--thread", "t2", "--json"
    )
    data = json.loads(out)
    assert [t["thread"] for t in data["threads"]] == ["t2"]
    assert [(t["turn"], t["model_calls"], t["rating"]) for t in data["turns"]] == [
        (second.turn_id, 1, 1)
    ]
    code, out, _ = await arxivscout(capsys, "memory", "usage", "--tenant", tenant, "--thread", "t1")
    [row] = [line for line in out.splitlines() if first.turn_id in line]
    used = (await memory.turn_records.get(tenant, first.turn_id)).usage
    assert code == 0 and row.split()[2:] == [
        f"{used.tokens_in:,}",
        f"{used.tokens_out:,}",
        "2",
        "1",
        "-1",
        first.turn_id,
    ]

    code, out, _ = await arxivscout(capsys, "eval", "feedback", "--tenant", tenant)
    assert code == 0 and "👎  Grace (U2)  t1" in out and "“no sources given”" in out
    assert "👍  Ada (U1)  t2" in out and "Q: search for virtual context" in out
    code, out, _ = await arxivscout(
        capsys, "eval", "feedback", "--tenant", tenant, "--rating", "down", "--json"
    )
    rows = json.loads(out)
    assert [(r["user"], r["rating"], r["comment"]) for r in rows] == [
        ("U2", -1, "no sources given")
    ]
    path = tmp_path / "feedback.jsonl"
    code, _, err = await arxivscout(
        capsys, "eval", "feedback", "--tenant", tenant, "--rating", "down", "-o", str(path)
    )
    [line] = [json.loads(x) for x in path.read_text().splitlines()]
    assert code == 0 and "Exported 1 turn records" in err
    assert line["id"] == first.turn_id and line["answer"] == first.answer
    assert line["tools"][0]["name"] == "search_knowledge_base"
    assert line["usage"]["model_calls"] == 2 and "passages" in line["memory"]
    assert line["feedback"][0]["comment"] == "no sources given"


async def test_the_memory_page_shows_usage_to_admins_and_per_thread(memory, tenant):
    from tests.test_memory_page import get, page_client, seed, url

    world = await seed(memory, tenant)
    try:
        record = TurnRecord("job-page", tenant, world.public, "q", "a", audience="public",
                            usage=TurnUsage(12_345, 678, 3, 2))  # fmt: skip
        assert await memory.turn_records.save(record)
        await memory.turn_records.vote(tenant, "job-page", Vote("U2", 1))
        hidden = TurnRecord("job-hidden", tenant, world.public, "q2", "a2",
                            audience="private:G1", usage=TurnUsage(0, 0, 1, 0))  # fmt: skip
        assert await memory.turn_records.save(hidden)
        async with page_client(memory, tenant) as client:
            status, html = await get(client, "/memory", "admin")
            assert status == 200 and "Model usage" in html and "12,345" in html
            status, html = await get(client, "/memory")  # alice is no admin
            assert status == 200 and "12,345" not in html
            status, html = await get(client, url(world.public))
            assert status == 200 and "Model usage" in html
            assert "12,345" in html and "678" in html
            # the per-turn table: only the turns whose audience the viewer may see
            assert "job-page" in html and "job-hidden" not in html and "+1" in html
            status, html = await get(client, url(world.public), "bob")  # sees private:G1
            assert status == 200 and "job-page" in html and "job-hidden" in html
    finally:
        await memory.drop_tenant(tenant)


async def test_the_record_holds_every_passage_shown_and_those_cited(world, tenant):
    """Passages shown by tools (not only the context's) are stored with their numbers, and
    the answer's citations with theirs; a made-up citation is counted as removed."""
    memory, scope = world.runtime.memory, scope_of(tenant, "t4")
    world.model.script(
        tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})),
        tool_calls(call("search_knowledge_base", {"query": "archival store paging"})),
        text("MemGPT pages memory to an archival store [1]. It was tested on Mars [7]."),
    )
    result = await world.agent.run_turn(scope, "how does MemGPT page memory")
    record = await memory.turn_records.get(tenant, result.turn_id)
    assert result.citations_removed == 1
    assert record.citations_removed == 1 and record.answer == result.answer
    assert record.memory["passages"] == []  # the context showed none: the tool did
    assert record.shown and [p["number"] for p in record.shown] == list(
        range(1, len(record.shown) + 1)
    )
    assert all(p["id"].startswith(f"{MEMGPT_ID}#") for p in record.shown)
    [cited] = result.sources
    assert record.cited == [{"number": 1, "id": f"{cited.arxiv_id}#{cited.chunk_index}"}]
    assert record.cited[0]["id"] == record.shown[0]["id"]


async def test_forgetting_uses_the_indexes_and_drops_the_threads_usage(world, tenant):
    """Forgetting a thread takes its records and its usage (the top threads too); forgetting
    a message, a person or by age takes only their records; nothing else is touched."""
    memory = world.runtime.memory
    records = memory.turn_records
    base = time.time() - 1000
    for n, (thread, asker) in enumerate([("ta", "U1"), ("ta", "U2"), ("tb", "U2"), ("tc", "U3")]):
        await records.save(TurnRecord(
            f"r{n}", tenant, thread, f"q{n}", f"a{n}", asker=asker, created_at=base + n * 100,
            question_id=f"mq{n}", answer_id=f"ma{n}", usage=TurnUsage(10, 5, 1, 0),
        ))  # fmt: skip
    await records.vote(tenant, "r3", Vote("U2", -1))
    await records.vote(tenant, "r3", Vote("U1", 1))
    assert sorted(t for t, _ in await records.top_threads(tenant)) == ["ta", "tb", "tc"]

    assert await records.forget_where(tenant, threads=["ta"]) == 2
    assert await records.usage(tenant, "ta") == counts()
    assert sorted(t for t, _ in await records.top_threads(tenant)) == ["tb", "tc"]
    assert await records.ids(tenant) == ["r3", "r2"]
    assert await records.forget_where(tenant, message_ids=["ma3", "nope"]) == 1
    assert await records.ids(tenant) == ["r2"]
    await records.save(TurnRecord("r4", tenant, "tc", "q", "a", asker="U3",
                                  created_at=base + 500))  # fmt: skip
    await records.vote(tenant, "r4", Vote("U2", 1))
    assert await records.forget_where(tenant, asker="U2") == 1  # r2; their vote on r4 goes
    assert (await records.get(tenant, "r4")).feedback == {}
    assert await records.forget_where(tenant, before=base + 500) == 0  # r4 is not older
    assert await records.forget_where(tenant, before=base + 501) == 1
    assert await records.ids(tenant) == []
    left = [k.decode() async for k in memory.redis.scan_iter(f"*{tenant}*turns*")]
    assert left == []  # no index entry of a forgotten record is left


async def test_usage_of_a_thread_forgotten_while_its_entities_are_read_is_not_counted(
    world, tenant
):
    """The thread is forgotten while the background's entity extraction waits for the model:
    its usage is neither kept nor recreated (nor its top-threads entry)."""
    memory, scope = world.runtime.memory, scope_of(tenant, "t5")
    world.entities = [{"name": "MemGPT", "type": "system", "description": "pages memory"}]
    world.hold_entities = asyncio.Event()
    world.model.script(text("MemGPT pages memory like an OS."))
    await world.agent.run_turn(scope, "what does MemGPT do?", turn_id="job-gone")
    assert (await memory.turn_records.usage(tenant, "t5"))["turns"] == 1
    async with asyncio.timeout(10):  # the background is waiting for the entities
        while not any(r["messages"][0]["content"] == ENTITY_INSTRUCTIONS
                      for r in world.model.requests):  # fmt: skip
            await asyncio.sleep(0.01)
    await memory.governance.forget_thread(tenant, "t5")
    assert await memory.turn_records.usage(tenant, "t5") == counts()
    world.hold_entities.set()
    await world.runtime.harness.drain()
    assert await memory.turn_records.usage(tenant, "t5") == counts()
    assert await memory.turn_records.top_threads(tenant) == []
    assert await memory.entities.get(scope, "MemGPT") is None  # discarded too


async def test_feedback_failures_are_messages_and_votes_stay_in_their_channel(world, tenant):
    memory = world.runtime.memory
    await memory.turn_records.save(TurnRecord("r1", tenant, "t6", "q", "a", channel="C1"))
    feedback = FeedbackService(memory)
    assert await feedback.vote("", "r1", "U1", 1) == FAILED  # no team: no tenant
    assert await feedback.comment("bad tenant!", "r1", "U1", "x") == FAILED
    assert await feedback.vote(tenant, "r1", "U1", 1, channel="C2") == NOT_HERE
    assert await feedback.comment(tenant, "r1", "U1", "x", channel="C2") == NOT_HERE
    assert (await memory.turn_records.get(tenant, "r1")).feedback == {}
    assert await feedback.vote(tenant, "r1", "U1", 1, channel="C1") == THANKS


async def test_a_persons_dm_thread_erased_whole_takes_its_usage(world, tenant):
    memory = world.runtime.memory
    dm = Scope(tenant, "dm7", "D7", Visibility.DM, "U7", "Eve")
    world.model.script(text("noted"), text("fine"))
    await world.agent.run_turn(dm, "my secret plan")
    await world.agent.run_turn(scope_of(tenant, "pub", "U1"), "a public question")
    await world.runtime.harness.drain()
    assert (await memory.turn_records.usage(tenant, "dm7"))["turns"] == 1
    erasure = await memory.governance.forget_person(tenant, "U7")
    assert erasure.threads == 1 and erasure.turn_records == 1
    assert await memory.turn_records.usage(tenant, "dm7") == counts()
    assert [t for t, _ in await memory.turn_records.top_threads(tenant)] == ["pub"]
    assert (await memory.turn_records.usage(tenant))["turns"] == 2  # the tenant's total stays
