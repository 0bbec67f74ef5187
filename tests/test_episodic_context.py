"""Nothing said is forgotten: the context of a turn, past the recent window, and `eval locomo`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
import redis

from bot.upkeep import BACKFILL
from memory.connection import connect
from memory.context import CONVERSATION_DERIVED, assemble_context
from memory.keys import messages_key, threads_key
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope, Visibility
from memory.stores.episodic import SEP
from memory.tokens import count_tokens
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import text

FILLER = "Let us keep going with the reading list for the seminar, paper by paper."


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path, memory_tokens=1200)
    yield world
    await close_world(world)


def speaker(tenant: str, thread: str, user: str, name: str) -> Scope:
    return Scope(tenant, thread, "C1", Visibility.PUBLIC, user, name)


async def say(world, scope: Scope, content: str) -> None:
    """A message stored and queued as after a turn (indexing, rolling summary)."""
    memory, upkeep = world.runtime.memory, world.runtime.harness.upkeep
    message = await memory.conversation.append(scope, "user", content)
    window = count_tokens(
        "\n\n".join(
            f"[{m.speaker}] {m.content}" for m in await memory.conversation.unsummarized(scope)
        ),
        memory.model,
    )
    await upkeep.after_messages(scope, [message], window)


async def test_old_messages_of_this_and_other_threads_are_recalled(world, tenant):
    ada = speaker(tenant, "slack:T:C1:1.0", "U1", "Ada")
    bo = speaker(tenant, "slack:T:C1:1.0", "U2", "Bo")
    await say(world, ada, "Decision: we evaluate the retriever with nDCG@10 on BEIR, not MRR.")
    for i in range(40):  # push the decision far out of the recent window
        await say(world, bo if i % 2 else ada, f"{FILLER} ({i})")
    other = speaker(tenant, "slack:T:C2:9.0", "U3", "Cy")
    await say(world, other, "The GPU quota for the lab was raised to 64 A100s in October.")
    await world.runtime.harness.drain()

    limits = world.runtime.harness.limits
    question = "Which metric did we decide for the retriever, and how many GPUs does the lab have?"
    context = await assemble_context(world.runtime.memory, ada, question, limits)
    conversation, episodic = context.segment("Conversation"), context.segment("Episodic")
    assert "nDCG@10" not in conversation.text  # out of the window...
    assert "nDCG@10" in episodic.text  # ...but recalled, with who said it
    assert "Ada" in episodic.text and "64 A100s" in episodic.text and "Cy" in episodic.text
    assert conversation.text.count("[Bo]") and conversation.text.count("[Ada]")  # speakers
    assert episodic.text.startswith("## Episodic Memory\nWhat it is: ")
    shown = [m for m in await world.runtime.memory.conversation.unsummarized(ada)]
    for message in shown:  # nothing the window shows is recalled again
        assert message.content not in episodic.text
    derived = sum(s.tokens for s in context.segments if s.name in CONVERSATION_DERIVED)
    assert derived <= limits.memory_tokens == 1200
    for segment in context.segments:  # counts stay exact
        assert segment.tokens == count_tokens(segment.text, world.runtime.memory.model)


async def test_a_turn_indexes_its_messages_and_the_agent_sees_them_later(world, tenant):
    first = Scope(tenant, "cli:a", "terminal", user="local", user_name="local")
    world.model.script(text("Noted: the deadline is March 3."), text("It is March 3."))
    await world.agent.run_turn(first, "Remember that the camera-ready deadline is March 3.")
    await world.runtime.harness.drain()
    second = first.in_thread("cli:b")
    await world.agent.run_turn(second, "When is the camera-ready deadline?")
    seen = world.model_requests()[-1]["messages"][1]["content"]
    episodic = seen.split("## Episodic Memory")[1].split("## ")[0]
    assert "camera-ready deadline is March 3" in episodic and "local" in episodic


def locomo_fixture(path) -> None:
    """Two sessions between two people, and questions whose evidence is a turn of each."""
    turns_1 = [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a greyhound named Pixel last week!"},
        {"speaker": "Ben", "dia_id": "D1:2", "text": "Congrats! I am training for the Lisbon marathon."},
        *[{"speaker": "Ana" if i % 2 else "Ben", "dia_id": f"D1:{i}", "text": f"{FILLER} {i}"}
          for i in range(3, 40)],
    ]  # fmt: skip
    turns_2 = [
        {
            "speaker": "Ben",
            "dia_id": "D2:1",
            "text": "I finished the Lisbon marathon in 3 hours 41.",
        },
        {"speaker": "Ana", "dia_id": "D2:2", "text": "Pixel learned to fetch the newspaper."},
    ]
    sample = {
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns_1,
            "session_2_date_time": "10:00 am on 20 June, 2023", "session_2": turns_2,
        },
        "qa": [
            {"question": "What is the name of Ana's dog?", "answer": "Pixel",
             "evidence": ["D1:1"], "category": 4},
            {"question": "Which marathon did Ben train for?", "answer": "Lisbon",
             "evidence": ["D1:2; D2:1"], "category": 1},
            {"question": "Is this adversarial?", "adversarial_answer": "x", "evidence": ["D1:3"],
             "category": 5},
        ],
    }  # fmt: skip
    path.write_text(json.dumps([sample]))


def test_eval_locomo_on_a_small_file(cli_env, tmp_path, redis_url):
    data, dump = tmp_path / "tiny.json", tmp_path / "dump.jsonl"
    locomo_fixture(data)
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "eval", "locomo", "--data", str(data), "--budget",
         "600", "--dump", str(dump), "--json"],
        env=cli_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the JSON alone (`| jq`)
    assert (report["recall"], report["budget"]) == (1.0, 600), result.stdout
    assert report["questions"] == 2 and set(report["recall_by_category"]) == {
        "1 multi-hop", "4 single-hop"}  # fmt: skip
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [r["evidence"] for r in rows] == [["D1:1"], ["D1:2", "D2:1"]]
    assert "Pixel" in rows[0]["text"] and "Lisbon marathon in 3 hours 41" in rows[1]["text"]
    assert max(r["tokens"] for r in rows) <= 600
    # the run's own task stream (a bot sharing this Redis never takes its tasks) is gone
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.keys("arxivscout:{eval-*") == []
    finally:
        client.close()


async def test_threads_stored_before_are_backfilled_once(tmp_path, tenant):
    """Messages written before episodic memory existed (old JSON: no audience, no seq) are
    indexed when a bot first starts on the upgraded code, keeping DMs private."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    url = server.ensure_running()
    try:
        client = await connect(url)
        for thread, words in (("slack:T:C1:1.0", "the cryostat arrives Tuesday"),
                              ("slack:T:D1:dm", "my visa interview is Friday")):  # fmt: skip
            old = {"role": "user", "content": words, "id": f"msg_{thread[-3:]}",
                   "thread_id": thread, "timestamp": 1.7e9, "metadata": {}, "summary_id": ""}  # fmt: skip
            await client.rpush(messages_key(tenant, thread), json.dumps(old))
            await client.zadd(threads_key(tenant), {thread: 1.7e9})
        await client.aclose()
        world = await open_world(url, tmp_path)
        try:
            await world.runtime.harness.drain()
            memory = world.runtime.memory
            assert await memory.upgrades.done(BACKFILL)
            assert await world.runtime.harness.upkeep.backfill() == 0  # once only
            channel = Scope(tenant, "slack:T:C1:2.0", "C1", Visibility.PRIVATE)
            dm = Scope(tenant, "slack:T:D1:dm", "D1", Visibility.DM)
            elsewhere = Scope(tenant, "slack:T:C7:3.0", "C7")
            for scope, expected in ((channel, {"cryostat"}), (dm, {"visa"}),
                                    (elsewhere, set())):  # fmt: skip
                found = set()
                for word in ("cryostat", "visa"):
                    vector = (await memory.embedder.embed([word]))[0]
                    hits = await memory.episodes.search(scope, word, vector, k=5)
                    found |= {word for e in hits if word in e.text}
                assert found == expected, scope
        finally:
            await close_world(world)
    finally:
        server.stop()


async def test_a_reply_indexed_before_the_message_it_follows_does_not_open_a_conversation(
    world, tenant
):
    """Background workers index messages in any order: whether a message opens a conversation
    (said long after the one before) is read from the thread, not from what is indexed yet."""
    memory, upkeep = world.runtime.memory, world.runtime.harness.upkeep
    ada = speaker(tenant, "slack:T:C1:2.0", "U1", "Ada")
    first = await memory.conversation.append(ada, "user", "Shall we try LoRA rank 8?", 1000.0)
    reply = await memory.conversation.append(ada, "user", "Yes, rank 8 it is.", 1060.0)
    later = await memory.conversation.append(ada, "user", "Back from holiday.", 1060.0 + 86400)
    task = {"scope": ada.to_dict(), "messages": [asdict(reply), asdict(later)]}
    await upkeep.index_episodes([task])  # `first` is not indexed yet

    metas = [
        await memory.redis.hget(memory.episodes.key(tenant, m.id), "meta") for m in (reply, later)
    ]
    opens = ["o" in (m.decode() if isinstance(m, bytes) else m).split(SEP)[2] for m in metas]
    assert opens == [False, True]
    assert first.seq == 0
