"""Topic watches in a running bot: made from chat, checked every minute, posted once a period.

- `parse_watch` reads "state-space models weekly cat:cs.LG author:Gu" (a slash command's text).
  A chat message is a watch command only in an explicit form (`chat_command`): "watch: <topic>",
  or "watch <topic>" naming a period or an option ("weekly", "every 3 days", "cat:", "author:"),
  or "watch list|remove|pause|resume|help …"; never with a question mark, nor "watch out", "watch
  it" and the like. Made from a job, the watch's id comes from the job's id, so a job run again
  finds the watch it made.
- `check` (every ARXIVSCOUT_WATCH_CHECK_SECONDS, in each process with a poster attached) queues a
  durable `digest` task for each due watch of the platforms this process posts to, then claims
  the period for the task's token (memory/stores/watches.py: one token wins); the task claims
  again, so a crash between the two loses nothing and a duplicate task does nothing. A task
  whose period a later claim has overtaken folds into the later digest (one catch-up digest).
- A digest task runs alone (a lock per period), asks arXiv, ranks, and posts through the
  platform's `Poster`. Before posting it records "posting"; a re-run that finds it asks the
  platform whether the message is there (Slack: the message's metadata in the channel's
  history; Discord: the send's nonce, which Discord refuses to use twice), so a crash between
  posting and recording does not post twice. Then the period is recorded as posted with the
  papers it showed, and the watch's `since` moves on. A place that refuses the digest pauses
  the watch and its creator is told in a direct message (`/watch resume <id>`). A digest arXiv
  did not answer is tried again later with a growing delay (the watch stays due, at
  `retry_at`); after RETRY_TELL_AFTER failures in a row the place is told once.
- The Save button queues a `save` task on the same stream: fetch_and_save, then the answer goes
  where the button was pressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.background import BackgroundWork
from memory.digest import Digest, DigestBuilder, digest_text
from memory.embeddings import background_embedding
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import ArxivSource, check_arxiv_id
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save
from memory.keys import task_stream
from memory.scope import Scope
from memory.stores.watches import DAY, LOCK_SECONDS, InvalidWatch, Watch, WatchStore
from memory.tasks import TaskStream

log = logging.getLogger(__name__)

DIGEST, SAVE = "digest", "save"
DEFAULT_CHECK_SECONDS = 60.0
PLATFORMS = ("slack", "discord")  # the ones with a stream; a terminal watch is run by hand
_PERIOD = re.compile(r"^(?:every\s*)?(\d{1,3})\s*(?:d|days?)$", re.I)
_OPTION = re.compile(
    r"\b(cat|category|au|author):(\"[^\"]+\"|\S+)|\bevery\s+\d{1,3}\s+days?\b", re.I
)
RESERVED = ("list", "remove", "delete", "stop", "pause", "resume", "help")
_CHAT = re.compile(r"^\s*watch(:|\s)\s*(.*)$", re.I | re.S)
_NOT_A_TOPIC = re.compile(r"^(out|it|this|that|these|those|me|you|him|her|them|us|over)\b", re.I)
_SCHEDULED = re.compile(
    r"\b(daily|weekly|every\s+(day|week|\d{1,3}\s*(d|days?)))\b|\b(cat|category|au|author):", re.I
)
RETRY_BASE_SECONDS = 60.0  # arXiv did not answer: tried again after 1, 2, 4 … minutes
RETRY_MAX_SECONDS = 6 * 3600.0
RETRY_TELL_AFTER = 3  # failures in a row before the place is told (once)
UNREACHABLE = "My memory is unreachable right now, so nothing was changed: try again in a minute."
NOT_QUEUED = (
    "I could not take that right now (my memory is unreachable): press it again in a minute."
)
USAGE = (
    "Usage: `/watch <topic> [daily|weekly|every N days] [cat:cs.CL] [author:Name]`, "
    "`/watch list`, `/watch remove <id>`, `/watch pause <id>`, `/watch resume <id>` "
    "(in chat: “watch state-space models weekly” or “watch: state-space models”)."
)


class Undeliverable(RuntimeError):
    """The platform will not take the digest there (channel gone, bot removed): the period is
    given up without moving `since`, so a later digest still shows its papers."""


class DigestBusy(RuntimeError):
    """Another process runs this period's digest: the task is tried again later."""


@dataclass
class WatchRequest:
    query: str
    period: int = DAY
    categories: list[str] = field(default_factory=list)
    authors: list[str] = field(default_factory=list)


def parse_period(word: str) -> int | None:
    word = word.strip().lower()
    if word in ("daily", "day", "every day"):
        return DAY
    if word in ("weekly", "week", "every week"):
        return 7 * DAY
    if found := _PERIOD.match(word):
        days = int(found.group(1))
        return days * DAY if days >= 1 else None
    return None


def chat_command(text: str) -> str | None:
    """The command of a chat message that is an explicit watch command (see the module's
    docstring), else None: a message that merely starts with "watch" is a question."""
    found = _CHAT.match(text)
    if found is None or "?" in text:
        return None
    colon, rest = found.group(1) == ":", found.group(2).strip()
    first = rest.split()[0].lower() if rest else ""
    if first in RESERVED:
        return rest
    if not rest or _NOT_A_TOPIC.match(rest) or not (colon or _SCHEDULED.search(rest)):
        return None
    return re.sub(r"^(for|on)\s+", "", rest, flags=re.I)


def parse_watch(text: str) -> WatchRequest:
    """A watch's topic and options from free text; InvalidWatch when nothing is asked."""
    request = WatchRequest("")
    rest = []
    for found in _OPTION.finditer(text):
        if found.group(1) is None:
            request.period = parse_period(found.group(0)) or request.period
            continue
        value = found.group(2).strip('"').replace("_", " ").strip()
        target = request.categories if found.group(1).lower() in ("cat", "category") else None
        (target if target is not None else request.authors).append(value)
    for word in _OPTION.sub(" ", text).split():
        period = parse_period(word)
        if period is not None:
            request.period = period
        else:
            rest.append(word)
    request.query = " ".join(rest).strip(" .,:;\"'")
    if not (request.query or request.categories or request.authors):
        raise InvalidWatch("What should I watch? " + USAGE)
    return request


class Poster(Protocol):
    """How one platform shows digests and answers the Save button (registered by its adapter)."""

    async def post(self, watch: Watch, digest: Digest, marker: str) -> str:
        """Post the digest; returns the platform's reference of the message."""
        ...

    async def find(self, watch: Watch, marker: str, since: float) -> str | None:
        """The reference of a digest message posted with `marker` since then, if any."""
        ...

    async def answer(self, reply: dict[str, Any], text: str) -> None:
        """Say `text` where a Save button was pressed (`reply`: the adapter's own address)."""
        ...

    async def can_post(self, place: WatchPlace) -> str:
        """ "" if digests can be posted there, else why not (and what to do)."""
        ...

    async def tell(self, watch: Watch, text: str) -> None:
        """Say `text` to the watch's creator alone (a direct message)."""
        ...

    async def notice(self, watch: Watch, text: str) -> None:
        """Say `text` in the watch's place."""
        ...


@dataclass
class WatchPlace:
    """Where a watch made in chat posts: the platform, its channel and thread."""

    platform: str
    channel: str
    thread: str = ""

    def holds(self, watch: Watch) -> bool:
        """The watch posts here (only here may it be paused, resumed or removed)."""
        return (watch.platform, watch.channel) == (self.platform, self.channel)


TERMINAL = WatchPlace("terminal", "terminal")


def place_of(scope: Scope) -> WatchPlace | None:
    """The place of a chat message (from its thread id), or None for the terminal."""
    parts = scope.thread.split(":")
    if parts[0] == "slack" and len(parts) >= 4:
        return WatchPlace("slack", parts[2])  # digests go to the channel, not the thread
    if parts[0] == "discord" and len(parts) >= 3 and scope.channel:
        return WatchPlace("discord", scope.channel)
    return None


def created_text(watch: Watch) -> str:
    """The answer to a watch made in chat (it starts with "Watching ")."""
    where = "for the terminal (`arxivscout watch run`)" if watch.platform == "terminal" else "here"
    return (
        f"Watching {describe(watch)} {where} (id `{watch.id}`). The first digest comes "
        f"within a few minutes and covers the last {watch.period_name.replace('ly', '')}; "
        f"`/watch remove {watch.id}` stops it."
    )


def saving_text(arxiv_id: str) -> str:
    """The first answer to a pressed Save (the task answers again once it is saved)."""
    return f"Saving arXiv:{arxiv_id} to the team knowledge base…"


def watch_id_of(tenant: str, job_id: str) -> str:
    """A watch's id from the job that made it: the same job run again makes the same watch."""
    return hashlib.blake2b(f"{tenant}:{job_id}".encode(), digest_size=5).hexdigest()


def retry_delay(failures: int, period: int) -> float:
    """After `failures` failed tries in a row (1, 2, …): 1, 2, 4 … minutes, at most 6 hours
    or a period."""
    return min(RETRY_BASE_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS, float(period))


def describe(watch: Watch) -> str:
    what = f"“{watch.query}”" if watch.query else "new papers"
    extra = [f"cat:{c}" for c in watch.categories] + [f"author:{a}" for a in watch.authors]
    return f"{what}{' ' + ' '.join(extra) if extra else ''}, {watch.period_name}"


class WatchService:
    """The watches of one process: commands, the scheduler's tick, the digest and save tasks."""

    def __init__(
        self, memory, arxiv: ArxivSource, encoding, *, now: Callable[[], float] = time.time,
        top_n: int = 5, stream_prefix: str = "digests", claim_idle_ms: int = 30_000,
    ) -> None:  # fmt: skip
        self.memory = memory
        self.store = WatchStore(memory.redis)
        if arxiv.pace is None:  # arXiv's 3 s, kept with every other process's digests
            arxiv.pace = SharedPace(memory.redis, arxiv.delay_seconds)
        self.builder = DigestBuilder(
            memory.knowledge_base, self.store, memory.embedder, arxiv, top_n=top_n
        )
        self.arxiv = arxiv
        self.encoding = encoding
        self.now = now
        self.stream_prefix = stream_prefix
        self.claim_idle_ms = claim_idle_ms
        self.posters: dict[str, Poster] = {}
        self.workers: dict[str, BackgroundWork] = {}

    def stream(self, platform: str) -> TaskStream:
        return TaskStream(self.memory.redis, task_stream(f"{self.stream_prefix}-{platform}"))

    def attach(self, platform: str, poster: Poster) -> None:
        """This process posts `platform`'s digests: read its stream (from now if an event loop
        runs, else from the first `check`)."""
        self.posters[platform] = poster
        if platform not in self.workers:
            self.workers[platform] = BackgroundWork(
                self.stream(platform), {DIGEST: self.run_digests, SAVE: self.run_saves},
                claim_idle_ms=self.claim_idle_ms,
            )  # fmt: skip
        with contextlib.suppress(RuntimeError):  # no running loop (yet)
            asyncio.get_running_loop()
            self.workers[platform].start()

    async def close(self) -> None:
        for work in self.workers.values():
            await work.close()
        self.workers.clear()

    # -- commands ------------------------------------------------------------------------------

    async def create(
        self, scope: Scope, text: str, place: WatchPlace | None, watch_id: str = ""
    ) -> Watch:
        """A watch posting to `place`; InvalidWatch when the request is malformed or this
        process's poster says it cannot post there (the bot is not in the channel)."""
        request = parse_watch(text)
        place = place or TERMINAL
        poster = self.posters.get(place.platform)
        if poster is not None and (why := await poster.can_post(place)):
            raise InvalidWatch(why)
        return await self.store.create(
            scope, request.query, request.period, platform=place.platform,
            channel=place.channel, thread=place.thread, categories=request.categories,
            authors=request.authors, now=self.now(), watch_id=watch_id,
        )  # fmt: skip

    async def command(
        self, scope: Scope, text: str, place: WatchPlace | None, watch_id: str = ""
    ) -> str:
        """`/watch …` (or a chat watch command): make, list, pause, resume or remove; the
        answer to show. A reserved word never makes a watch; misused, it answers the usage."""
        words = text.split()
        verb = words[0].lower() if words else ""
        try:
            if verb in ("", "help"):
                return USAGE
            if verb in RESERVED:
                return await self._verb(scope, verb, words[1:], place)
            watch = await self.create(scope, text, place, watch_id)
        except InvalidWatch as exc:
            return str(exc)
        return created_text(watch)

    async def _verb(
        self, scope: Scope, verb: str, rest: list[str], place: WatchPlace | None
    ) -> str:
        """A reserved word's command; anything else than its one form answers the usage."""
        if verb == "list":
            if rest:
                return "`/watch list` takes no more words. " + USAGE
            return await self.list_text(scope, place)
        if len(rest) != 1:
            return f"`/watch {verb}` takes one id. " + USAGE
        if verb in ("remove", "delete", "stop"):
            return await self.remove_text(scope, rest[0], place)
        if verb == "pause":
            return await self.pause_text(scope, rest[0], place)
        return await self.resume_text(scope, rest[0], place)

    async def message(self, scope: Scope, text: str, turn_id: str = "") -> str | None:
        """A chat message that is a watch command (`chat_command`), answered; None for any
        other message. `turn_id`: the job's id, from which a made watch takes its id."""
        command = chat_command(text)
        if command is None:
            return None
        watch_id = watch_id_of(scope.tenant, turn_id) if turn_id else ""
        return await self.command(scope, command, place_of(scope), watch_id)

    async def list_text(self, scope: Scope, place: WatchPlace | None) -> str:
        channel = place.channel if place else None
        watches = await self.store.visible(scope, channel)
        if not watches:
            return "No watches here. " + USAGE
        return "\n".join(f"• `{w.id}` {describe(w)} — {_state(w)}" for w in watches)

    async def _here(self, scope: Scope, watch_id: str, place: WatchPlace | None) -> Watch | None:
        """The watch, if it posts to this place and this person may see it there: only the
        place a watch posts to may remove, pause or resume it."""
        watch = await self.store.get(scope.tenant, watch_id.strip("`"))
        if watch is None or not scope.can_see(watch.audience):
            return None
        return watch if (place or TERMINAL).holds(watch) else None

    async def remove_text(self, scope: Scope, watch_id: str, place: WatchPlace | None) -> str:
        watch = await self._here(scope, watch_id, place)
        if watch is None:
            return _not_here(watch_id)
        await self.store.remove(scope.tenant, watch.id)
        return f"Stopped watching {describe(watch)} (`{watch.id}`)."

    async def pause_text(self, scope: Scope, watch_id: str, place: WatchPlace | None) -> str:
        watch = await self._here(scope, watch_id, place)
        if watch is None:
            return _not_here(watch_id)
        await self.store.pause(watch, f"paused by {scope.user or 'someone'}")
        return f"Paused {describe(watch)} (`{watch.id}`); `/watch resume {watch.id}` resumes it."

    async def resume_text(self, scope: Scope, watch_id: str, place: WatchPlace | None) -> str:
        watch = await self._here(scope, watch_id, place)
        if watch is None:
            return _not_here(watch_id)
        poster = self.posters.get(watch.platform)
        if poster is not None and (why := await poster.can_post(place or TERMINAL)):
            return why
        await self.store.resume(watch, self.now())
        return f"Resumed {describe(watch)} (`{watch.id}`): a digest comes within a few minutes."

    # -- the scheduler -------------------------------------------------------------------------

    async def check(self) -> list[tuple[str, str]]:
        """Queue the digest of every due watch of the platforms this process posts to, and
        claim its period for the task; returns the (tenant, watch id) claimed here. Terminal
        watches are run by hand (`arxivscout watch run`) and leave the due index."""
        if not self.posters:
            return []  # `ask`, `eval`, a worker: this process posts no digest
        for work in self.workers.values():
            work.start()  # if it was not (attached before the loop ran), or it stopped
        now = self.now()
        queued = []
        for tenant, watch_id in await self.store.due(now, limit=1000):
            watch = await self.store.get(tenant, watch_id)
            if watch is None or watch.platform not in PLATFORMS or watch.paused:
                await self.store.reindex(None, tenant, watch_id)
                continue
            if watch.platform not in self.posters:
                continue  # a process that posts there claims it (when it runs)
            if watch.next_due > now:
                await self.store.reindex(watch, tenant, watch_id)
                continue
            token, next_due = uuid.uuid4().hex, watch.next_after(now)
            payload = {"tenant": tenant, "watch": watch_id, "due": str(watch.next_due),
                       "next": next_due, "until": now, "token": token}  # fmt: skip
            await self.stream(watch.platform).add(DIGEST, payload)  # first: a crash after it
            if await self.store.claim(watch, now, token, next_due=next_due) is not None:
                queued.append((tenant, watch_id))  # loses nothing (the task claims too)
        return queued

    # -- the digest task -------------------------------------------------------------------------

    async def run_digests(self, payloads: list[dict]) -> None:
        """Each digest on its own: one that fails does not fail the others (a re-run of the
        batch finds theirs done)."""
        failed: list[BaseException] = []
        for payload in payloads:
            try:
                await self.digest(payload)
            except DigestBusy as exc:
                failed.append(exc)
            except Exception as exc:  # Redis or the platform away: the stream tries it again
                log.warning("digest %s/%s failed: %r", payload.get("tenant"),
                            payload.get("watch"), exc)  # fmt: skip
                failed.append(exc)
        if failed:
            raise failed[0] if len(failed) == 1 else DigestBusy("; ".join(map(str, failed)))

    async def digest(self, payload: dict) -> str:
        """One period's digest, once: returns what happened ("posted", "empty", "done"
        (already), "gone" (watch removed), "other" (another task has the period), "folded" (a
        later period covers it), "paused", "failed" (the place refused it: paused, its
        creator told), "retry" (arXiv did not answer: due again later))."""
        tenant, watch_id, due = payload["tenant"], payload["watch"], str(payload["due"])
        until = float(payload["until"])
        token = str(payload.get("token") or "")
        holder = uuid.uuid4().hex
        if not await self.store.lock(tenant, watch_id, due, holder):
            raise DigestBusy(f"digest {watch_id}/{due} is running elsewhere")
        keepalive = asyncio.create_task(self._hold(tenant, watch_id, due, holder))
        try:
            record = await self.store.digest(tenant, watch_id, due)
            if record.finished:
                return "done"
            watch = await self.store.get(tenant, watch_id)
            if watch is None:
                return "gone"
            if watch.paused:
                return "paused"
            next_due = int(payload.get("next") or watch.next_after(until))
            if (
                token
                and await self.store.claim(watch, until, token, due=int(due), next_due=next_due)
                is None
            ):
                return "other"  # a duplicate task: the period's claim is another's
            watch = await self.store.get(tenant, watch_id) or watch  # as the claim left it
            overtaken = token and watch.next_due != next_due  # a later period claimed since
            if overtaken and record.state != "posting":  # (a posted message is recorded first)
                await self.store.settle(tenant, watch_id, due, "folded")
                return "folded"
            poster = self.posters[watch.platform]
            marker = f"{watch.id}:{due}"
            if record.state == "posting":
                ref = await poster.find(watch, marker, record.posting_since)
                if ref is not None:  # posted before a crash: record it, post nothing
                    await self.store.finish(watch, due, until, self.now(), ref, record.papers)
                    return "done"
            try:
                with background_embedding():
                    digest = await self.builder.build(watch, until)
            except IngestError as exc:  # arXiv refused or did not answer
                return await self._arxiv_failed(watch, due, next_due, exc)
            if not digest.items:
                await self.store.finish(watch, due, until, self.now())
                return "empty"
            await self.store.posting(tenant, watch_id, due, self.now(), digest.arxiv_ids)
            try:
                ref = await poster.post(watch, digest, marker)
            except Undeliverable as exc:
                await self._refused(watch, due, poster, exc)
                return "failed"
            await self.store.finish(watch, due, until, self.now(), ref, digest.arxiv_ids)
            return "posted"
        finally:
            keepalive.cancel()
            await asyncio.gather(keepalive, return_exceptions=True)
            await self.store.unlock(tenant, watch_id, due, holder)

    async def _refused(self, watch: Watch, due: str, poster: Poster, exc: Undeliverable) -> None:
        """The place refused the digest: the period is given up (its papers stay new), the
        watch paused, and its creator told how to resume it."""
        log.warning("watch %s in %s: %s", watch.id, watch.tenant, exc)
        await self.store.settle(watch.tenant, watch.id, due, "failed", str(exc))
        await self.store.pause(watch, str(exc))
        text = (
            f"I could not post the digest of your watch {describe(watch)} (`{watch.id}`): {exc}. "
            f"I paused it. Invite me to the channel, then `/watch resume {watch.id}` there."
        )
        try:
            await poster.tell(watch, text)
        except Exception as told:  # the watch is paused; `/watch list` shows why
            log.warning("could not tell the creator of watch %s: %r", watch.id, told)

    async def _arxiv_failed(self, watch: Watch, due: str, next_due: int, exc: Exception) -> str:
        """arXiv did not answer: the watch is due again after a growing delay (never given
        up); after RETRY_TELL_AFTER failures in a row its place is told once."""
        now = self.now()
        retry_at = now + retry_delay(watch.failures + 1, watch.period)
        await self.store.settle(watch.tenant, watch.id, due, "retry", str(exc))
        failures = await self.store.retry(watch, next_due, retry_at, now)
        log.warning("watch %s: arXiv failed (%d in a row): %s", watch.id, failures, exc)
        if failures == RETRY_TELL_AFTER:
            since = time.strftime("%Y-%m-%d %H:%M", time.gmtime(watch.failing_since or now))
            text = (
                f"arXiv has not answered for the watch {describe(watch)} (`{watch.id}`) since "
                f"{since} UTC ({exc}); I'll keep trying."
            )
            with contextlib.suppress(Exception):  # a lost notice: the next digest still comes
                await self.posters[watch.platform].notice(watch, text)
        return "retry"

    async def _hold(self, tenant: str, watch_id: str, due: str, token: str) -> None:
        """Renew a running digest's lock (a third of its TTL at a time) until cancelled."""
        while True:
            await asyncio.sleep(LOCK_SECONDS / 3)
            with contextlib.suppress(Exception):  # Redis away: the next renewal tries again
                await self.store.renew(tenant, watch_id, due, token)

    async def preview(self, watch: Watch, since: float | None = None) -> Digest:
        """The digest as it would be now (the terminal's `watch run`); records nothing."""
        with background_embedding():
            return await self.builder.build(watch, self.now(), since)

    async def run_by_hand(self, watch: Watch, since: float | None = None) -> str:
        """`arxivscout watch run`: the digest printed; a terminal watch also records it (it has
        no other delivery), so its next run shows what is new since."""
        digest = await self.preview(watch, since)
        if watch.platform == "terminal":
            await self.store.finish(watch, "manual", digest.until, self.now(), "terminal",
                                    digest.arxiv_ids)  # fmt: skip
        return digest_text(digest)

    # -- the Save button -----------------------------------------------------------------------

    async def queue_save(
        self, platform: str, tenant: str, arxiv_id: str, user: str, reply: dict[str, Any]
    ) -> None:
        """Queue a pressed Save (the adapter has said `saving_text`); its answer goes to
        `reply` through the platform's poster. IngestError for a malformed id."""
        arxiv_id = check_arxiv_id(arxiv_id)
        payload = {"tenant": tenant, "arxiv_id": arxiv_id, "user": user, "reply": reply,
                   "platform": platform}  # fmt: skip
        await self.stream(platform).add(SAVE, payload)

    async def run_saves(self, payloads: list[dict]) -> None:
        """Each Save answered once, whatever happened to it (a task is never failed: a person
        who saw "Saving…" always hears back)."""
        for payload in payloads:
            tenant, arxiv_id = payload["tenant"], payload["arxiv_id"]
            try:
                text = await self.save(tenant, arxiv_id, payload.get("user", ""))
            except Exception as exc:  # Redis, the embedder: nothing half-saved is shown
                log.warning("a Save of %s failed: %r", arxiv_id, exc)
                text = f"Could not save arXiv:{arxiv_id} right now; press Save again in a minute."
            poster = self.posters.get(payload.get("platform", ""))
            if poster is None:
                continue
            try:
                marker = hashlib.blake2b(repr(sorted(payload.items())).encode(),
                                         digest_size=12).hexdigest()  # fmt: skip
                if await self.store.once(marker):
                    await poster.answer(payload.get("reply") or {}, text)
            except Exception:  # the paper is saved; a lost answer is not worth a retry
                log.warning("could not answer a Save of %s", arxiv_id, exc_info=True)

    async def save(self, tenant: str, arxiv_id: str, user: str = "") -> str:
        scope = Scope(tenant, user=user)
        try:
            with background_embedding():
                paper, chunks, already = await fetch_and_save(
                    arxiv_id, scope, self.memory.knowledge_base, self.memory.embedder,
                    self.encoding, self.arxiv,
                )  # fmt: skip
        except IngestError as exc:
            return f"Could not save arXiv:{arxiv_id}: {exc}"
        if already:
            return f"“{paper.title}” was already in the team knowledge base ({chunks} passages)."
        return f"Saved “{paper.title}” to the team knowledge base ({chunks} passages)."


def _not_here(watch_id: str) -> str:
    return f"No watch `{watch_id}` posts here (`/watch list` shows their ids)."


def _state(watch: Watch) -> str:
    """A listed watch's schedule: its next digest, or why it is paused."""
    if watch.paused:
        return f"*paused* ({watch.paused}): `/watch resume {watch.id}`"
    due = time.strftime("%Y-%m-%d %H:%M", time.gmtime(watch.next_due))
    retrying = f" (arXiv failed {watch.failures}×, retrying)" if watch.failures else ""
    return f"next digest {due} UTC{retrying}"
