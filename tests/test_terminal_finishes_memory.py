"""`ask` and `chat` finish the turn's memory writes before they exit (subprocesses, offline).

A terminal runs no worker beside it: what a command left queued (indexing the turn's messages,
its entities) waited for good, and a fact said in one thread reached no other. Now:

- after `ask`, its messages are in episodic memory and its tenant has no task queued;
- a second `ask`, in another thread, sees the first one's fact in its context;
- a piped `chat` finishes its writes too, and exits 1 when every message failed (as `ask`);
- Ctrl-C while the writes run exits at once, the task still queued for the next run;
- a task of another's on the shared stream, failing every run, is not waited for;
- Redis gone once the answer is out: `ask` still exits 0, its writes left queued.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from app.commands.chat_cmd import LEFT_QUEUED
from bot.background import BackgroundWork
from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from bot.upkeep import ARTIFACTS
from memory.keys import task_runs_key, task_stream
from memory.retention import SWEEP
from memory.tasks import Task, TaskStream, payload_tenants
from tests.support.redis_gate import RedisGate
from tests.support.scripted_openai import ScriptedOpenAI, text

FACT = "My advisor is Professor Zanzibar at MIT."
NEVER_MS = 3_600_000  # a claim timeout no test waits for
EXIT_SECONDS = 60.0  # far beyond a clean exit; below the model call a Ctrl-C must not wait for


def knowing_model(body: dict):
    """A stand-in model: says whether the context it got holds the fact."""
    system = body["messages"][0]["content"]
    if system == ENTITY_INSTRUCTIONS:
        return text("[]")
    if system == SUMMARY_INSTRUCTIONS:
        return text(json.dumps({"description": "advisor", "summary": "..."}))
    context = "\n".join(str(m.get("content")) for m in body["messages"])
    return text("Your advisor is Zanzibar." if "Zanzibar" in context else "I do not know.")


@pytest.fixture(scope="module")
def model_url():
    model = ScriptedOpenAI(responder=knowing_model)
    yield model.start_in_thread()
    model.stop()


@pytest.fixture
def env(cli_env, model_url):
    return {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model_url}


def arxivscout(env: dict, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, input=stdin,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


async def queued_for(client, tenant: str) -> list[str]:
    """The kinds of the tasks on the background stream that name `tenant`."""
    entries = await client.xrange(task_stream())
    return [
        fields[b"kind"].decode()
        for _, fields in entries
        if tenant in payload_tenants(json.loads(fields[b"payload"]))
    ]


def episodic(env: dict, tenant: str, thread: str) -> str:
    """The Episodic segment `arxivscout context` shows for the fact, in `thread`."""
    shown = arxivscout(env, "context", "--tenant", tenant, "--thread", thread, "Zanzibar?")
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.partition("Episodic")[2].partition("<!--")[0]


async def test_ask_exits_with_its_turn_in_episodic_memory(env, tenant, client):
    done = arxivscout(env, "ask", "--tenant", tenant, "--thread", "cli:a1", FACT)
    assert done.returncode == 0, done.stderr
    assert await queued_for(client, tenant) == []
    assert "Zanzibar" in episodic(env, tenant, "cli:a3")


def test_a_second_ask_sees_the_first_threads_fact(env, tenant):
    first = arxivscout(env, "ask", "--tenant", tenant, "--thread", "cli:a1", FACT)
    assert first.returncode == 0, first.stderr
    second = arxivscout(env, "ask", "--tenant", tenant, "--thread", "cli:a2", "Who advises me?")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "Your advisor is Zanzibar."


async def test_a_piped_chat_exits_with_its_turns_in_episodic_memory(env, tenant, client):
    done = arxivscout(env, "chat", "--tenant", tenant, "--thread", "cli:c1", stdin=f"{FACT}\n")
    assert done.returncode == 0, done.stderr
    assert await queued_for(client, tenant) == []
    assert "Zanzibar" in episodic(env, tenant, "cli:c2")


def test_a_piped_chat_whose_every_message_failed_exits_1(cli_env, tenant):
    with socket.socket() as free:  # a port nothing listens on: the model is down
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {
        **cli_env,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
    }
    done = arxivscout(env, "chat", "--tenant", tenant, "--thread", "cli:down", stdin="hi\nthere\n")
    assert done.returncode == 1, (done.stdout, done.stderr)


async def test_ctrl_c_while_finishing_exits_and_leaves_the_task_queued(cli_env, tenant, client):
    """The entity extraction hangs; Ctrl-C cuts it short (not waited for) and hands it back."""

    def held(body: dict):
        if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS:
            return text("[]", delay=600)
        return knowing_model(body)

    model = ScriptedOpenAI(responder=held)
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model.start_in_thread()}
    child = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "ask", "--tenant", tenant, "--thread", "cli:h", FACT],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + EXIT_SECONDS
        while not any(r["messages"][0]["content"] == ENTITY_INSTRUCTIONS for r in model.requests):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the entities were never asked for"
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=EXIT_SECONDS)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        model.stop()
    assert child.returncode == 130, err
    assert "Your advisor is Zanzibar." in out
    assert ARTIFACTS in await queued_for(client, tenant)


async def test_a_failing_task_of_another_tenant_is_not_waited_for(env, tenant, client):
    """A sweep whose payload fails every run (no tenant), queued by another process: `ask`
    finishes its own writes and exits without waiting for it (Harness.finish_own)."""
    stream = task_stream()
    foreign = await client.xadd(stream, {"kind": SWEEP, "payload": json.dumps({"bogus": 1})})
    try:
        done = arxivscout(env, "ask", "--tenant", tenant, "--thread", "cli:f1", FACT)
    finally:
        async with client.pipeline(transaction=True) as pipe:
            pipe.xack(stream, "workers", foreign)
            pipe.xdel(stream, foreign)
            pipe.hdel(task_runs_key(stream), foreign)
            await pipe.execute()
    assert done.returncode == 0, done.stderr
    assert LEFT_QUEUED.partition("{")[0] not in done.stderr, done.stderr
    assert await queued_for(client, tenant) == []


async def test_redis_gone_before_exit_still_exits_0_after_the_answer(cli_env, redis_url, tenant):
    """Redis goes away while the turn's entities are extracted (after the answer is out): the
    writes stay queued, said in the log, and `ask` exits 0, as its turn decided."""
    gate = RedisGate(redis_url)
    url = await gate.start()
    loop = asyncio.get_running_loop()
    gone = threading.Event()

    def cut() -> None:
        gate.cut()
        gone.set()

    def cutting(body: dict):
        if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS:
            loop.call_soon_threadsafe(cut)
            gone.wait(EXIT_SECONDS)
            return text("[]")
        return knowing_model(body)

    model = ScriptedOpenAI(responder=cutting)
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model.start_in_thread(),
           "REDIS_URL": url}  # fmt: skip
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", "ask", "--tenant", tenant, "--thread", "cli:g", FACT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=os.getcwd(),
        )  # fmt: skip
        out, err = await asyncio.wait_for(child.communicate(), 300)
    finally:
        model.stop()
        await gate.close()
    assert gone.is_set(), err.decode()
    assert "Your advisor is Zanzibar." in out.decode()
    assert child.returncode == 0, err.decode()


@pytest.fixture
async def stream(client):
    stream = TaskStream(client, task_stream(f"finish-{uuid.uuid4().hex[:10]}"), consumer="A")
    yield stream
    await stream.destroy()


async def delivered(stream: TaskStream, task_id: str) -> int:
    """The task's delivery count as the group holds it (the next claim's count less one)."""
    rows = await stream.redis.xpending_range(
        stream.stream, stream.group, min=task_id, max=task_id, count=1
    )
    return int(rows[0]["times_delivered"])


async def test_an_own_write_that_failed_here_is_not_waited_for(stream):
    """Retried only after claim_idle_ms: `finish_own` says it is left, at once."""

    async def fails(payloads: list[dict]) -> None:
        raise RuntimeError("the model is down")

    work = BackgroundWork(stream, {"fails": fails}, claim_idle_ms=NEVER_MS, block_ms=100)
    work.track_own()
    try:
        task_id = await work.submit("fails", {"n": 0})
        async with asyncio.timeout(EXIT_SECONDS):
            assert await work.finish_own() is False
        assert await stream.present([task_id]) == {task_id}
    finally:
        await work.close()


async def test_own_left_says_whether_an_own_write_is_still_queued(stream):
    """What a command checks before it says "finishing…": its own tasks only, true while one
    is queued or running, false once each is done; another's queued task does not count."""
    release = asyncio.Event()

    async def waits(payloads: list[dict]) -> None:
        await release.wait()

    work = BackgroundWork(stream, {"waits": waits}, claim_idle_ms=NEVER_MS, block_ms=100)
    await stream.add("waits", {"someone": "else"})  # not ours: queued before track_own
    work.track_own()
    try:
        assert await work.own_left() is False  # nothing submitted here yet
        await work.submit("waits", {"n": 0})
        assert await work.own_left() is True
        release.set()
        async with asyncio.timeout(EXIT_SECONDS):
            assert await work.finish_own() is True
        assert await work.own_left() is False
    finally:
        await work.close()


@pytest.mark.parametrize("spend", [True, False])
async def test_cut_short_spends_the_running_delivery_only_when_told(stream, spend):
    """The timeout cuts short a write longer than any command waits with its delivery spent
    (dead-lettered in the end, not rerun by every command for good); Ctrl-C hands it back."""
    started = asyncio.Event()

    async def hangs(payloads: list[dict]) -> None:
        started.set()
        await asyncio.Event().wait()

    work = BackgroundWork(stream, {"slow": hangs}, claim_idle_ms=NEVER_MS, block_ms=100)
    task_id = await work.submit("slow", {"n": 0})
    async with asyncio.timeout(EXIT_SECONDS):
        await started.wait()
        await work.cut_short(spend=spend)
    marks = await stream.started_on([Task(task_id, "slow", {"n": 0}, 1)])
    if spend:
        assert (await delivered(stream, task_id), marks) == (1, {task_id: 1})
    else:
        assert (await delivered(stream, task_id), marks) == (0, {})
    await work.close()
