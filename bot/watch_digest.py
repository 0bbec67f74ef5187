"""Running one period's digest task: ask arXiv, rank, post through the platform's `Poster`, once.

- A digest task runs alone (a lock per period, renewed while it runs) and claims its period again
  (bot/watch_scheduler.py claimed it first): a duplicate task does nothing, and a task whose
  period a later claim has overtaken folds into the later digest (one catch-up digest).
- Before posting it records "posting", only if the watch is still there and not paused (one
  script: a `/watch remove` or `pause` during the build, which takes a while of arXiv's
  answers, posts nothing and leaves `since` where it was); a re-run that finds it asks the
  platform whether the message is there (Slack: the message's metadata in the channel's
  history; Discord: the marker in the footer of a message in the channel's history), so a
  crash (or an outage) between posting and recording does not post twice. Then the period is recorded as posted with the papers it showed, and the watch's
  `since` moves on.
- A place that refuses the digest pauses the watch and its creator is told in a direct message
  what to do for its reason (`resume_advice`: let the bot post again, ask an admin to allow
  it (`PostingRestricted`), or unarchive the channel (`ChannelArchived`), then
  `/watch resume <id>`). A channel not of the watch's tenant
  (`ForeignPlace`: the poster checks it at every post) is refused the same way, and the poster
  tells only a person of the tenant; a place gone is refused before arXiv is asked (`walled`).
  A watch whose topic arXiv cannot search (saved before `create` refused such topics) is paused
  the same way, before arXiv is asked (its query would be every paper of the period).
  A digest arXiv did not answer is tried again later with a growing delay
  (the watch stays due, at `retry_at`); after RETRY_TELL_AFTER failures in a row the place is
  told once.
- `preview` and `run_by_hand` build the digest outside any task (the terminal's `watch run`):
  only a terminal watch's run records what it was given and showed; a chat watch's records
  nothing (its digest task would otherwise drop papers it never posted).
- The saved papers a digest names are those its place may read now: a poster that knows a
  place's walls (`PlaceWalls`: Slack's, a channel shared with another organisation since the
  watch was made) is asked at each digest; otherwise the audience stored with the watch stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from bot.watch_places import Poster, Undeliverable
from bot.watch_texts import describe, utc_minute
from memory.digest import Digest, DigestBuilder, digest_text
from memory.embeddings import background_embedding
from memory.ingest.errors import IngestError
from memory.stores.watches import (
    LOCK_SECONDS,
    Watch,
    WatchStore,
    remake,
    remove_advice,
    unsearchable,
)

log = logging.getLogger(__name__)

DIGEST = "digest"  # the task's name on a platform's stream
RETRY_BASE_SECONDS = 60.0  # arXiv did not answer: tried again after 1, 2, 4 … minutes
RETRY_MAX_SECONDS = 6 * 3600.0
RETRY_TELL_AFTER = 3  # failures in a row before the place is told (once)


@runtime_checkable
class PlaceWalls(Protocol):
    """What a `Poster` may also say: whether the watch's place is walled now (memory/scope.py:
    shared with another organisation, or the platform cannot say), so its digest names only
    what a walled place may read (memory/digest.py `reader`); Undeliverable when the place is
    gone (refused before arXiv is asked)."""

    async def walled(self, watch: Watch) -> bool: ...


async def walled_now(poster: object | None, watch: Watch) -> bool:
    """The poster's word on the watch's place; False from a poster that keeps no walls."""
    return isinstance(poster, PlaceWalls) and await poster.walled(watch)


class DigestBusy(RuntimeError):
    """Another process runs this period's digest: the task is tried again later."""


class ForeignPlace(Undeliverable):
    """The watch names a channel that is not of its tenant (another server or workspace, or
    not the DM tenant's own DM): never posted there, the watch is paused (`_refused`)."""


class PostingRestricted(Undeliverable):
    """The bot is in the channel but its admins restrict who may post there (Slack's
    `restricted_action…`): inviting the bot changes nothing, an admin must allow it."""


class ChannelArchived(Undeliverable):
    """The channel is archived (Slack's `is_archived`): inviting the bot changes nothing, the
    channel must be unarchived."""


def resume_advice(watch: Watch, exc: Undeliverable) -> str:
    """What the creator of a watch paused by `exc` does next, for its reason."""
    if isinstance(exc, ForeignPlace):
        return (
            f"I paused it: make it again in one of your own channels, and `/watch remove "
            f"{watch.id}` this one."
        )
    if isinstance(exc, PostingRestricted):
        return (
            f"I paused it. Posting there is restricted: ask an admin of the channel to let me "
            f"post in it, then `/watch resume {watch.id}` there."
        )
    if isinstance(exc, ChannelArchived):
        return (
            f"I paused it. The channel is archived: unarchive it, then `/watch resume "
            f"{watch.id}` there."
        )
    return (
        f"I paused it. To have it post again, invite me to the channel or give me permission to "
        f"send messages there, then `/watch resume {watch.id}` there."
    )


def unsearchable_advice(watch: Watch) -> str:
    """What the creator of a watch paused for its unsearchable topic does next (resuming it
    changes nothing: its next digest pauses it again)."""
    return f"I paused it: {remove_advice(watch.id)}."


def retry_delay(failures: int, period: int) -> float:
    """After `failures` failed tries in a row (1, 2, …): 1, 2, 4 … minutes, at most 6 hours
    or a period."""
    return min(RETRY_BASE_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS, float(period))


class DigestTasks:
    """The digest tasks of one process, posted through the posters the adapters attached."""

    def __init__(
        self, store: WatchStore, builder: DigestBuilder, posters: dict[str, Poster],
        now: Callable[[], float],
    ) -> None:  # fmt: skip
        self.store = store
        self.builder = builder
        self.posters = posters  # shared with the service: `attach` adds to it
        self.now = now

    async def run(self, payloads: list[dict]) -> None:
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
        later period covers it), "paused", "failed" (the place refused it, or arXiv cannot
        search its topic: paused, its creator told), "retry" (arXiv did not answer: due
        again later))."""
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
            if not watch.searchable:  # saved before such topics were refused: never asked
                why = unsearchable(watch.query)  # (it would be every paper of the period)
                await self._paused(watch, due, poster, why, unsearchable_advice(watch))
                return "failed"
            try:  # a place gone is refused before arXiv is asked
                walled = await walled_now(poster, watch)
            except Undeliverable as exc:
                await self._refused(watch, due, poster, exc)
                return "failed"
            try:
                with background_embedding():
                    digest = await self.builder.build(watch, until, walled=walled)
            except IngestError as exc:  # arXiv refused or did not answer
                return await self._arxiv_failed(watch, due, next_due, exc)
            if not digest.items:
                await self.store.finish(watch, due, until, self.now())
                return "empty"
            state = await self.store.posting(tenant, watch_id, due, self.now(), digest.arxiv_ids)
            if state != "ok":  # removed or paused while arXiv was asked: nothing posted
                await self.store.settle(tenant, watch_id, due, state)  # `since` stays
                return state
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
        watch paused, and its creator told what to do for its reason (`resume_advice`; the
        poster tells only a person of the watch's tenant)."""
        log.warning("watch %s in %s: %s", watch.id, watch.tenant, exc)
        await self._paused(watch, due, poster, str(exc), resume_advice(watch, exc))

    async def _paused(self, watch: Watch, due: str, poster: Poster, why: str, advice: str) -> None:
        """The period given up and the watch paused for `why`, its creator told (`advice`)."""
        await self.store.settle(watch.tenant, watch.id, due, "failed", why)
        if not await self.store.pause(watch, why):  # removed meanwhile (its place deleted)
            return  # no one to tell: its removal said so
        text = (
            f"I could not post the digest of your watch {describe(watch)} (`{watch.id}`): "
            f"{why}. {advice}"
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
            since = utc_minute(watch.failing_since or now)
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

    async def preview(
        self, watch: Watch, since: float | None = None, record: bool = False
    ) -> Digest:
        """The digest as it would be now (`watch run` of a chat watch); records nothing, not
        even what arXiv gave (`record`: a terminal watch's run, its delivery). IngestError for
        a topic arXiv cannot search (never asked: it would be every paper of the period)."""
        if not watch.searchable:
            raise IngestError(f"{remake(watch.query)}.")
        try:
            walled = await walled_now(self.posters.get(watch.platform), watch)
        except Undeliverable:  # its place is gone: previewed as a walled place's
            walled = True
        with background_embedding():
            return await self.builder.build(watch, self.now(), since, walled, record=record)

    async def run_by_hand(self, watch: Watch, since: float | None = None) -> str:
        """`arxivscout watch run`: the digest printed; a terminal watch also records it (it has
        no other delivery), so its next run shows what is new since; a chat watch's is a
        preview and records nothing."""
        terminal = watch.platform == "terminal"
        digest = await self.preview(watch, since, record=terminal)
        if terminal:
            await self.store.finish(watch, "manual", digest.until, self.now(), "terminal",
                                    digest.arxiv_ids)  # fmt: skip
        return digest_text(digest)
