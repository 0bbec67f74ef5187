"""The terminal's commands as the audit found them (subprocesses, as a user runs them):

- `chat` and `ask` refuse a Slack or Discord thread (a DM's, a private channel's): the
  terminal's scope is public, so the DM would reach the model and the new turn be stored
  public; `context` shows such a thread as the agent sees it there (its place's memory);
- `chat` logs to a file in the data directory, not at the prompt; a server logs at INFO on
  stderr with level and logger;
- a REDIS_URL whose port is wrong is one line naming it, its password hidden;
- a message sent again after the memory stopped its turn is stored once.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys

import aiohttp
import pytest

from adapters.terminal import MEMORY_DOWN_HERE, TerminalChat
from app.commands.chat_cmd import FINISHING
from app.commands.common import LOG_FILE
from bot.harness import ENTITY_INSTRUCTIONS
from memory.scope import Scope, Visibility
from memory.stores.entity import Entity
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import ErrorReply, ScriptedOpenAI, text
from tests.test_redis_timeouts import redis_proxy
from tests.test_upgrade_cli_s24 import arxivscout as in_process
from tests.test_worker_idle import first_line, start_worker, stop

DM_THREAD = "slack:T1:D0ABC:1700000000.1"
SECRET = "my salary is 123k, keep it between us"


def arxivscout(env: dict, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, input=stdin,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def model():
    model = ScriptedOpenAI(responder=lambda body: text("An answer."))
    base_url = model.start_in_thread()
    yield model, base_url
    model.stop()


@pytest.mark.parametrize(
    "command",
    [
        ("ask", "--thread", DM_THREAD, "What did I tell you?"),
        ("chat", "--thread", DM_THREAD),
    ],
)
async def test_a_platform_dm_thread_is_refused_at_the_terminal(
    memory, tenant, cli_env, model, command
):
    scripted, base_url = model
    dm = Scope(tenant, DM_THREAD, "D0ABC", Visibility.DM, "U1", "Ann")
    await memory.conversation.append(dm, "user", SECRET)
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": base_url}
    done = arxivscout(env, *command, "--tenant", tenant, stdin="What did I tell you?\n")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"arxivscout: error: '{DM_THREAD}' is a Slack or Discord"), (
        done.stderr
    )
    assert SECRET not in done.stdout
    assert not scripted.requests  # nothing reached the model
    assert [m.content for m in await memory.conversation.all(dm)] == [SECRET]  # nothing stored


async def test_context_shows_a_platform_thread_as_the_agent_sees_it_there(memory, tenant, cli_env):
    """`arxivscout context` on a DM thread: the DM's own memory (an entity learned there) is
    shown, as the agent answering in that DM is shown it; nothing is stored or asked."""
    dm = Scope(tenant, DM_THREAD, "D0ABC", Visibility.DM, "U1", "Ann")
    await memory.conversation.append(dm, "user", SECRET)
    await memory.entities.upsert(dm, [Entity("Quokkabase", "system", "Ann's private database")])
    done = arxivscout(cli_env, "context", "--tenant", tenant, "--thread", DM_THREAD, "Quokkabase?")
    assert done.returncode == 0, done.stdout + done.stderr
    assert SECRET in done.stdout and "Quokkabase (system)" in done.stdout, done.stdout
    assert [m.content for m in await memory.conversation.all(dm)] == [SECRET]


def test_chat_logs_to_a_file_not_at_the_prompt(cli_env, data_dir, tenant):
    """A model refusing the request: its warning goes to the data directory's log file, with
    its level and logger; the terminal shows the reply alone."""
    scripted = ScriptedOpenAI(
        responder=lambda body: (
            text("[]") if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS
            else ErrorReply(400, "bad request")
        )
    )  # fmt: skip
    base_url = scripted.start_in_thread()
    try:
        env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": base_url}
        thread = f"log-{tenant}"  # the data directory (and its log) is the session's
        done = arxivscout(env, "chat", "--tenant", tenant, "--thread", thread, stdin="Hello?\n")
    finally:
        scripted.stop()
    assert done.returncode == 1, done.stderr  # its only message failed (chat_cmd `answered`)
    assert "I could not get an answer from the language model" in done.stdout
    assert done.stderr.strip() in ("", FINISHING), done.stderr  # no warning, at most the wait
    logged = (data_dir / LOG_FILE).read_text()
    assert f" WARNING bot.agent: model error in thread {thread}: " in logged, logged


async def test_a_server_logs_at_info_with_level_and_logger(tmp_path):
    """The idle worker's health check: aiohttp's access log (INFO) is on stderr, a sign-in
    token in an address hidden (a memory-page link's: whoever reads the log could sign in)."""
    port = free_port()
    process = await start_worker(tmp_path, port)
    try:
        await first_line(process)
        address = f"http://127.0.0.1:{port}/healthz?token=v1.s3cret.sig"
        async with aiohttp.ClientSession() as http, http.get(address):
            pass
        _code, err = await stop(process, signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert " INFO aiohttp.access: " in err and "GET /healthz?token=*** " in err, err
    assert "s3cret" not in err


@pytest.mark.parametrize("port", ["abc", "99999", "0"])
async def test_a_redis_url_with_a_bad_port_is_one_line(capsys, monkeypatch, data_dir, port):
    monkeypatch.setenv("REDIS_URL", f"redis://me:s3cret@db:{port}/0")
    code, _, err = await in_process(capsys, "memory", "threads")
    assert code == 2, err
    assert err.startswith(
        "arxivscout: error: Invalid configuration: REDIS_URL: Value error, the port should be "
        "a number from 1 to 65535"
    ), err
    assert "s3cret" not in err and len(err.strip().splitlines()) == 1


async def test_a_message_sent_again_after_redis_went_away_is_stored_once(
    redis_url, tmp_path, tenant
):
    async with redis_proxy(redis_url) as proxy:
        world = await open_world(proxy.url_for(redis_url), tmp_path)
        try:
            scope = Scope.local("cli:again", tenant)
            out = io.StringIO()
            chat = TerminalChat(world.runtime.turns(), scope, out=out)
            chat.interactive = False

            def cut_then_answer(body):
                proxy.cut()  # the question is stored: Redis goes away while the model thinks
                return text("MemGPT pages memory.")

            world.model.responder = cut_then_answer
            await chat.turn("What is MemGPT?")
            assert MEMORY_DOWN_HERE in out.getvalue()
            proxy.restore()
            world.model.responder = lambda body: text("MemGPT pages memory.")
            await chat.turn("What is MemGPT?")  # sent again, as the chat asked
            assert "MemGPT pages memory." in out.getvalue()
            messages = await world.runtime.memory.conversation.all(scope)
            assert [m.content for m in messages if m.role == "user"] == ["What is MemGPT?"]
            assert [m.content for m in messages if m.role == "assistant"] == [
                "MemGPT pages memory."
            ]
        finally:
            proxy.restore()
            await close_world(world)
