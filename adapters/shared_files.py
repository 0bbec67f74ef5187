"""Files shared in chat, read as durable background work: the task every platform queues.

A platform's listener only queues one task per message (`SHARED_FILES`, on the Redis stream of
`bot/background.py`) with the message's files, its scope, where to reply, and the message's text
as a turn to queue afterwards; the bytes are not in the task, they are fetched when it runs.
Each platform has its own stream (`shared-files-<platform>`), read only in a process whose
adapter holds that platform's token (`SharedFiles.attach`, as bot/watches.py does for digests):
a `chat` or `ask` process, or one with Slack's token only, never takes a Discord share.

    per file: describe (size, type) -> "Reading <name>…" -> download -> into the knowledge
    base (memory/ingest/shared_pdf.py) -> the message edited to the outcome
    then: the message's text queued as a turn, so the question sees the PDF, with a note
    naming the PDFs it came with (`shared_with`): its search and the thread's later turns
    find that paper, not only the one whose words best match "what are the key takeaways?"

Delivery is at least once, one task at a time; a dead process's is taken over after
CLAIM_IDLE_MS. A share's task holds a lock in Redis while it runs, so two copies (a redelivery,
Slack's retry) never read or post at once; it is renewed every third of its lifetime however
long a read runs, up to the task's max run (bot/background.py: then the task is taken for hung
and may run elsewhere). A dead process's lock lapses within CLAIM_IDLE_MS, a hung one's that
long after its max run. The message posted and each outcome are kept in Redis (`ShareProgress`),
so a redelivered task edits its own message and says the same thing; the turn is queued under
the message's event id, so never twice. Posting and editing are best effort: a message that
cannot be edited is posted anew, one that cannot be posted is logged, and the turn is queued
anyway. What a person can fix (not a PDF, too large, encrypted, no text) is the file's outcome
at once; what may pass (Slack's 5xx, a download or the embedding API failing quickly) is
tried again within the task (`Patience`: after RETRY_DELAYS, while the task's RETRY_SECONDS
last; never a step that ran long, a download timing out, nor the PDF's read: only the lookup,
the download and each embedding call), then it (or Redis away) runs again, and
becomes the outcome, in words, on the last delivery: there every failure is
said, and the message's text is queued as a turn all the same (only Redis failing as that is
kept or queued makes the task run again, while it can). A last delivery that never ends (its
process died) is not run again: `given_up` says it and queues the turn the same way.

A share whose message was deleted on the platform is not read (the deletion's note lasts a
day), nor one queued before its sharer was erased (`forget_person`'s note), nor one whose
channel or thread was deleted on the platform (`forget_place`'s note, a day), nor one queued
before its whole tenant's erasure; one whose read spanned any of these forgets what it saved,
says so in its messages where they still are ("Not kept", why only where that tells no one of a
person's erasure: `not_kept`), and queues no turn. A requeued
share,
or one queued more than LATE_SECONDS ago, may run after a deletion's note lapsed: one whose
turn was queued already then runs only if its message is still stored (not a tombstone); one
first run late (the bot down overnight) is read as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import PurePath
from typing import Any, Protocol, TypeVar

from bot.background import MAX_RUN_MS, BackgroundWork, close_all, stop_reading_all
from bot.spent_tasks import last_delivery
from bot.watch_texts import chat_command
from memory.embeddings import EmbeddingError
from memory.erased_people import ErasedPeople
from memory.errors import in_passing
from memory.governance_erasure import NotFound
from memory.governance_purge import DELETED_NOTE_SECONDS
from memory.governance_tenants import erased_at as tenant_erased_at
from memory.ingest.errors import IngestError
from memory.ingest.shared_pdf import SavedPdf, SharedFile, ShareProgress, save_shared_pdf
from memory.keys import papers_key, shared_pdf_key, task_stream
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.base import decode, delete_keys
from memory.stores.knowledge_base import shares_of
from memory.tasks import TaskStream, requeued

log = logging.getLogger(__name__)
T = TypeVar("T")

SHARED_FILES = "shared_files"  # the background task's kind
STREAM_PREFIX = "shared-files"  # one stream per platform: shared-files-slack, -discord
CLAIM_IDLE_MS = 600_000  # a dead process's share is taken over after this; the share's lock
# lasts as long unless renewed (a live process renews it, and keeps its tasks alive, however long
# a read runs, up to MAX_RUN_MS: bot/background.py)
MAX_DELIVERIES = 5
# a failure that may pass (`may_pass`) is tried again after each of these, within the task
# (`Patience`): most pass in seconds, where the task's redelivery waits CLAIM_IDLE_MS with
# "Reading…" up; a retry starts only within RETRY_SECONDS of the task's start (all its files),
# and never after a step that ran LONG_STEP_SECONDS (a download timing out: its redelivery's)
RETRY_DELAYS = (10.0, 30.0)
RETRY_SECONDS = 90.0
LONG_STEP_SECONDS = 20.0
LATE_SECONDS = DELETED_NOTE_SECONDS / 2  # a share older may outlive its deletion's note
TENANT_ERASED = "the workspace's memory was erased since"
PERSON_ERASED = "the person who shared it was erased since"
PLACE_DELETED = "its channel or thread was deleted"
ERASED = (TENANT_ERASED, PERSON_ERASED, PLACE_DELETED)  # what a run saved goes with the share
READING = "_Reading {name}…_"
PDF_TYPES = {"application/pdf", "application/x-pdf"}
NOTE_TITLE_CHARS = 150  # a title in a turn's note (`shared_with`): a PDF's may run long


class FetchError(Exception):
    """A file could not be downloaded; the message says why, for the person who shared it.
    `retryable`: it may pass (a timeout, a 5xx), so the task runs again before saying so."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ShareBusy(Exception):
    """Another copy of this share's task holds its lock: this one runs again later."""


class FileEnd(Protocol):
    """One platform's side of the task: details of a file, its bytes, and the reply."""

    async def describe(self, file: dict[str, Any]) -> dict[str, Any]:
        """The file with its size, type and download address (asked of the platform when the
        event lacked them)."""

    async def fetch(self, file: dict[str, Any], max_bytes: int) -> bytes:
        """The file's bytes; FetchError when it cannot be had or exceeds `max_bytes`."""

    async def post(self, reply: dict[str, Any], text: str) -> str:
        """Post `text` where `reply` says; the posted message's id."""

    async def edit(self, reply: dict[str, Any], message: str, text: str) -> None:
        """Replace the text of a message this task posted."""


def oversized(name: str, size: int | None, max_bytes: int) -> str:
    """The one wording for a file over the size limit (known before or during the download)."""
    size_text = _mb(size) if size is not None else f"over {_mb(max_bytes)}"
    return f"{name} is {size_text}; I read PDFs up to {_mb(max_bytes)}."


def file_name(file: dict[str, Any]) -> str:
    """A file as its messages name it."""
    return str(file.get("name") or "the file")


def _file_ids(share: str, files: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each file of a share with its id (`<share>:<index>`), under which its progress is kept."""
    return [(f"{share}:{index}", file) for index, file in enumerate(files)]


def is_pdf(file: dict[str, Any]) -> bool:
    name = str(file.get("name") or "").lower()
    mimetype = str(file.get("mimetype") or "").split(";")[0].strip().lower()
    return mimetype in PDF_TYPES or file.get("filetype") == "pdf" or name.endswith(".pdf")


def kind_of(file: dict[str, Any]) -> str:
    """What a file is, in words ("a PNG image", "a text/plain file")."""
    if file.get("kind"):
        return str(file["kind"])
    mimetype = str(file.get("mimetype") or "").split(";")[0].strip()
    suffix = PurePath(str(file.get("name") or "")).suffix.lstrip(".").upper()
    if mimetype.startswith("image/"):
        return f"an image ({mimetype})"
    if mimetype:
        return f"a {mimetype} file"
    return f"a .{suffix.lower()} file" if suffix else "a file of unknown type"


def place_of(scope: Scope) -> str:
    return {
        Visibility.PUBLIC: "the knowledge base of this team",
        Visibility.PRIVATE: "the knowledge base of this channel (found only here)",
        Visibility.DM: "the knowledge base of this conversation (found only here)",
    }[scope.visibility]


def saved_text(saved: SavedPdf, scope: Scope) -> str:
    if saved.already:
        return f"Already in the knowledge base as *{saved.title}*."
    pages = f"{saved.pages} pages, " if saved.pages else ""
    return f"Saved *{saved.title}* ({pages}{saved.passages} passages) to {place_of(scope)}."


def shared_with(papers: list[dict[str, str]]) -> str:
    """The note a share's turn carries below its text: each PDF saved from it (or found there
    already) as the model can use it, by its title and the id its passages show
    (`[PDF:pdf-…]`, which search_knowledge_base takes). Kept in the conversation with the
    question, so the question's search and the thread's later turns are tied to the PDF, not
    to whichever paper best matches its words ("what are the key takeaways?"). A file not
    read is not named: its message says so, just before the answer."""
    titles = [_one_line(paper["title"] or "an untitled PDF")[:NOTE_TITLE_CHARS] for paper in papers]
    named = [f"*{title}* [PDF:{paper['id']}]" for title, paper in zip(titles, papers, strict=True)]
    return f"(shared with this message: {'; '.join(named)})" if named else ""


def with_note(text: str, note: str) -> str:
    """A question with a note below it (`shared_with`'s, or Slack's on files not read); a
    watch command, or no note, leaves it as it is (the note would join the command's topic)."""
    return text if not note or chat_command(text) is not None else f"{text}\n\n{note}"


def _one_line(text: str) -> str:
    """A title as the note holds it: one line, without the brackets that mark ids."""
    return " ".join(str(text).replace("[", "(").replace("]", ")").split())


def fetch_failed(exc: FetchError) -> str:
    """A download's failure, said on the last delivery (one that may pass was tried again)."""
    return str(exc) + (" I tried several times; share it again later." if exc.retryable else "")


def may_pass(exc: BaseException) -> bool:
    """Whether a failure is worth trying again in a moment: a download marked so (a timeout, a
    5xx), or the embedding API unreachable, throttled or erring itself (not a refused key)."""
    if isinstance(exc, FetchError):
        return exc.retryable
    return isinstance(exc, EmbeddingError) and in_passing(exc)


class Patience:
    """One task's retries of its steps that may pass: each step (`attempt`) tried again after
    each of `delays` while it fails in a way that may pass (`may_pass`), quickly (within
    `long_step` seconds: a step that ran long, a download timing out, is not run again here),
    and the retry starts before the task's `deadline` (on `clock`; shared by all its files).
    Then its failure is raised: the task runs again later, or says it on its last delivery.
    A wait ends when the process stops (`stop`), its failure raised then: a closing process
    waits for its running tasks, not for their retries."""

    def __init__(
        self, delays: tuple[float, ...], seconds: float, long_step: float, stop: asyncio.Event,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:  # fmt: skip
        self.delays, self.long_step, self.stop = delays, long_step, stop
        self.clock, self.sleep = clock, sleep
        self.deadline = clock() + seconds

    async def attempt(self, step: Callable[[], Awaitable[T]]) -> T:
        delays = iter(self.delays)
        while True:
            started = self.clock()
            try:
                return await step()
            except Exception as exc:
                now, delay = self.clock(), next(delays, None)
                if (
                    not may_pass(exc) or delay is None or now - started > self.long_step
                    or now + delay > self.deadline
                ):  # fmt: skip
                    raise
                log.info("a shared file's step failed (%r); trying again in %.0f s", exc, delay)
                if await self._stopped_during(delay):
                    raise

    async def _stopped_during(self, delay: float) -> bool:
        """Wait `delay` seconds, unless the process stops first; whether it stopped."""
        if self.stop.is_set():
            return True
        waits = [asyncio.ensure_future(self.sleep(delay)), asyncio.ensure_future(self.stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return self.stop.is_set()


class PatientEmbedder:
    """The memory's embedder for one save, each call tried again (`Patience`): an embedding
    failure that may pass redoes that call only, never the PDF's read before it."""

    def __init__(self, embedder: Any, patience: Patience) -> None:
        self.embedder, self.patience = embedder, patience

    async def embed(self, texts: list[str]) -> Any:
        return await self.patience.attempt(lambda: self.embedder.embed(texts))

    @property
    def dims(self) -> int:
        return self.embedder.dims

    @property
    def model_name(self) -> str:
        return self.embedder.model_name


def not_kept(why: str, scope: Scope) -> str:
    """A share's message once what it saved went with an erasure (`_erased`). In a channel a
    person's erasure alone is not said: every member would learn of it (the workspace's erasure
    or the place's deletion is no one's secret)."""
    if scope.visibility is Visibility.DM or why != PERSON_ERASED:
        return f"Not kept: {why}."
    return "Not kept."


def went_wrong(name: str) -> str:
    """Any other failure of the last delivery (a bug, Redis or the embedding API away)."""
    return (
        f"Sorry, I could not read {name}: something went wrong on my side "
        "(tried several times); share it again later."
    )


def _mb(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"


class SharedFiles:
    """Runs `SHARED_FILES` tasks: each file of a message read into the knowledge base."""

    def __init__(
        self, memory: Any, encoding: Any, ends: Mapping[str, FileEnd],
        max_bytes: int, max_pages: int | None = None, stream_prefix: str = STREAM_PREFIX,
        lock_seconds: float = CLAIM_IDLE_MS / 1000, max_run_ms: int = MAX_RUN_MS,
        retry_delays: tuple[float, ...] = RETRY_DELAYS, retry_seconds: float = RETRY_SECONDS,
        long_step_seconds: float = LONG_STEP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:  # fmt: skip
        self.memory, self.encoding, self.ends = memory, encoding, dict(ends)
        self.max_bytes, self.max_pages = max_bytes, max_pages
        self.stream_prefix = stream_prefix
        self.lock_seconds, self.max_run_ms = lock_seconds, max_run_ms
        self.retry_delays, self.retry_seconds = retry_delays, retry_seconds
        self.long_step_seconds = long_step_seconds
        self.clock, self.sleep = clock, sleep  # the retries' (`Patience`)
        self.stopping = asyncio.Event()  # set as the process closes: no retry waits then
        self.progress = ShareProgress(memory.redis)
        self.workers: dict[str, BackgroundWork] = {}

    def stream(self, platform: str) -> TaskStream:
        return TaskStream(self.memory.redis, task_stream(f"{self.stream_prefix}-{platform}"))

    def attach(self, platform: str) -> None:
        """This process holds `platform`'s token (its adapter runs here): read its stream
        (from now if an event loop runs, else from the first submit)."""
        if platform not in self.ends:
            raise LookupError(f"{platform} is not configured in this process")
        if platform not in self.workers:
            self.workers[platform] = BackgroundWork(
                self.stream(platform), {SHARED_FILES: self.run}, batch=1, workers=2,
                claim_idle_ms=CLAIM_IDLE_MS, max_deliveries=MAX_DELIVERIES,
                max_run_ms=self.max_run_ms, on_dead_letter={SHARED_FILES: self.given_up},
            )  # fmt: skip
        with contextlib.suppress(RuntimeError):  # no running loop (yet)
            asyncio.get_running_loop()
            self.workers[platform].start()

    async def submit(self, platform: str, payload: dict[str, Any]) -> str:
        """Queue a share on its platform's stream (in Redis before this returns), with when:
        on Redis's clock, as a tenant's erasure note is (`_erased` compares the two)."""
        seconds, micros = await self.memory.redis.time()
        payload = {**payload, "queued_at": seconds + micros / 1e6}
        task_id = await self.stream(platform).add(SHARED_FILES, payload)
        if platform in self.workers:
            self.workers[platform].start()
        return task_id

    async def drain(self) -> None:
        for work in self.workers.values():
            await work.drain()

    async def stop_reading(self) -> None:
        """Close's first half (a process closing several parts does this for all first); the
        running tasks' retries stop waiting (`Patience`), so closing waits for no retry."""
        self.stopping.set()
        await stop_reading_all(self.workers.values())

    async def close(self) -> None:
        self.stopping.set()
        await close_all(self.workers.values())
        self.workers.clear()
        self.stopping.clear()  # nothing runs now: workers attached again wait as usual

    async def run(self, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            await self.one(payload)

    async def one(self, payload: dict[str, Any]) -> None:
        """One share: its files, then its turn; under the share's lock (ShareBusy if held)."""
        platform = payload["platform"]
        end = self.ends.get(platform)
        if end is None:  # only a misrouted task: each stream is read where its token is
            raise LookupError(f"{platform} is not configured in this process")
        scope = Scope.from_dict(payload["scope"])
        tenant, share = scope.tenant, payload["share"]
        async with self._locked(tenant, share):
            # deleted on the platform before its files were read (or, late, forgotten):
            # neither they nor its text are taken
            if why := await self.withdrawn(scope, payload):
                log.info("share %s not read: %s", share, why)
                if why in ERASED:  # a run across the erasure may have saved some
                    await self._not_kept(end, scope, payload, why)
                return
            if (requeue := requeued(payload)) is not None:  # its cause fixed: read afresh
                await self.progress.restart(tenant, share, len(payload["files"]), requeue)
            # its own count of runs, or the stream's: a delivery that failed before counting
            # (Redis away, the lock busy) still makes the fifth one the last
            attempt = await self.progress.attempt(tenant, share)
            last = attempt >= MAX_DELIVERIES or last_delivery()
            failed: Exception | None = None
            patience = Patience(
                self.retry_delays, self.retry_seconds, self.long_step_seconds, self.stopping,
                self.clock, self.sleep,
            )  # fmt: skip
            for share_id, file in _file_ids(share, payload["files"]):
                try:
                    await self._file(end, scope, payload, share_id, file, last, patience)
                except Exception as exc:
                    if not last:
                        raise  # the task runs again, the turn with it
                    # only Redis failing as the outcome is kept: the question is not dropped
                    log.warning("share %s: a file's outcome was not kept: %r", share, exc)
                    failed = failed or exc
            if why := await self._erased(scope, payload):  # while its files were read
                log.info("share %s: %s; what it saved goes, its turn is not queued", share, why)
                await self._not_kept(end, scope, payload, why)
                return
            await self._queue_turn(scope, payload)
            if failed is not None:
                raise failed  # delivered again while it can be (the turn is queued once)

    async def given_up(self, payload: dict[str, Any]) -> None:
        """The share's task is dead-lettered unrun: its last delivery never ended (reading a
        file took its process down, say). Each file is said where it was shared (its kept
        outcome, or that it went wrong), and the message's text is queued as a turn."""
        end = self.ends.get(payload["platform"])
        if end is None:
            return
        scope = Scope.from_dict(payload["scope"])
        tenant, share = scope.tenant, payload["share"]
        try:
            async with self._locked(tenant, share):
                if why := await self.withdrawn(scope, payload):
                    log.info("share %s given up, not said: %s", share, why)
                    if why in ERASED:
                        await self._not_kept(end, scope, payload, why)
                    return
                for share_id, file in _file_ids(share, payload["files"]):
                    progress = await self.progress.get(tenant, share_id)
                    outcome = progress.get("outcome") or went_wrong(file_name(file))
                    await self.progress.set(tenant, share_id, outcome=outcome)
                    await self._say(end, payload["reply"], tenant, share_id,
                                    progress.get("message"), outcome)  # fmt: skip
                await self._queue_turn(scope, payload)
        except ShareBusy:  # another copy runs: it says the outcome and queues the turn
            log.info("share %s given up while another copy of it runs", share)

    async def withdrawn(self, scope: Scope, payload: dict[str, Any]) -> str | None:
        """Why a share must not be read any more, if it must not. A share is named as its
        message is (adapters/platform_ids.py): one deleted on the platform is noted for a day
        (`was_deleted`). A share whose sharer was erased after it was queued takes nothing of
        theirs (memory/erased_people.py), nor one queued before its whole tenant's erasure
        (which took the notes read here). A requeued or late share may run after a deletion's
        note lapsed: one whose turn was queued (its message stored once the turn ran) is read
        only while that message is stored, not a tombstone (deleted, forgotten, expired), as
        other tasks check theirs (`still_holds`); one whose turn never was is read as usual."""
        tenant, share = scope.tenant, payload["share"]
        if await self.memory.governance.was_deleted(tenant, share):
            return "its message was deleted"
        if why := await self._erased(scope, payload):
            return why
        queued_at = float(payload.get("queued_at") or 0)
        late = requeued(payload) is not None or (
            queued_at and time.time() - queued_at > LATE_SECONDS
        )
        if not late or not payload.get("turn"):
            return None  # a share without text stores no message: its note is all there is
        if "turn_queued" not in await self.progress.get(tenant, share):
            return None  # its message was never stored: nothing to find gone
        stored = await self.memory.conversation.all(scope)  # tombstones keep no source
        if any(m.role == "user" and m.metadata.get("source") == share for m in stored):
            return None
        return "its message is no longer stored (deleted, forgotten or expired)"

    async def _erased(self, scope: Scope, payload: dict[str, Any]) -> str | None:
        """Why nothing the share reads may be kept, if so: its sharer erased after it was
        queued (`forget_person`'s note, written before their PDFs go: a read spanning it saves
        after they went), its channel or thread deleted on the platform (`forget_place`'s note,
        a day: its channel's too, for a thread not in memory yet, as a top-level mention's
        is until its turn is queued), or its whole tenant erased after it was queued (which
        took the notes above). A thread forgotten by command leaves no note: a read spanning
        that keeps its PDF."""
        tenant, queued_at = scope.tenant, float(payload.get("queued_at") or 0)
        people = (str(payload.get("sharer") or ""), str(scope.user or ""))
        erased = await ErasedPeople(self.memory.redis).erased_at(tenant, people)
        if erased is not None and (not queued_at or erased >= queued_at):
            return PERSON_ERASED
        places = self.memory.governance.places
        if scope.thread and await places.deleted(tenant, [scope.thread]):
            return PLACE_DELETED
        # the tenant's note, kept a day (memory/governance_tenants.py), on Redis's clock as
        # `queued_at` is (`submit`)
        gone = await tenant_erased_at(self.memory.redis, tenant)
        if gone is not None and (not queued_at or gone >= queued_at):
            return TENANT_ERASED
        return None

    async def _not_kept(
        self, end: FileEnd, scope: Scope, payload: dict[str, Any], why: str
    ) -> None:
        """What a share read across an erasure saved goes (`_forget_saved`), and each of its
        messages (one may say "Saved") says it was not kept, unless its place went with the
        erasure (best effort: a message that cannot be edited stays as it is). Why, only where
        it tells nobody of a person's erasure: in a DM, or for the whole tenant's (`not_kept`);
        the log has it always (the callers')."""
        tenant, reply = scope.tenant, payload["reply"]
        messages = [
            (await self.progress.get(tenant, share_id)).get("message")
            for share_id, _ in _file_ids(payload["share"], payload["files"])
        ]  # read before the progress notes go
        await self._forget_saved(scope, payload)
        if why == PLACE_DELETED:
            return
        for message in filter(None, messages):
            try:
                await end.edit(reply, message, not_kept(why, scope))
            except Exception as exc:
                log.warning("could not edit a withdrawn share's message (%r)", exc)

    async def _forget_saved(self, scope: Scope, payload: dict[str, Any]) -> None:
        """What a share read across an erasure (`_erased`) saved after it, a run before this
        one's too: its files leave the private copies that list them (`forget_shares`: one
        another share holds stays for it, without this one's thread and sharer), the team's
        copies they read go (their record names the file: `origin`), and its progress notes."""
        tenant, redis, governance = scope.tenant, self.memory.redis, self.memory.governance
        ids = [share_id for share_id, _ in _file_ids(payload["share"], payload["files"])]
        listed = False  # a private copy lists one of them: taken back under the erasure lock
        for paper_id, raw in (await redis.hgetall(papers_key(tenant))).items():
            record = json.loads(raw)
            if (record.get("audience") or PUBLIC) != PUBLIC:
                listed = listed or any(s.get("origin") in ids for s in shares_of(record))
            elif record.get("origin") in ids:
                with contextlib.suppress(NotFound):  # an erasure took it meanwhile
                    await governance.forget_paper(tenant, decode(paper_id))
        if listed:
            await governance.forget_shares(tenant, ids)
        await delete_keys(redis, [shared_pdf_key(tenant, i) for i in [payload["share"], *ids]])

    async def _queue_turn(self, scope: Scope, payload: dict[str, Any]) -> None:
        """The message's text as a turn, now that its files are read (or given up), with the
        note naming them (`_with_files`): under the message's event id, so never twice. Noted
        in the share's progress: from then on its message is stored once the turn runs
        (`withdrawn`)."""
        if payload.get("turn"):
            turn = await self._with_files(scope.tenant, payload)
            await self.memory.turns.push(
                scope, turn, payload["turn_event"], watch=payload["platform"]
            )
            await self.progress.set(scope.tenant, payload["share"], turn_queued=time.time())

    async def _with_files(self, tenant: str, payload: dict[str, Any]) -> str:
        """The share's turn (a queued job's JSON, adapters/spine.py `Job`) with `shared_with`'s
        note below its text, naming the papers its files were saved as (kept with their
        outcome, so a run again or `given_up` names them too)."""
        papers = []
        for share_id, _ in _file_ids(payload["share"], payload["files"]):
            if paper := (await self.progress.get(tenant, share_id)).get("paper"):
                papers.append(paper)
        turn = json.loads(payload["turn"])
        turn["text"] = with_note(turn.get("text") or "", shared_with(papers))
        return json.dumps(turn, ensure_ascii=False)

    @contextlib.asynccontextmanager
    async def _locked(self, tenant: str, share: str) -> AsyncIterator[None]:
        """Hold the share's lock while the body runs (ShareBusy if another copy holds it),
        renewed up to the task's max run (then it is taken for hung: bot/background.py);
        released at the end, however it ends."""
        token = uuid.uuid4().hex
        if not await self.progress.lock(tenant, share, token, self.lock_seconds):
            raise ShareBusy(f"{share} is being read by another copy of its task")
        async with self.progress.kept(tenant, share, token, self.lock_seconds, self.max_run_ms):
            yield

    async def _file(
        self, end: FileEnd, scope: Scope, payload: dict[str, Any], share_id: str,
        file: dict[str, Any], last: bool, patience: Patience,
    ) -> None:  # fmt: skip
        tenant, reply = scope.tenant, payload["reply"]
        progress = await self.progress.get(tenant, share_id)
        outcome: str | None = progress.get("outcome")
        message: str | None = progress.get("message")
        saved: SavedPdf | None = None
        if outcome is None:
            try:
                file = await patience.attempt(lambda: end.describe(file))
            except FetchError as exc:
                if exc.retryable and not last:
                    raise
                outcome = fetch_failed(exc)
            except Exception:
                if not last:
                    raise
                log.exception("describing the shared file %s failed", share_id)
                outcome = went_wrong(file_name(file))
            else:
                outcome = self.refusal(file)
        shown = None
        if message is None:
            shown = outcome or READING.format(name=file_name(file))
            message = await self._post(end, reply, shown)
            if message is not None:
                await self.progress.set(tenant, share_id, message=message)
        if outcome is None:
            sharer = str(payload.get("sharer") or "")
            outcome, saved = await self._read(end, scope, share_id, file, last, sharer, patience)
        # the paper it was saved as, kept with the outcome for the turn's note (`_with_files`);
        # an outcome found now without one (a requeue's read failing) clears a run before's
        fresh = progress.get("outcome") is None
        named = {"id": saved.arxiv_id, "title": saved.title} if saved else None
        paper = {"paper": named} if fresh or saved else {}
        await self.progress.set(tenant, share_id, outcome=outcome, **paper)
        if outcome != shown:
            await self._say(end, reply, tenant, share_id, message, outcome)

    async def _say(
        self, end: FileEnd, reply: dict[str, Any], tenant: str, share_id: str,
        message: str | None, outcome: str,
    ) -> None:  # fmt: skip
        """The file's outcome, in its message (posted anew if that cannot be edited). A message
        posted here is kept, so a run again (`given_up`'s hook retried) edits it, never posts
        it twice."""
        if message is None:
            if (posted := await self._post(end, reply, outcome)) is not None:
                await self.progress.set(tenant, share_id, message=posted)
            return
        try:
            await end.edit(reply, message, outcome)
        except Exception as exc:  # deleted, no access: say it anew
            log.warning("could not edit the message of %s (%r); posting anew", share_id, exc)
            if (posted := await self._post(end, reply, outcome)) is not None:
                await self.progress.set(tenant, share_id, message=posted)

    async def _post(self, end: FileEnd, reply: dict[str, Any], text: str) -> str | None:
        """Best effort: a place the bot cannot post to any more does not stop the share."""
        try:
            return await end.post(reply, text)
        except Exception as exc:
            log.warning("could not post about a shared file in %s: %r", reply, exc)
            return None

    def refusal(self, file: dict[str, Any]) -> str | None:
        """Why a file is not read, before downloading it; None to read it."""
        name = file.get("name") or "this file"
        if not is_pdf(file):
            return f"I can read PDFs only; {name} is {kind_of(file)}."
        size = file.get("size")
        if isinstance(size, int) and size > self.max_bytes:
            return oversized(name, size, self.max_bytes)
        return None

    async def _read(
        self, end: FileEnd, scope: Scope, share_id: str, file: dict, last: bool, sharer: str,
        patience: Patience,
    ) -> tuple[str, SavedPdf | None]:  # fmt: skip
        """The file's outcome, and what it was saved as (None when it was not); a failure that
        may pass is tried again here (`patience`: the download, each embedding call, not the
        PDF's read), then raises (the task runs again), except on the last delivery, where it
        is said."""
        name = file_name(file)
        shared = SharedFile(name, file.get("link") or "", share_id, sharer)
        embedder = PatientEmbedder(self.memory.embedder, patience)
        try:
            data = await patience.attempt(lambda: end.fetch(file, self.max_bytes))
            saved = await save_shared_pdf(
                data, shared, scope, self.memory.knowledge_base, embedder, self.encoding,
                self.max_bytes, self.max_pages,
            )  # fmt: skip
        except IngestError as exc:
            return f"I could not read {exc}", None
        except FetchError as exc:
            if exc.retryable and not last:
                raise
            return fetch_failed(exc), None
        except Exception:
            if not last:
                raise  # the task stays pending and runs again (Redis back, the API free)
            log.exception("reading the shared file %s failed", share_id)
            return went_wrong(name), None
        return saved_text(saved, scope), saved
