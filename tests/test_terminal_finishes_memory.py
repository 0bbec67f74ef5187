"""`ask` and `chat` finish the turn's memory writes before they exit (subprocesses, offline).

A terminal runs no worker beside it: what a command left queued (indexing the turn's messages,
its entities) waited for good, and a fact said in one thread reached no other. Now:

- after `ask`, its messages are in episodic memory and its tenant has no task queued;
- a second `ask`, in another thread, sees the first one's fact in its context;
- a piped `chat` finishes its writes too, and exits 1 when every message failed (as `ask`);
- Ctrl-C while the writes run exits at once, the task still queued for the next run.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from bot.upkeep import ARTIFACTS
from memory.keys import task_stream
from memory.tasks import payload_tenants
from tests.support.scripted_openai import ScriptedOpenAI, text

FACT = "My advisor is Professor Zanzibar at MIT."
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
    assert "finishing memory writes" in done.stderr
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
