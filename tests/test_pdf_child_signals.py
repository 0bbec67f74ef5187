"""The PDF reader child and a stopping platform: Heroku sends SIGTERM to every process of a
dyno, the child too. The child ignores it (the bot ends it itself), and a child stopped from
outside all the same (before it could ignore it) is a RuntimeError the task retries, never
"the PDF may be damaged"."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

from memory.ingest.errors import IngestError
from memory.ingest.pdf_child import _PROJECT, CHILD_MODULE, _child_env, read_pdf_in_child
from tests.support.pdf_child_stopped import STOPPED
from tests.test_shared_pdfs import shared_pdf

BLOCKED_WAIT_SECONDS = 30.0  # a loaded 2-core machine starts Python slowly


async def test_a_child_stopped_from_outside_is_a_retryable_error_not_a_damaged_pdf():
    with pytest.raises(RuntimeError, match=r"stopped by signal 15") as failed:
        await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", module=STOPPED)
    assert not isinstance(failed.value, IngestError)


async def blocked_on_stdin(pid: int) -> bool:
    """True once the child waits for the PDF on its stdin pipe (past its start and imports)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BLOCKED_WAIT_SECONDS
    while loop.time() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as wchan:
                if "pipe" in wchan.read():
                    return True
        except OSError:
            return False
        await asyncio.sleep(0.02)
    return False


async def test_the_child_reads_on_through_the_platforms_sigterm():
    limits = json.dumps({"name": "fine.pdf", "max_pages": None, "max_chars": None,
                         "memory_mb": 1024})  # fmt: skip
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", CHILD_MODULE, limits, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_child_env(),
        cwd=_PROJECT,
    )  # fmt: skip
    try:
        if not await blocked_on_stdin(child.pid):
            pytest.skip("this kernel does not show where the child waits (/proc/<pid>/wchan)")
        os.kill(child.pid, signal.SIGTERM)  # the dyno is stopping
        out, err = await asyncio.wait_for(child.communicate(shared_pdf("Fine")), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, err.decode()[-500:]
    assert json.loads(out)["pages"] >= 1
