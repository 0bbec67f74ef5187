"""The PDF reader child (memory/ingest/pdf_child.py) as deployed: one that cannot start or
import is our deployment's fault, a RuntimeError the task retries, never "your PDF may be
damaged"; it asks the kernel to kill it, not the bot, when memory runs out; it keeps the
interpreter's own environment (a buildpack's LD_LIBRARY_PATH, PYTHONPATH) and no secrets; a
process runs at most CHILDREN at once."""

from __future__ import annotations

import asyncio
import os

import pytest

from memory.ingest.errors import IngestError
from memory.ingest.pdf_child import CHILDREN, _child_env, read_pdf_in_child
from tests.support.pdf_children import STAND_IN
from tests.test_shared_pdfs import shared_pdf


async def test_a_child_that_cannot_import_is_a_retryable_error():
    with pytest.raises(RuntimeError, match=r"could not start .*No module named") as failed:
        await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", module="memory.ingest.no_such")
    assert not isinstance(failed.value, IngestError)


async def test_a_child_that_exits_0_with_a_malformed_reply_is_a_retryable_error():
    with pytest.raises(RuntimeError, match=r"reply is malformed") as failed:
        await read_pdf_in_child(b"%PDF", "malformed.pdf", module=STAND_IN)
    assert not isinstance(failed.value, IngestError)


async def test_the_child_asks_to_be_killed_first_when_memory_runs_out():
    with pytest.raises(IngestError, match=r"^oom_score_adj 1000$"):
        await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", module=STAND_IN)  # its score


def test_the_child_keeps_what_python_needs_and_no_secrets(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/app/.heroku/python/lib")
    monkeypatch.setenv("PYTHONHOME", "/app/.heroku/python")
    monkeypatch.setenv("PYTHONPATH", "/app/vendor")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-secret")
    env = _child_env()
    assert env["LD_LIBRARY_PATH"] == "/app/.heroku/python/lib"
    assert env["PYTHONHOME"] == "/app/.heroku/python"
    assert env["PYTHONPATH"].endswith(":/app/vendor")  # after the project's own path
    assert "SLACK_BOT_TOKEN" not in env and "xoxb-secret" not in str(env)


def reader_children() -> int:
    """This process's PDF reader children (their stand-in, by its module name) alive now."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                mine = STAND_IN.encode() in cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        count += parent == os.getpid() and mine
    return count


async def test_a_process_runs_at_most_two_reader_children_at_once():
    reads = [  # hang.pdf: the stand-in never ends
        asyncio.create_task(read_pdf_in_child(b"%PDF", "hang.pdf", timeout=60, module=STAND_IN))
        for _ in range(3)
    ]
    try:
        async with asyncio.timeout(20):
            while reader_children() < CHILDREN:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # time for a third to start, were it allowed
        assert reader_children() == CHILDREN
    finally:
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
    assert reader_children() == 0  # cancelled reads take their children down
