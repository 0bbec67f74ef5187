"""The PDF reader child where its memory cap cannot be set (memory/ingest/pdf_child.py): no
/proc/self/statm (macOS, which the README supports with an external Redis) or one it cannot
read, or a system refusing the cap, leaves the read uncapped, bounded by its timeout, instead
of failing every PDF as "damaged" (the child says why in its reply, the parent warns once);
anything else failing before the file is opened is the reader failing to start (a
RuntimeError the task retries), never the file's fault. Each child is a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memory.ingest.errors import IngestError
from memory.ingest.pdf_child import _PROJECT, read_pdf_in_child
from tests.test_shared_pdfs import shared_pdf

# The child's own preparation, run in a process of its own (a cap set here would stay), with
# where it reads its mapped size given; it prints the cap it leaves, then why there is none.
PREPARE = """
import resource, sys
from memory.ingest.pdf_child import prepare
why = prepare(64, statm=sys.argv[1])
print(resource.getrlimit(resource.RLIMIT_AS)[0])
print(why or "")
"""


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
    cap, why = done.stdout.splitlines()
    assert int(cap) == -1  # RLIM_INFINITY: no cap, the timeout bounds the read
    assert why.startswith("FileNotFoundError" if statm == "missing" else "ValueError")


def test_the_child_caps_its_memory_where_it_can():
    done = prepared_with(Path("/proc/self/statm"))
    assert done.returncode == 0, done.stderr
    cap, why = done.stdout.splitlines()
    assert int(cap) > 64 * 1024 * 1024 and not why


async def test_a_failure_before_the_file_is_opened_is_the_reader_not_starting():
    """A cap the system cannot take (too large for its C type) fails the preparation."""
    with pytest.raises(RuntimeError, match=r"could not start: OverflowError") as failed:
        await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", memory_mb=2**60)
    assert not isinstance(failed.value, IngestError)


# A parent whose own hard cap is below what a child asks for: the child's setrlimit is refused
# (ValueError), it reads uncapped and says why; the parent warns once, for two reads.
REFUSED = """
import asyncio, logging, resource, sys
from memory.ingest.pdf_child import read_pdf_in_child
from tests.test_shared_pdfs import shared_pdf

resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
for _ in range(2):
    text = asyncio.run(read_pdf_in_child(shared_pdf("Uncapped"), "x.pdf", memory_mb=4096))
print(text.title)
"""


def test_a_cap_the_system_refuses_is_said_once_by_the_parent():
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=_PROJECT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *warnings, title = done.stdout.splitlines()
    assert title == "Uncapped"
    [warning] = warnings
    assert "without its memory cap (ValueError" in warning
