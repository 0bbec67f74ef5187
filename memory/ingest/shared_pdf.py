"""PDFs shared in chat: the bytes of one file into the tenant's knowledge base, for the place.

A PDF shared in a public channel is the whole team's; one shared in a private channel or a DM
is found only there (`Scope.audience`, kept on each chunk and on the paper's record). A file is
known by the SHA-256 of its bytes: sharing it again where a copy is visible (the team's, or
this place's own) answers with that copy, and a copy elsewhere is never revealed. A place's
copy lists each share that holds it (its thread, sharer, link and file name): it goes with the
last of them, and its link and file name are those of the first share that stays.
The paper's id is made from the hash and the audience, so each private place keeps its own copy
and a redelivered task writes the same keys again (idempotent). Downloading is the platforms'
business (adapters/); this module gets bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import PurePath
from typing import Any

import numpy as np
from redis.asyncio import Redis

from memory.ingest.chunking import chunk_paragraphs
from memory.ingest.errors import IngestError
from memory.ingest.pdf import PdfText, check_passages
from memory.ingest.pdf_child import read_pdf_in_child
from memory.keys import shared_pdf_key, shared_pdf_lock_key
from memory.locks import OwnedLocks
from memory.scope import PUBLIC, Scope
from memory.stores.knowledge_base import Chunk, KnowledgeBase, Paper, PaperKept, shares_of

EMBED_BATCH = 128
PROGRESS_TTL_SECONDS = 7 * 86400  # long past any redelivery of the task


@dataclass(frozen=True)
class SharedFile:
    """One file as shared: its name, where citations link, and the share's own id."""

    name: str
    link: str  # a Slack permalink, a Discord message link: where a citation points
    origin: str  # the platform's id of this share (file and message), to know a redelivery
    sharer: str = ""  # the platform's user id of who shared it (forgetting them forgets it)


@dataclass(frozen=True)
class SavedPdf:
    arxiv_id: str
    title: str
    pages: int
    passages: int
    audience: str
    already: bool  # a copy was there before this share (not written again)


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shared_pdf_id(digest: str, audience: str) -> str:
    """The knowledge-base id of a shared PDF: the team's copy, or one place's own."""
    if audience == PUBLIC:
        return f"pdf-{digest[:16]}"
    return f"pdf-{hashlib.sha256(f'{audience}|{digest}'.encode()).hexdigest()[:16]}"


def title_of(text: PdfText, name: str) -> str:
    return text.title or PurePath(name).stem or name or "Untitled PDF"


async def find_copy(kb: KnowledgeBase, scope: Scope, digest: str) -> dict[str, Any] | None:
    """A stored copy of the PDF with this hash that `scope` may see (the team's first)."""
    for audience in dict.fromkeys((PUBLIC, scope.audience)):
        record = await kb.paper(scope, shared_pdf_id(digest, audience))
        if record is not None:
            return record
    return None


def _saved(record: dict[str, Any], already: bool) -> SavedPdf:
    return SavedPdf(
        arxiv_id=record["arxiv_id"], title=record.get("title", ""),
        pages=int(record.get("pages") or 0), passages=int(record.get("chunks") or 0),
        audience=record.get("audience") or PUBLIC, already=already,
    )  # fmt: skip


def _chunks(text: PdfText, encoding) -> list[Chunk]:
    """The PDF's chunks, each with the page it starts on (citations link `#page=N`)."""
    return chunk_paragraphs(text.located(), encoding)


async def save_shared_pdf(
    data: bytes, shared: SharedFile, scope: Scope, kb: KnowledgeBase, embedder, encoding,
    max_bytes: int, max_pages: int | None = None,
) -> SavedPdf:  # fmt: skip
    """Read a shared PDF into the knowledge base for `scope`'s audience, unless a copy it may
    see is there. Raises IngestError, with a message for the person who shared it, for a file
    too large (bytes, pages, text or passages for its pages), not a PDF, encrypted, without
    text, or that the reader fails on (it runs in a child process: memory/ingest/pdf_child.py).
    The paper's record is written after its chunks: a failure half-way leaves no paper (and a
    redelivery writes the same chunks)."""
    if len(data) > max_bytes:
        raise IngestError(
            f"{shared.name}: it is {_mb(len(data))}, and I read PDFs up to {_mb(max_bytes)}."
        )
    digest = content_hash(data)
    copy = await find_copy(kb, scope, digest)
    origins = [share.get("origin") for share in shares_of(copy)] if copy is not None else []
    if copy is not None and shared.origin in origins:  # the same share delivered again: as it
        return _saved(copy, already=origins[0] != shared.origin)  # was (the first: saved by it)
    if copy is not None and await _held_by(kb, scope, copy, shared):
        return _saved(copy, already=True)
    text = await read_pdf_in_child(data, shared.name, max_pages)  # pages checked first
    chunks = await asyncio.to_thread(_chunks, text, encoding)
    if not chunks:
        raise IngestError(f"{shared.name}: no text to store (a scanned PDF needs OCR first).")
    check_passages(shared.name, len(chunks), max_pages)
    texts = [c.text for c in chunks]
    vectors = np.concatenate(
        [
            await embedder.embed(texts[i : i + EMBED_BATCH])
            for i in range(0, len(texts), EMBED_BATCH)
        ]
    )
    paper = Paper(
        arxiv_id=shared_pdf_id(digest, scope.audience), title=title_of(text, shared.name),
        url=shared.link, source="pdf",
    )  # fmt: skip
    for _ in range(2):  # the copy kept, then forgotten before this share joined it: once more
        try:
            await kb.add_paper(
                scope, paper, chunks, vectors, audience=scope.audience, keep=_same_file(digest),
                sha256=digest, origin=shared.origin, pages=text.pages, file_name=shared.name,
                sharer=shared.sharer, thread=scope.thread,
            )  # fmt: skip
            break
        except PaperKept:  # another share of the file saved it meanwhile: this one joins it
            copy = await kb.paper(scope, paper.arxiv_id)
            if copy is not None and await _held_by(kb, scope, copy, shared):
                return _saved(copy, already=True)
    else:
        raise IngestError(f"{shared.name}: it was being forgotten as I read it; share it again.")
    record = await kb.paper(scope, paper.arxiv_id)
    if record is None:  # forgotten at once by someone else: say what was done all the same
        record = {"arxiv_id": paper.arxiv_id, "title": paper.title, "pages": text.pages,
                  "chunks": len(chunks), "audience": scope.audience}  # fmt: skip
    return _saved(record, already=False)


def _same_file(digest: str) -> Callable[[dict[str, Any]], str | None]:
    """`add_paper`'s `keep`: a record stored meanwhile for the same bytes (another share of the
    file, in another thread of the place, read it at the same time) stays, with its shares;
    replaced, it would list only this one, and that thread's erasure would take the PDF from
    under the other share."""

    def keep(stored: dict[str, Any]) -> str | None:
        return "the same file, saved by another share" if stored.get("sha256") == digest else None

    return keep


def _share(shared: SharedFile, scope: Scope) -> dict[str, Any]:
    """One share of a PDF, as its record lists it (memory/stores/knowledge_base.py `shares_of`):
    with its own link and file name, which the record takes when it is the first share left."""
    return {
        "thread": scope.thread,
        "sharer": shared.sharer,
        "origin": shared.origin,
        "at": time.time(),
        "link": shared.link,
        "file_name": shared.name,
    }


async def _held_by(
    kb: KnowledgeBase, scope: Scope, copy: dict[str, Any], shared: SharedFile
) -> bool:
    """Whether the copy found serves this share. The team's does, as it is. A place's own copy
    lists this share too (once, whatever its redeliveries), under the paper's save lock: its
    thread's or sharer's erasure (memory/governance.py `_shared_pdfs`) then forgets the PDF
    only with the last share that holds it, not from under this one's thread. False when the
    place's copy went meanwhile: this share reads the file again."""
    if (copy.get("audience") or PUBLIC) == PUBLIC:
        return True
    async with kb.holding(scope.tenant, copy["arxiv_id"]):
        record = await kb.paper(scope, copy["arxiv_id"])
        if record is None:
            return False
        shares = shares_of(record)
        if all(share.get("origin") != shared.origin for share in shares):
            await kb.put_shares(scope.tenant, record, [*shares, _share(shared, scope)])
    return True


def _mb(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"


class ShareProgress:
    """What a task reading a shared file has shown and found, kept so a redelivered task edits
    its message instead of posting again, and repeats an outcome instead of redoing it."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @cached_property
    def _locks(self) -> OwnedLocks:
        """Made on first use: wiring a process needs no Redis yet."""
        return OwnedLocks(self.redis)

    async def get(self, tenant: str, share_id: str) -> dict[str, Any]:
        rows = await self.redis.hgetall(shared_pdf_key(tenant, share_id))
        return {_text(k): json.loads(v) for k, v in rows.items()}

    async def lock(self, tenant: str, share: str, token: str, seconds: float) -> bool:
        """Take the share's lock (SET NX) for `seconds`; False while another copy holds it."""
        return await self._locks.acquire(shared_pdf_lock_key(tenant, share), token, _ms(seconds))

    async def renew(self, tenant: str, share: str, token: str, seconds: float) -> bool:
        """Make the lock last `seconds` from now if it is still ours (atomically); False if it
        is not (it expired, and may have been taken by another copy, whose lock stays as is)."""
        return await self._locks.renew(shared_pdf_lock_key(tenant, share), token, _ms(seconds))

    def kept(self, tenant: str, share: str, token: str, seconds: float, max_ms: int):
        """The lock taken (`lock`), renewed while the share runs, for up to `max_ms`, and
        released at the end (`OwnedLocks.kept`)."""
        key = shared_pdf_lock_key(tenant, share)
        return self._locks.kept(key, token, _ms(seconds), max_ms, name=f"share-lock:{share}")

    async def unlock(self, tenant: str, share: str, token: str) -> None:
        """Release the lock if it is still ours (it may have expired and been taken)."""
        await self._locks.release(shared_pdf_lock_key(tenant, share), token)

    async def attempt(self, tenant: str, share: str) -> int:
        """Count one more run of the share's task; the count (1 the first time)."""
        key = shared_pdf_key(tenant, share)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "attempts", 1)
            pipe.expire(key, PROGRESS_TTL_SECONDS)
            count, _ = await pipe.execute()
        return int(count)

    async def restart(self, tenant: str, share: str, files: int, requeue: str) -> None:
        """A share's task requeued from its dead letter (`requeue`: its id): once per requeue,
        its runs are counted from 0 and its files' outcomes forgotten, so they are read again
        (their messages are kept, to be edited to the new outcome)."""
        key = shared_pdf_key(tenant, share)
        if await self.redis.hget(key, "requeued") == json.dumps(requeue).encode():
            return  # this requeue's run started over already: a redelivery counts on
        async with self.redis.pipeline(transaction=True) as pipe:
            for index in range(files):
                pipe.hdel(shared_pdf_key(tenant, f"{share}:{index}"), "outcome")
            pipe.hset(key, mapping={"attempts": 0, "requeued": json.dumps(requeue)})
            pipe.expire(key, PROGRESS_TTL_SECONDS)
            await pipe.execute()

    async def set(self, tenant: str, share_id: str, **fields: Any) -> None:
        key = shared_pdf_key(tenant, share_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={k: json.dumps(v) for k, v in fields.items()})
            pipe.expire(key, PROGRESS_TTL_SECONDS)
            await pipe.execute()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
