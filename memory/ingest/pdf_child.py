"""Read an untrusted PDF in a child process, with a memory limit and a timeout.

pdfium is C++ fed with whatever a person shares: a crafted file can make it crash, take all
memory or run for minutes. In the bot's own process that would take the bot down (and its
task, claimed again, would take the next one down too). Here a fresh Python process (started
with `python -m memory.ingest.pdf_child`; it imports only the reader) gets the bytes on stdin,
limits its address space (RLIMIT_AS) before it opens them, and writes the text as JSON on
stdout; the parent kills it after `timeout`. JSON, not pickle: what comes back from a process
that parsed a hostile file is data to check, never code to run. The child gets no secrets:
its environment is the bare minimum.

Every way it can end badly (over the memory limit, a crash, too slow) is an IngestError, said
to the person as it is; the cost is a process start, 0.1-0.2 s on top of the read.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from memory.ingest.errors import IngestError
from memory.ingest.pdf import PdfText, read_pdf

READ_MEMORY_MB = 1024  # address space a read may add to the child's own (~1.3 GB in all)
READ_SECONDS = 120.0  # a 300-page paper reads in a few seconds, one built to be slow does not
_PROJECT = Path(__file__).resolve().parents[2]  # where `memory` is, for the child's sys.path
_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR")  # what the child keeps of the environment

log = logging.getLogger(__name__)


async def read_pdf_in_child(
    data: bytes, name: str, max_pages: int | None = None, max_chars: int | None = None,
    memory_mb: int = READ_MEMORY_MB, timeout: float = READ_SECONDS,
) -> PdfText:  # fmt: skip
    """`read_pdf(data, name, max_pages, max_chars)` in a child process that may use
    `memory_mb` more memory than it starts with, for up to `timeout` seconds; IngestError
    (with a message for the person) when it refuses the PDF or does not finish."""
    import asyncio  # here: the child, which runs this module, starts 40 ms faster without it

    limits = json.dumps({"name": name, "max_pages": max_pages, "max_chars": max_chars,
                         "memory_mb": memory_mb})  # fmt: skip
    env = {key: os.environ[key] for key in _ENV if key in os.environ}
    env["PYTHONPATH"] = str(_PROJECT)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memory.ingest.pdf_child", limits,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=_PROJECT,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(child.communicate(data), timeout)
    except TimeoutError:
        raise IngestError(
            f"{name}: reading it took longer than I allow for one PDF ({timeout:.0f} s)."
        ) from None
    finally:  # timed out, or the task cancelled: the child goes too
        if child.returncode is None:
            child.kill()
            await child.wait()
    return _outcome(name, child.returncode, out, err, memory_mb)


def _outcome(name: str, code: int, out: bytes, err: bytes, memory_mb: int) -> PdfText:
    try:
        reply = json.loads(out)
    except ValueError:
        reply = None
    if code == 0 and isinstance(reply, dict):
        if "refused" in reply:
            raise IngestError(str(reply["refused"]))
        if reply.get("memory"):
            raise IngestError(_too_big(name, memory_mb))
        return _pdf_text(reply)
    # Killed by a signal (a crash: pdfium aborts when an allocation fails, too) or broken.
    tail = err.decode("utf-8", "replace").strip()[-500:]
    log.warning("the PDF reader failed on %s (exit %s): %s", name, code, tail)
    raise IngestError(
        f"{name}: the PDF reader failed on it (it may be damaged, or need more memory than "
        f"the {memory_mb} MB I allow for one PDF)."
    ) from RuntimeError(f"pdf reader child exited with {code}: {tail}")


def _too_big(name: str, memory_mb: int) -> str:
    return f"{name}: reading it needs more memory than I allow for one PDF ({memory_mb} MB)."


def _pdf_text(reply: dict[str, Any]) -> PdfText:
    """The child's text, checked: its output is data from a process that parsed the file."""
    paragraphs = [(str(s), str(t)) for s, t in reply["paragraphs"]]
    pages = [int(p) for p in reply["paragraph_pages"]]
    if len(pages) != len(paragraphs):
        raise ValueError("pdf reader child: paragraphs and pages differ in number")
    return PdfText(str(reply["title"]), int(reply["pages"]), paragraphs, pages)


def _limit_memory(extra_mb: int) -> None:
    """Cap the address space at what the process maps now plus `extra_mb`."""
    import resource

    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped + extra_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _main() -> None:
    limits = json.loads(sys.argv[1])
    data = sys.stdin.buffer.read()
    _limit_memory(int(limits["memory_mb"]))
    try:
        text = read_pdf(data, limits["name"], limits["max_pages"], limits["max_chars"])
        reply: dict[str, Any] = {
            "title": text.title, "pages": text.pages,
            "paragraphs": text.paragraphs, "paragraph_pages": text.paragraph_pages,
        }  # fmt: skip
    except IngestError as exc:
        reply = {"refused": str(exc)}
    except MemoryError:
        reply = {"memory": True}
    del data
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    _main()
