"""How `arxivscout` commands end, as a user runs them (subprocesses, the real Redis):

- `tasks requeue` with an unknown id among known ones requeues the known and names the
  unknown (it stopped at the first unknown, saying nothing of those requeued before);
- a command whose reader went away (`| head`) exits 1 without a traceback;
- `ask` whose embedding model cannot be reached says so as the chat does, and exits 1 (not
  answered), not 2 with the raw error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from memory.dead_letters import dead_letters
from memory.keys import task_stream_name
from tests.support.scripted_openai import ScriptedOpenAI, text
from tests.test_cli_memory import arxivscout as arxivscout_here
from tests.test_dead_letters import dead_lettered, stream  # noqa: F401 (a fixture)


def arxivscout(env: dict, *args: str, **streams) -> subprocess.CompletedProcess:
    """`streams`: stdout, stderr (each captured unless given)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, text=True, timeout=300,
        stdin=subprocess.DEVNULL, **streams,
    )  # fmt: skip


def closed_port() -> int:
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


async def test_requeue_of_known_and_unknown_ids_requeues_the_known(client, stream, capsys):  # noqa: F811
    await dead_lettered(stream, [("index", {"n": 1}), ("index", {"n": 2})])
    name = task_stream_name(stream.stream)
    first, second = [f"{name}/{letter.id}" for letter in await dead_letters(stream)]
    unknown = f"{name}/1-1"
    code, out, err = await arxivscout_here(capsys, "tasks", "requeue", first, unknown, second)
    assert code == 2, (out, err)
    assert f"requeued {first} as task" in out and f"requeued {second} as task" in out
    assert "2 requeued." in out
    assert f"No dead letter {unknown}" in err and first not in err and second not in err
    assert await dead_letters(stream) == [] and await stream.pending_count() == 2


def test_a_reader_gone_ends_the_command_quietly(cli_env):
    """stdout a pipe nobody reads any more (`| head` that has its lines): no traceback."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = arxivscout(cli_env, "tasks", "dead", stdout=writer)
    finally:
        os.close(writer)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "", done.stderr


def test_ask_with_the_embedding_model_unreachable_says_so_and_exits_1(cli_env, tenant):
    """The embedding model's name and size are the local one's (so the indexes open), served
    at an address nothing listens on. It fails as the agent opens (embedding its tools'
    descriptions) or, those cached, as the question is embedded: said the same either way."""
    unreachable = {
        **cli_env, "ARXIVSCOUT_EMBEDDINGS": "openai", "OPENAI_EMBEDDING_MODEL": "all-MiniLM-L6-v2",
        "ARXIVSCOUT_EMBEDDING_DIMS": "384", "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1",
    }  # fmt: skip
    said = (
        "Sorry, I could not reach the embedding model (connection refused), so I could not "
        "answer this. Please try again in a moment."
    )
    model = ScriptedOpenAI(responder=lambda body: text("MemGPT pages its memory."))
    local = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model.start_in_thread()}
    try:
        # questions of their own: one asked (and embedded) by an earlier test would be cached
        for question, warmed in (
            (f"What is MemGPT, {tenant}?", False),
            (f"And RAG, {tenant}?", True),
        ):
            if warmed:  # the tools' descriptions cached: the question is what fails
                answered = arxivscout(local, "ask", "--tenant", tenant, "--thread", "w", "Hi")
                assert answered.returncode == 0, answered.stderr
            done = arxivscout(unreachable, "ask", "--tenant", tenant, "--thread", "q", question)
            assert done.returncode == 1, done.stderr
            assert done.stdout.strip() == said, (done.stdout, done.stderr)
            assert "Traceback" not in done.stderr
    finally:
        model.stop()
