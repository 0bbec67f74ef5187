"""The PDF reader child where its memory cap cannot be set (memory/ingest/pdf_child.py): no
/proc/self/statm (macOS, which the README supports with an external Redis) or one it cannot
read, or a system refusing the cap, leaves the read uncapped, bounded by its timeout, instead
of failing every PDF as "damaged" (the child says why in its reply, the parent warns once per
reason); a hard limit inherited below the cap asked for caps the child at that limit;
anything else failing before the file is opened is the reader failing to start (a
RuntimeError the task retries), never the file's fault. Each child is a real process."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from memory.ingest.errors import IngestError
from memory.ingest.pdf_child import _PROJECT, _say_uncapped, read_pdf_in_child
from tests.test_shared_pdfs import shared_pdf

# The child's own preparation, run in a process of its own (a cap set here would stay), with
# where it reads its mapped size given; it prints the cap it inherited, the cap it leaves, then
# why there is none.
PREPARE = """
import resource, sys
from memory.ingest.pdf_child import prepare
print(resource.getrlimit(resource.RLIMIT_AS)[0])
why = prepare(64, statm=sys.argv[1])
print(resource.getrlimit(resource.RLIMIT_AS)[0])
print(why or "")
"""
HARD_LIMIT = resource.getrlimit(resource.RLIMIT_AS)[1]  # this system's (a CI's may set one)


def prepared_with(statm: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PREPARE, str(statm)], cwd=_PROJECT, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("statm", ["missing", "unreadable"])
def test_a_child_without_its_mapped_size_reads_uncapped(tmp_path, statm):
    where = tmp_path / "statm"
    if statm == "unreadable":
        where.write_text("not pages\n")
    done = prepared_with(where)
    assert done.returncode == 0, done.stderr
    inherited, cap, why = done.stdout.splitlines()
    assert cap == inherited  # none of its own: the timeout bounds the read
    assert why.startswith("FileNotFoundError" if statm == "missing" else "ValueError")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="no /proc (macOS)")
def test_the_child_caps_its_memory_where_it_can():
    done = prepared_with(Path("/proc/self/statm"))
    assert done.returncode == 0, done.stderr
    _, cap, why = done.stdout.splitlines()
    assert int(cap) > 64 * 1024 * 1024 and not why


@pytest.mark.skipif(
    HARD_LIMIT != resource.RLIM_INFINITY, reason="a hard limit caps the child below the overflow"
)
async def test_a_failure_before_the_file_is_opened_is_the_reader_not_starting():
    """A cap the system cannot take (too large for its C type) fails the preparation."""
    with pytest.raises(RuntimeError, match=r"could not start: OverflowError") as failed:
        await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", memory_mb=2**60)
    assert not isinstance(failed.value, IngestError)


# A parent whose own hard cap is below what a child asks for (this system's, else 3 GiB): the
# child cannot raise it, so it is capped at it (the cap applies all the same), never "uncapped",
# and nothing is warned, for two reads.
INHERITED = """
import asyncio, logging, resource, sys
from memory.ingest.pdf_child import read_pdf_in_child
from tests.test_shared_pdfs import shared_pdf

hard = resource.getrlimit(resource.RLIMIT_AS)[1]
if hard == resource.RLIM_INFINITY:
    hard = 3 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
for _ in range(2):
    text = asyncio.run(
        read_pdf_in_child(shared_pdf("Capped"), "x.pdf", memory_mb=hard // 2**20 + 1024)
    )
print(text.title)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="no /proc (macOS)")
def test_a_hard_limit_below_the_childs_cap_caps_it_at_that_limit():
    done = subprocess.run(
        [sys.executable, "-c", INHERITED], cwd=_PROJECT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["Capped"]  # no "without its memory cap" warning


def test_each_reason_to_read_uncapped_is_warned_once(caplog):
    """Once per reason, not once per process: a reason that appears later is said too."""
    first, later = (f"ValueError: {uuid.uuid4().hex}" for _ in range(2))
    with caplog.at_level(logging.WARNING, logger="memory.ingest.pdf_child"):
        for why in (first, first, later, first):
            _say_uncapped(why)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and first in warned[0] and later in warned[1]
