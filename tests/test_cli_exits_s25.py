"""How `arxivscout` commands end when something goes wrong, as a user runs them (subprocesses,
some on a pseudo-terminal):

- `ask` with a message it cannot take exits 1 (it exited 0, as if answered);
- `ask` whose Redis goes away mid-turn says so in one line, not a traceback;
- a command whose model server is down says so in one line, never that Redis is down;
- `memory forget` answered with Ctrl-D is a "no", not an EOFError traceback;
- Ctrl-C during a chat turn says how to take the chat up again.
"""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.scripted_openai import ScriptedOpenAI, text
from tests.test_episodic_context import locomo_fixture
from tests.test_redis_timeouts import redis_proxy
from tests.test_terminal_ctrl_c import START_SECONDS, exited, read_until

EXIT_SECONDS = 60.0  # far beyond a clean exit


@pytest.fixture(scope="module")
def model_url():
    model = ScriptedOpenAI(responder=lambda body: text("An answer."))
    yield model.start_in_thread()
    model.stop()


def arxivscout(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_ask_with_a_message_it_cannot_take_exits_1(cli_env, model_url, tenant):
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model_url}
    done = arxivscout(env, "ask", "--tenant", tenant, "--thread", "q", "   ")
    assert "I can't take that message" in done.stdout, done.stderr
    assert done.returncode == 1


async def test_ask_with_redis_gone_mid_turn_says_so_in_one_line(cli_env, redis_url, tenant):
    async with redis_proxy(redis_url) as proxy, ScriptedOpenAI() as model:

        def cut_then_answer(body):
            proxy.cut()  # Redis goes away while the model is thinking
            return text("MemGPT pages memory.")

        model.responder = cut_then_answer
        env = {
            **cli_env, "REDIS_URL": proxy.url_for(redis_url), "OPENAI_API_KEY": "test-key",
            "OPENAI_BASE_URL": model.base_url,
        }  # fmt: skip
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", "ask", "--tenant", tenant, "--thread", "q",
            "What is MemGPT?", env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        _out, err = await asyncio.wait_for(child.communicate(), 300)
    said = err.decode()
    assert model.requests, said  # the turn had begun
    assert child.returncode == 1, said
    assert "Traceback" not in said, said
    assert said.startswith("arxivscout: error: memory (Redis) is unreachable: "), said
    assert len(said.strip().splitlines()) == 1, said


def test_a_model_server_down_is_not_called_redis(cli_env, tmp_path):
    """`eval locomo --answer` with nothing listening at OPENAI_BASE_URL: the refused connection
    is the model server's (LLMError is a ServiceError), said in the model's own words."""
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    data = tmp_path / "tiny.json"
    locomo_fixture(data)
    env = {
        **cli_env,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
    }
    done = arxivscout(env, "eval", "locomo", "--data", str(data), "--answer")
    said = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Redis" not in done.stderr, done.stderr
    assert said[-1] == (
        f"arxivscout: error: Cannot reach the model server at http://127.0.0.1:{port}/v1: "
        "connection refused"
    ), done.stderr


def on_a_terminal(env: dict, *args: str) -> tuple[int, int]:
    """`arxivscout *args` on a pseudo-terminal: (pid, the terminal's fd)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "app.cli", *args], env)
    return pid, fd


def end(pid: int, fd: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    os.close(fd)


@pytest.mark.parametrize("kind", ["thread", "tenant"])
def test_forget_answered_with_ctrl_d_is_a_no(cli_env, tenant, kind):
    pid, fd = on_a_terminal(cli_env, "memory", "forget", kind, tenant, "--tenant", tenant)
    try:
        shown = read_until(fd, pid, lambda out: b"[y/N] " in out, START_SECONDS)
        assert b"[y/N] " in shown, shown.decode(errors="replace")
        os.write(fd, b"\x04")  # Ctrl-D
        shown += read_until(fd, pid, lambda out: b"forgotten" in out, EXIT_SECONDS)
        status = exited(pid, EXIT_SECONDS)
        assert status is not None and os.waitstatus_to_exitcode(status) == 1, shown
        assert b"Traceback" not in shown, shown.decode(errors="replace")
        assert b"Nothing was forgotten." in shown, shown.decode(errors="replace")
    finally:
        end(pid, fd)


def test_ctrl_c_during_a_turn_says_how_to_continue(cli_env, tenant):
    model = ScriptedOpenAI(responder=lambda body: text("Too late.", delay=600))  # held
    base_url = model.start_in_thread()
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": base_url}
    pid, fd = on_a_terminal(env, "chat", "--tenant", tenant, "--thread", "cli:held")
    try:
        shown = read_until(fd, pid, lambda out: b"you> " in out, START_SECONDS)
        assert b"you> " in shown, shown.decode(errors="replace")[-1000:]
        os.write(fd, b"What is MemGPT?\n")
        deadline = time.monotonic() + START_SECONDS
        while not model.requests:  # the turn is waiting for the model
            assert exited(pid, 0.2) is None, "the chat ended"
            assert time.monotonic() < deadline, "the model was never asked"
        os.write(fd, b"\x03")  # Ctrl-C
        shown = read_until(fd, pid, lambda out: b"interrupted" in out, EXIT_SECONDS)
        status = exited(pid, EXIT_SECONDS)
        assert status is not None, shown.decode(errors="replace")
        expected = f"To continue this chat: arxivscout chat --thread cli:held --tenant {tenant}"
        assert expected.encode() in shown, shown.decode(errors="replace")
    finally:
        end(pid, fd)
        model.stop()
