"""The memory page's export and import (their routes: pages.py, which checks who may).

An export streams JSON Lines as it is read; a thread's, to someone who does not manage the
tenant, holds only what its page shows them (`visible`). An import's file is streamed to a
temporary file (at most MAX_IMPORT_BYTES), after the access guard read its form's first field,
the CSRF token (server.py `IMPORT_FORM`), then read twice by `memory.portability`.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import IO, Any

from aiohttp import BodyPartReader, web

from adapters.memory_page.server import MAX_IMPORT_BYTES, MB
from adapters.memory_page.viewer import IMPORT_FORM, Viewer
from memory.portability import ImportInterrupted, Left, Portability, TenantNotEmpty, dumps
from memory.portability_check import END, PLURALS
from memory.portability_export import end_line
from memory.scope import legacy_audience

log = logging.getLogger(__name__)

UPLOAD_CHUNK_BYTES = 65_536  # an import's file is written to a temporary file by these
EXPORT_CHUNK_BYTES = 65_536  # an export's lines are sent by about these
TOO_LARGE_IMPORT = f"The file is too large: an import takes {MAX_IMPORT_BYTES // MB} MB at most."
UNREADABLE_IMPORT = "The upload could not be read: choose the file and import it again."
NO_FILE = "Choose a JSON Lines file to import."
NOT_UTF8 = "The file is not UTF-8 text."
# The page's own words where the import's text advises what only the command line can do
# (another tenant, `arxivscout memory forget tenant`): an admin here imports into their own
# workspace, and empties it with the page's Forget buttons and the bot's `/watch remove`.
EMPTY_IT_FIRST = (
    "forget what it holds first (its threads, papers, entities and workflows on these pages, "
    "its topic watches with /watch remove), then import"
)
NOT_EMPTY = (
    "This workspace's memory is not empty, and an export is imported into an empty memory "
    f"only (two memories would be mixed): {EMPTY_IT_FIRST}. Nothing was imported."
)
CRASHED_AND_USED = (
    "This workspace's memory holds part of an import that stopped{when}, and it was used "
    "after that: importing again would erase what was added since, so it is left as it is. "
    f"To import, {EMPTY_IT_FIRST}. Nothing was imported."
)
USED_MEANWHILE = (
    "The import failed while it wrote ({failure}). Part of it is still there, and this "
    "workspace's memory was used while it ran, so it was kept, and importing is refused now: "
    f"{EMPTY_IT_FIRST} again."
)


class UploadTooLarge(Exception):
    """An import's file is over MAX_IMPORT_BYTES."""


class ImportFailed(Exception):
    """Nothing was imported: the message says why, for the page."""


def said_here(exc: Exception) -> str:
    """What the page says of an import refused or failed: the import's own text, but where
    that advises the command line (the tenant not empty, a crashed import's part used since,
    part of a failed one kept because the memory was used meanwhile): the page's wording."""
    if isinstance(exc, TenantNotEmpty):
        if exc.crashed_at is None:
            return NOT_EMPTY
        return CRASHED_AND_USED.format(when=exc.when_crashed)
    if isinstance(exc, ImportInterrupted) and exc.left is Left.USED:
        return USED_MEANWHILE.format(failure=exc.failure)
    return str(exc)


def filename(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))[:120] + ".jsonl"


async def ndjson(records: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """An export's records as JSON Lines, in chunks of about EXPORT_CHUNK_BYTES."""
    buffer: list[bytes] = []
    size = 0
    async for record in records:
        line = (dumps(record) + "\n").encode()
        buffer.append(line)
        size += len(line)
        if size >= EXPORT_CHUNK_BYTES:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


async def visible(records: AsyncIterator[dict], viewer: Viewer) -> AsyncIterator[dict]:
    """A thread's export as the viewer may see it: each message, summary, tool log and turn is
    checked by its own audience (the thread's first message decides only whether it is listed),
    and a turn's feedback is only what the thread's page shows (`own_feedback`). For someone who
    does not manage the tenant, the thread's summarized-prefix counter is left out (it counts
    messages that may be left out: an import counts it again), and the end line counts what
    was kept."""
    counts: Counter[str] = Counter()
    async for record in records:
        kind = record.get("kind", "")
        item = record.get(kind)
        if kind == END:
            yield end_line(counts)
            continue
        if kind == "thread" and not viewer.manages:
            record = {k: v for k, v in record.items() if k != "summarized"}
        elif not isinstance(item, dict) or "audience" not in item:
            pass  # the header, the thread's own line
        elif viewer.can_see(item["audience"] or legacy_audience(record.get("thread", ""))):
            if kind == "turn" and not viewer.manages:
                record = {**record, "turn": own_feedback(item, viewer.user)}
        else:
            continue
        if kind in PLURALS:
            counts[PLURALS[kind]] += 1
        yield record


def own_feedback(turn: dict[str, Any], user: str) -> dict[str, Any]:
    """A turn's record as someone who does not manage the tenant may export it: the rating (the
    votes summed, as its thread's page shows it) and their own vote and comment, not who else
    voted nor what they wrote."""
    votes = [v for v in turn.get("feedback") or [] if isinstance(v, dict)]
    rating = sum(v["rating"] for v in votes if isinstance(v.get("rating"), int))
    mine = [v for v in votes if v.get("user") == user]
    return {**turn, "rating": rating, "feedback": mine}


async def stream_export(
    request: web.Request, records: AsyncIterator[dict[str, Any]], name: str
) -> web.StreamResponse:
    """The export as a download named `name`. A failure before its first chunk is raised (an
    error page); a later one cuts the body, so the download shows failed."""
    chunks = ndjson(records)
    first = await anext(chunks, b"")  # a failure this early is still an error page
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/x-ndjson",
            "Content-Disposition": f'attachment; filename="{name}"',
        }
    )
    await response.prepare(request)
    try:
        await response.write(first)
        async for chunk in chunks:
            await response.write(chunk)
    except Exception:  # too late for a page: cut the body, so the download shows failed
        log.exception("memory page: the export of %s failed midway", name)
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response


async def receive_import(request: web.Request, form: dict[str, str], into: IO[bytes]) -> bool:
    """The import form, streamed as it arrives after the guard read its CSRF field
    (`IMPORT_FORM`): its small fields into `form` (each at most the request's form size: 413),
    its file into `into` (at most MAX_IMPORT_BYTES: UploadTooLarge); whether a file was sent.
    ValueError: a broken form."""
    reader = request[IMPORT_FORM]
    sent, size = False, 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            await part.release()  # a multipart inside: no field of this form
        elif part.name == "file" and part.filename and not sent:
            sent = True
            while chunk := await part.read_chunk(UPLOAD_CHUNK_BYTES):
                data = part.decode(chunk)
                size += len(data)
                if size > MAX_IMPORT_BYTES:
                    raise UploadTooLarge
                into.write(data)
        else:
            value = await part.text()
            if part.name == "back":
                form["back"] = value
    return sent


async def import_upload(
    request: web.Request, form: dict[str, str], portability: Portability, tenant: str
) -> dict[str, int]:
    """The uploaded export imported into `tenant` (`portability.import_lines`): what was made,
    by kind. The form's small fields go into `form` (where to go back), even when it fails.
    ImportFailed: nothing was imported (too large, unreadable, no file, not UTF-8, not an
    export, a bad line, the tenant is not empty or being imported into), or the import failed
    while it wrote (`ImportInterrupted`: its message says what the tenant holds now)."""
    with tempfile.TemporaryFile() as upload:
        try:
            sent = await receive_import(request, form, upload)
        except (UploadTooLarge, web.HTTPRequestEntityTooLarge):
            raise ImportFailed(TOO_LARGE_IMPORT) from None
        except ValueError:  # a broken multipart form
            raise ImportFailed(UNREADABLE_IMPORT) from None
        if not sent:
            raise ImportFailed(NO_FILE)

        def lines() -> Iterable[str]:  # read afresh for each of the import's two passes
            upload.seek(0)
            return (raw.decode("utf-8") for raw in upload)

        try:
            return await portability.import_lines(tenant, lines)
        except UnicodeDecodeError:
            raise ImportFailed(NOT_UTF8) from None
        except ValueError as exc:  # not an export, a bad line, the tenant not empty or busy
            raise ImportFailed(said_here(exc)) from None
        except ImportInterrupted as exc:  # Redis or the embedding model failed during the writes
            log.exception("memory page: the import into %s failed", tenant)
            raise ImportFailed(said_here(exc)) from None
