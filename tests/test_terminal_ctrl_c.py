"""`arxivscout chat` on a terminal: Ctrl-C at the `you>` prompt ends the chat at once, with
exit code 130. (The prompt's input() ran in asyncio's executor, which asyncio.run joins on its
way out: the process waited for Enter. Read through sys.stdin.buffer in a daemon thread, the
prompt held the buffer's lock: interpreter shutdown aborted, SIGABRT.)"""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time

START_SECONDS = 240.0  # the agent opens (embedding model, Redis) on a loaded 2-core machine
EXIT_SECONDS = 60.0  # far beyond a clean exit; without the fix it never comes


def read_until(fd: int, pid: int, done, seconds: float) -> bytes:
    """What the terminal shows until `done(shown)` or the process ends, at most `seconds`."""
    shown = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not done(shown):
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                shown += os.read(fd, 4096)
            except OSError:  # the process closed the terminal
                break
    return shown


def exited(pid: int, seconds: float) -> int | None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            return status
        time.sleep(0.1)
    return None


def test_ctrl_c_at_the_prompt_ends_the_chat(cli_env, tenant):
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: `arxivscout chat` on the terminal
        os.execve(
            sys.executable, [sys.executable, "-m", "app.cli", "chat", "--tenant", tenant], env
        )
    try:
        shown = read_until(fd, pid, lambda out: b"you> " in out, START_SECONDS)
        assert b"you> " in shown, shown.decode(errors="replace")[-1000:]
        os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT
        status = exited(pid, EXIT_SECONDS)
        assert status is not None, "Ctrl-C at the prompt did not end the chat"
        shown += read_until(fd, pid, lambda out: False, 0.5)  # what it said on its way out
        code = os.waitstatus_to_exitcode(status)
        assert code == 130, (code, shown.decode(errors="replace")[-2000:])
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
