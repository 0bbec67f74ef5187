"""Read an untrusted PDF in a child process, with a memory limit and a timeout.

pdfium is C++ fed with whatever a person shares: a crafted file can make it crash, take all
memory or run for minutes. In the bot's own process that would take the bot down (and its
task, claimed again, would take the next one down too). Here a fresh Python process (started
with `python -m memory.ingest.pdf_child`; it imports only the reader) gets the bytes on stdin,
limits its address space (RLIMIT_AS, where the system allows it: not on macOS, where the
timeout alone bounds a read) before it opens them, and writes the text as JSON on
stdout; the parent kills it after `timeout`. JSON, not pickle: what comes back from a process
that parsed a hostile file is data to check, never code to run. The child gets no secrets:
its environment is what the interpreter needs to start (PATH, locale, TMPDIR, and the
LD_LIBRARY_PATH, PYTHONHOME and PYTHONPATH a buildpack's Python may rely on), nothing else. It
asks the kernel to kill it first when memory runs out (oom_score_adj 1000), and a process runs
at most CHILDREN of them at once.

Every way the read can end badly (over the memory limit, a crash, too slow) is an IngestError,
said to the person as it is; a child that could not start or import, that exited 0 with a
reply we cannot read (our deployment's fault, not the file's), or that was stopped by a signal
sent from outside (Heroku sends SIGTERM to every process of a stopping dyno), is a RuntimeError,
which a task retries. The child ignores SIGTERM from its start: the bot kills it itself (SIGKILL)
on a timeout or a cancel, and a stopping bot's running reads should finish in its grace time. The cost is a process start, 0.1-0.2 s on top of the read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import weakref
from pathlib import Path
from typing import Any

from memory.ingest.errors import IngestError
from memory.ingest.pdf import PdfText, read_pdf

READ_MEMORY_MB = 1024  # address space a read may add to the child's own (~1.3 GB in all)
READ_SECONDS = 120.0  # a 300-page paper reads in a few seconds, one built to be slow does not
_PROJECT = Path(__file__).resolve().parents[2]  # where `memory` is, for the child's sys.path
# what the child keeps of the environment: what Python needs to start, no tokens
_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONHOME")
CHILD_MODULE = "memory.ingest.pdf_child"  # the module run as the child
STATM = "/proc/self/statm"  # the child's mapped size, for its memory cap (Linux only)
CHILDREN = 2  # readers one process runs at once (each may take READ_MEMORY_MB more)
# what a child that never got to the PDF says: it could not import, or load a library
_LAUNCH_FAILED = re.compile(
    r"ImportError|ModuleNotFoundError|No module named|error while loading shared librar"
    r"|Could not find platform (in)?dependent libraries|Fatal Python error: init"
)
# signals that stop a process from outside (the platform, a terminal): never the file's doing
_STOPPED_FROM_OUTSIDE = {  # Windows has no SIGHUP
    -getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
}
_children: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # per loop
_uncapped_said: set[str] = set()  # why children read without their cap (each reason logged once)

log = logging.getLogger(__name__)


async def read_pdf_in_child(
    data: bytes, name: str, max_pages: int | None = None, max_chars: int | None = None,
    memory_mb: int = READ_MEMORY_MB, timeout: float = READ_SECONDS, module: str = CHILD_MODULE,
) -> PdfText:  # fmt: skip
    """`read_pdf(data, name, max_pages, max_chars)` in a child process that may use
    `memory_mb` more memory than it starts with, for up to `timeout` seconds; IngestError
    (with a message for the person) when it refuses the PDF or does not finish. `module` is
    what the child runs: tests alone give another (a stand-in), never from configuration."""
    import asyncio  # here: the child, which runs this module, starts 40 ms faster without it

    loop = asyncio.get_running_loop()
    if loop not in _children:
        _children[loop] = asyncio.Semaphore(CHILDREN)
    async with _children[loop]:
        return await _read_in_child(data, name, max_pages, max_chars, memory_mb, timeout, module)


async def _read_in_child(
    data: bytes, name: str, max_pages: int | None, max_chars: int | None, memory_mb: int,
    timeout: float, module: str,
) -> PdfText:  # fmt: skip
    import asyncio

    limits = json.dumps({"name": name, "max_pages": max_pages, "max_chars": max_chars,
                         "memory_mb": memory_mb})  # fmt: skip
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, limits,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_child_env(), cwd=_PROJECT,
        )  # fmt: skip
    except OSError as exc:  # no process (out of pids, memory): not the file's fault
        raise RuntimeError(f"could not start the PDF reader for {name}: {exc!r}") from exc
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


def _child_env() -> dict[str, str]:
    """The child's environment: what the interpreter needs, our project first on its path."""
    env = {key: os.environ[key] for key in _ENV if key in os.environ}
    paths = [str(_PROJECT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _outcome(name: str, code: int, out: bytes, err: bytes, memory_mb: int) -> PdfText:
    try:
        reply = json.loads(out)
    except ValueError:
        reply = None
    if code == 0 and isinstance(reply, dict):
        if reply.get("uncapped"):
            _say_uncapped(str(reply["uncapped"]))
        if "unprepared" in reply:  # it never opened the file: the task tries again
            log.error("the PDF reader could not prepare for %s: %s", name, reply["unprepared"])
            raise RuntimeError(f"the PDF reader could not start: {reply['unprepared']}")
        if "refused" in reply:
            raise IngestError(str(reply["refused"]))
        if reply.get("memory"):
            raise IngestError(_too_big(name, memory_mb))
        return _pdf_text(reply)
    tail = err.decode("utf-8", "replace").strip()[-500:]
    if code in _STOPPED_FROM_OUTSIDE:  # not by us (we SIGKILL), not a crash: the task retries
        log.warning("the PDF reader was stopped by signal %s while reading %s", -code, name)
        raise RuntimeError(f"the PDF reader was stopped by signal {-code} from outside")
    # Killed by a signal (a crash: pdfium aborts when an allocation fails, too) or broken.
    if code > 0 and _LAUNCH_FAILED.search(err.decode("utf-8", "replace")):
        # it never got to the file: our deployment is broken, the task tries again
        log.error("the PDF reader could not start for %s (exit %s): %s", name, code, tail)
        raise RuntimeError(f"the PDF reader could not start (exit {code}): {tail}")
    log.warning("the PDF reader failed on %s (exit %s): %s", name, code, tail)
    raise IngestError(
        f"{name}: the PDF reader failed on it (it may be damaged, or need more memory than "
        f"the {memory_mb} MB I allow for one PDF)."
    ) from RuntimeError(f"pdf reader child exited with {code}: {tail}")


def _too_big(name: str, memory_mb: int) -> str:
    return f"{name}: reading it needs more memory than I allow for one PDF ({memory_mb} MB)."


def _say_uncapped(why: str) -> None:
    """Warn, once per reason, that the readers run without their memory cap (the system
    refused it): only their timeout bounds them, which the operator should know; a reason that
    appears only later (statm unreadable after a while, say) is said too."""
    if why not in _uncapped_said:
        _uncapped_said.add(why)
        log.warning("the PDF reader runs without its memory cap (%s); its timeout bounds it", why)


def _pdf_text(reply: dict[str, Any]) -> PdfText:
    """The child's text, checked: its output is data from a process that parsed the file.
    A reply of the wrong shape is a RuntimeError (retried): our child wrote it, not the file."""
    try:
        paragraphs = [(str(s), str(t)) for s, t in reply["paragraphs"]]
        pages = [int(p) for p in reply["paragraph_pages"]]
        if len(pages) != len(paragraphs):
            raise ValueError("paragraphs and pages differ in number")
        return PdfText(str(reply["title"]), int(reply["pages"]), paragraphs, pages)
    except (KeyError, ValueError, TypeError) as exc:
        raise RuntimeError(f"the PDF reader's reply is malformed: {exc!r}") from exc


def _limit_memory(extra_mb: int, statm: str = STATM) -> str | None:
    """Cap the address space at what the process maps now (read from `statm`) plus
    `extra_mb`, or the hard limit it inherited if lower (raising it is refused, and that one
    applies all the same); None when capped, else why not. Where it cannot be set (no /proc on
    macOS, a system refusing RLIMIT_AS) the read goes on without it: the timeout still bounds
    it, and a missing cap is not the file's fault (the parent logs each reason once:
    `_outcome`)."""
    import resource

    try:
        with open(statm) as pages:
            mapped = int(pages.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + extra_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, IndexError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _kill_me_first() -> None:
    """Ask the kernel to pick this child, not the bot, when memory runs out (best effort:
    raising one's own score needs no privilege, but /proc may be read-only)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as score:
            score.write("1000")
    except OSError:
        pass


def prepare(memory_mb: int, statm: str = STATM) -> str | None:
    """What the child does before it opens a PDF: first to die, and its memory capped where
    the system allows it (`_limit_memory`; `statm`: where its mapped size is read). Returns
    why it is not capped, if it is not."""
    _kill_me_first()
    return _limit_memory(memory_mb, statm)


def ignore_platform_stop() -> None:
    """The platform's SIGTERM to every process is for the bot, which ends this child itself."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _main() -> None:
    ignore_platform_stop()  # first thing (one that came earlier is retried, see _outcome)
    limits = json.loads(sys.argv[1])
    data = sys.stdin.buffer.read()
    try:
        uncapped = prepare(int(limits["memory_mb"]))
    except Exception as exc:  # before the file is opened: our setup's failure, not the file's
        sys.stdout.write(json.dumps({"unprepared": f"{type(exc).__name__}: {exc}"}))
        return
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
    if uncapped:
        reply["uncapped"] = uncapped
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    _main()
