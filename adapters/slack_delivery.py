"""How answers reach Slack: the placeholder or stream a turn shows, its parts, and notices.

- Answers stream (chat.startStream/appendStream/stopStream, status via setStatus) where the
  workspace has them, else a placeholder is edited at most once a second; a 429 skips updates
  until its Retry-After, and the final answer waits it out. A stream stays one until Slack
  says it ended (STREAM_ENDED): an append failing in passing is tried again with the next, one
  refused for good is not (the final edit shows the answer); a stream the person stopped
  (STOPPED_BY_USER) shows nothing more, a re-run's neither (the answer is stored all the
  same), unless it showed none of the answer (nothing appended, or its appends refused); a
  notice that the turn failed is posted below it.
- A re-run of a job (after a crash or a hand-over) reuses the message its first run posted.
- Slack failing in passing (PASSING, the network, a timeout) before the answer is out leaves
  the job queued: it runs again (`Platform.passing`). A post Slack may have made despite its
  error (MAYBE_POSTED) carries the job and part (or placeholder) in its metadata and is looked
  for in the thread, or, if Slack cannot say, by the re-run before it posts: never posted
  twice. Blocks Slack refuses are sent once more as mrkdwn sections (the 👍/👎 buttons
  kept), then as plain text.
- Where the bot may not post (not in the channel, the channel archived, the thread's message
  gone: any error Slack does not make in passing), a command's or shortcut's response_url
  carries the answer (5 posts at most), saying why it comes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.platform_ids import slack_source
from adapters.slack_feedback import with_feedback
from adapters.spine import (
    Job,
    Platform,
    Status,
    feedback_turn,
    may_run_again,
)
from adapters.text import link_arxiv, split_message
from bot.agent import AgentEvent
from bot.tools import TOOL_ACTIVITY

log = logging.getLogger(__name__)

DM = "dm"  # the thread of a direct message conversation with the bot (never sent to Slack)
THINKING = "_Thinking…_"
SUMMARIZING = "_Summarizing the thread…_"
STILL_WORKING = "_Still working on this…_"  # a re-run's placeholder (after a crash, a hand-over)
MARKDOWN_LIMIT = 11_000  # a markdown block takes 12,000 characters
UPDATE_EVERY_SECONDS = 1.0  # at most one intermediate update a second per message
FINAL_TRIES = 5  # a rate-limited answer is retried after each Retry-After this many times
MAX_RETRY_AFTER_SECONDS = 60.0
RESPONSE_URL_POSTS = 5  # Slack takes at most 5 posts to one response_url (in 30 minutes)
RESPONSE_URL_PARTS = RESPONSE_URL_POSTS - 1  # the last post says what was left out
NOT_THERE = {"not_in_channel", "channel_not_found"}  # the bot may not post in the channel
GONE = {"message_not_found", "cant_update_message", "edit_window_closed"}
# why a post in the job's thread failed for good, said with what comes to the response_url
# instead (not_in_channel and channel_not_found: nothing said, as before)
THREAD_GONE = "its message no longer exists"
CLOSED = {"is_archived": "its channel is archived", "invalid_thread_ts": THREAD_GONE,
          "thread_not_found": THREAD_GONE, "message_not_found": THREAD_GONE}  # fmt: skip
# what a failed chat.startStream says of one place, not of the workspace's streaming
OF_THE_PLACE = {*NOT_THERE, *CLOSED, "restricted_action"}
# Slack's own passing failures: the job stays queued and runs again
PASSING = {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited"}
# a notice Slack refuses for good in its place goes elsewhere (no response_url to use): to the
# channel itself when the thread is gone, else to the person in a DM with the bot
THREAD_REFUSED = {"invalid_thread_ts", "thread_not_found"}
# said in the channel of a thread gone under a message of someone else's (the person's own
# message gone, nothing is said: the spine's rule for a deleted message)
THREAD_GONE_NOTICE = "I could not reply in that thread (it no longer exists); ask again here."
PLACE_REFUSED = {*NOT_THERE, "is_archived", "restricted_action"}
# errors after which Slack may have done the call anyway ("some aspect of the operation
# succeeded"): a post is looked for before it is made again
MAYBE_POSTED = {"internal_error", "fatal_error"}
PLACEHOLDER = "placeholder"  # the placeholder's marker (a part's is its index): never part 0's
UNSURE = "maybe_posted"  # job.progress: marker -> when a post Slack may have made was first tried
REPLY_EVENT = "arxivscout_reply"  # the metadata of a reply's posts: its job and part
SECTION_LIMIT = 3000  # characters in a section block's text
# a body whose blocks Slack refuses: sent once more as sections, then as plain text
UNSHOWABLE = {"invalid_blocks", "invalid_blocks_format", "msg_too_long", "msg_blocks_too_long"}
NETWORK = (aiohttp.ClientError, TimeoutError)  # no answer from Slack at all
# Slack's answer to chat.appendStream/stopStream once a message no longer streams (it ends an
# idle or old stream; the person stopped it): the stream ended, edited from then on (unless
# the person stopped it: `SlackStatus.stopped`); other refusals leave it streaming
STOPPED_BY_USER = "stopped_by_user"
STREAM_ENDED = {"message_not_in_streaming_state", STOPPED_BY_USER}


def markdown(text: str) -> dict[str, Any]:
    """A message body in standard Markdown (Slack's `markdown` block), with a text fallback."""
    return {"text": text, "blocks": [{"type": "markdown", "text": text}]}


def slack_error(exc: SlackApiError) -> str:
    """Slack's error code; "" for an answer that was not JSON (slack_sdk then leaves aiohttp's
    response in the error, which has no `get`)."""
    data = getattr(exc.response, "data", exc.response)
    return str(data.get("error") or "") if isinstance(data, dict) else ""


def not_posted(exc: SlackApiError) -> str:
    """Why Slack refused a post in the job's thread, for the person; "" when the bot is not in
    the channel (the response_url is the command's own answer there, as before)."""
    error = slack_error(exc)
    if error in NOT_THERE:
        return ""
    said = CLOSED.get(error) or f"Slack answered `{error or http_status(exc)}`"
    return f"I cannot post in that thread: {said}"


def http_status(exc: SlackApiError) -> int:
    """The HTTP status of Slack's answer: `status_code` of slack_sdk's response, `status` of
    aiohttp's (an answer that was not JSON)."""
    response = exc.response
    return int(getattr(response, "status_code", None) or getattr(response, "status", 0) or 0)


def retry_after(exc: SlackApiError) -> float | None:
    """Seconds Slack asks to wait (a 429's `Retry-After`), or None if `exc` is no rate limit."""
    if http_status(exc) != 429:
        return None
    headers = {key.lower(): value for key, value in (exc.response.headers or {}).items()}
    value = headers.get("retry-after", 1)
    with contextlib.suppress(TypeError, ValueError):
        return min(float(value[0] if isinstance(value, list) else value), MAX_RETRY_AFTER_SECONDS)
    return 1.0


async def until_delivered(call: Callable[..., Awaitable[Any]], **kwargs: Any) -> Any:
    """A call whose content must arrive (an answer, a notice): a 429 waits its Retry-After."""
    for attempt in range(FINAL_TRIES):
        try:
            return await call(**kwargs)
        except SlackApiError as exc:
            wait = retry_after(exc)
            if wait is None or attempt == FINAL_TRIES - 1:
                raise
            log.info("rate limited on a final delivery; retrying in %.1f s", wait)
            await asyncio.sleep(wait)
    return None


def sections(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its markdown block as mrkdwn sections (a section takes 3,000 characters),
    its other blocks (the 👍/👎 buttons) kept."""
    kept = [b for b in body["blocks"] if b.get("type") != "markdown"]
    texts = split_message(body["text"], SECTION_LIMIT) or ["…"]
    cut = [{"type": "section", "text": {"type": "mrkdwn", "text": t}} for t in texts]
    return {**body, "blocks": [*cut, *kept]}


async def delivered_or_plain(
    call: Callable[..., Awaitable[Any]], body: dict[str, Any], **where: Any
) -> Any:
    """An answer's message (`until_delivered`); if Slack refuses its blocks, as mrkdwn
    sections with the buttons, then the text alone (an edit drops the placeholder's blocks),
    rather than no answer at all."""
    try:
        return await until_delivered(call, **where, **body)
    except SlackApiError as exc:
        if slack_error(exc) not in UNSHOWABLE or "blocks" not in body:
            raise
        log.warning("Slack refused a message's blocks (%s); sent as sections", slack_error(exc))
    try:
        return await until_delivered(call, **where, **sections(body))
    except SlackApiError as exc:
        if slack_error(exc) not in UNSHOWABLE:
            raise
        buttons = " and its 👍/👎 buttons left out" if len(body["blocks"]) > 1 else ""
        log.warning("Slack refused sections too (%s); sent as text%s", slack_error(exc), buttons)
    plain = {"blocks": []} if "ts" in where else {}
    return await until_delivered(call, **where, text=body["text"], **plain)


def maybe_posted(exc: BaseException) -> bool:
    """Slack may have made the post despite `exc`: its own error (MAYBE_POSTED, or a 5xx
    answer), or no answer at all after the request went out."""
    if isinstance(exc, SlackApiError):
        return slack_error(exc) in MAYBE_POSTED or http_status(exc) >= 500
    return isinstance(exc, NETWORK)


def marker(job: Job, part: int | str) -> str:
    """What a post of `job` carries in its metadata, to be found again: its part or PLACEHOLDER."""
    return f"{job.id}:{part}"


def left_out(shown: int, total: int, how: str) -> str:
    """The last post a response_url takes: how much of the answer it could not carry."""
    return (
        f"_Slack lets me post only {RESPONSE_URL_POSTS} messages here, so {total - shown} of "
        f"{total} parts are left out. {how}_"
    )


def see_it_all(why: str) -> str:
    """What the person can do to see an answer the response_url could not carry: the bot
    invited where it is not (`why` empty), else asked again elsewhere."""
    if not why:
        return "Invite me to the channel (`/invite @ArxivScout`) and ask again to see it all."
    return "Ask again in a channel I can post in (or in a DM with me) to see it all."


class SlackStatus(Status):
    """What a person sees while a turn runs: the placeholder (a message, or a streamed reply)
    with the tool in use and the answer as it grows. An update that fails or is rate limited
    is skipped, never raised: only the final answer (`finish`) must arrive."""

    def __init__(self, platform: SlackPlatform, job: Job, ts: str | None, streaming: bool = False):
        self.platform, self.job, self.client = platform, job, platform.client
        self.channel: str = job.reply["channel"]
        self.thread_ts: str | None = platform.where(job).get("thread_ts")
        self.ts = ts  # None: the channel is closed to the bot, answers go to response_url
        self.streaming = streaming  # `ts` is a chat stream still open: stopped before its edit
        self.refused = False  # Slack refused an append for good: no update until the final edit
        # the person stopped the stream (in this run or one before): nothing more is shown
        self.stopped = bool(job.progress.get("stopped"))
        self.streamed: list[str] = []
        self._appended = 0  # characters of the answer appended to the stream
        self._last_update = time.monotonic()
        self._quiet_until = 0.0  # a 429's Retry-After: intermediate updates wait until then
        self._status_shown = False

    async def event(self, event: AgentEvent) -> None:
        if event.kind != "tool_start" or self.ts is None or self.streamed or self.stopped:
            return
        activity = TOOL_ACTIVITY.get(event.name, "working")
        if not await self.set_status(f"is {activity}…") and not self.streaming:
            await self._quietly(
                self.client.chat_update,
                channel=self.channel, ts=self.ts, **markdown(f"_{activity.capitalize()}…_"),
            )  # fmt: skip

    async def delta(self, piece: str) -> None:
        self.streamed.append(piece)
        now = time.monotonic()
        if self.ts is None or self.refused or self.stopped:
            return
        if now - self._last_update < self.platform.update_every:
            return
        if now < self._quiet_until:
            return
        self._last_update = now
        text = "".join(self.streamed)
        if self.streaming:
            new = text[self._appended : MARKDOWN_LIMIT]  # the final edit carries the rest
            if new and await self._quietly(
                self.client.chat_appendStream, channel=self.channel, ts=self.ts, markdown_text=new
            ):
                self._appended += len(new)
        else:
            shown = link_arxiv(text)[:MARKDOWN_LIMIT] + " …"
            await self._quietly(
                self.client.chat_update, channel=self.channel, ts=self.ts, **markdown(shown)
            )

    async def set_status(self, text: str) -> bool:
        """The thread's status line (assistant.threads.setStatus), where the workspace has it."""
        team = self.job.scope.tenant
        if self.thread_ts is None or team in self.platform.no_status:
            return False
        try:
            await self.client.assistant_threads_setStatus(
                channel_id=self.channel, thread_ts=self.thread_ts, status=text
            )
        except SlackApiError as exc:
            if not self.platform.passing(exc):  # a 429, a 5xx, a proxy's page: not for good
                self.platform.no_status.add(team)
                log.info("no assistant status in %s (%s)", team, slack_error(exc))
            return False
        except NETWORK as exc:
            log.info("status not shown in %s: %r", self.channel, exc)
            return False
        self._status_shown = bool(text)
        return True

    async def finish(self, text: str, turn: str = "") -> None:
        """Replace the placeholder with `text` (an answer's first part, or a notice): stop the
        stream (failing in passing, raised while the job may run again), edit the message; if
        it is gone (or still streaming), post `text` anew and follow that message.
        `turn`: the answer's turn id, for its feedback buttons (when this is its last part).
        A stream the person stopped is left as they stopped it: the answer neither edited in
        nor posted anew; a notice (the turn failed, or was given up) is posted below it."""
        body = with_feedback(markdown(text), turn)
        if self.streaming:  # raised in passing: a run again stops it (`_show_working`)
            self.job.progress["showing"] = self._shows_the_answer()  # for that run
            ended = await self.platform.stop_stream(self.channel, self.ts)
            self.streaming = self.job.progress["stream"] = False
            if ended == STOPPED_BY_USER:
                self._stopped_by_the_person()
        if self._status_shown:
            await self.set_status("")
        if self.hides():
            log.info("stream %s in %s stopped by the person; not edited", self.ts, self.channel)
            return
        if self.stopped:  # the person must learn the turn failed: said below what they stopped
            await self.platform.post(self.job, 0, body)
            return
        try:
            await delivered_or_plain(
                self.client.chat_update, body, channel=self.channel, ts=self.ts
            )
        except SlackApiError as exc:
            if slack_error(exc) not in GONE:
                raise
            log.info("placeholder %s gone (%s); posting anew", self.ts, slack_error(exc))
            posted = await self.platform.post(self.job, 0, body)
            self.ts = self.job.progress["placeholder"] = posted["ts"]

    def hides(self) -> bool:
        """The person stopped the stream, and the job's reply is its answer (a turn id: not a
        notice that the turn failed or was given up, which they must see all the same)."""
        return self.stopped and bool(self.job.progress.get("turn"))

    def _shows_the_answer(self) -> bool:
        """The stream shows the answer as it grew: some of it appended, none refused since."""
        return bool(self._appended) and not self.refused

    def _stopped_by_the_person(self) -> None:
        """The person stopped the stream: left as they stopped it (no edit, part or post, a
        re-run's neither: `progress`), unless it showed none of the answer or froze (its
        appends refused): then a stop hides nothing, and the final edit shows the answer."""
        if not self._shows_the_answer():
            log.info("stream %s in %s stopped, but without the answer", self.ts, self.channel)
            self.refused = True  # no more appends or edits till the final edit, once
            return
        self.stopped = self.job.progress["stopped"] = True

    async def _quietly(self, call: Callable[..., Awaitable[Any]], **kwargs: Any) -> bool:
        try:
            await call(**kwargs)
        except SlackApiError as exc:
            wait = retry_after(exc)
            if wait is not None:
                self._quiet_until = time.monotonic() + wait
            elif slack_error(exc) in STREAM_ENDED:  # Slack closes idle streams: edited instead
                self.streaming = self.job.progress["stream"] = False
                if slack_error(exc) == STOPPED_BY_USER:
                    self._stopped_by_the_person()
            elif self.streaming and self.platform.refused(exc) and slack_error(exc):
                self.refused = True  # an append Slack's own error refused: never taken
            log.info("update skipped in %s: %s", self.channel, slack_error(exc))
            return False
        except NETWORK as exc:
            log.info("update skipped in %s: %s", self.channel, exc)
            return False
        return True


async def marked_post(
    client: AsyncWebClient, channel: str, thread_ts: str | None, field: str, marker: str,
    since: float,
) -> str | None:  # fmt: skip
    """The ts of the bot's message posted since `since` (a minute's slack) in the channel, or
    in the thread `thread_ts`, whose metadata's `field` is `marker`: a post Slack may have made
    though it answered an error (a reply's part, a digest), found before posting again."""
    options = {"channel": channel, "oldest": f"{since - 60:.6f}",
               "include_all_metadata": True, "limit": 200}  # fmt: skip
    if thread_ts:
        found = await client.conversations_replies(ts=thread_ts, **options)
    else:
        found = await client.conversations_history(**options)
    for message in found.get("messages") or []:
        payload = (message.get("metadata") or {}).get("event_payload") or {}
        if payload.get(field) == marker:
            return str(message["ts"])
    return None


class SlackPlatform(Platform):
    """Placeholders, streamed replies and Markdown blocks in threads; the response_url of a
    command or shortcut where the bot may not post."""

    name = "slack"
    limit = MARKDOWN_LIMIT
    streams = True

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.no_streaming: set[str] = set()  # workspaces without chat.startStream
        self.no_status: set[str] = set()  # workspaces without assistant.threads.setStatus
        self.update_every = UPDATE_EVERY_SECONDS

    def render(self, text: str) -> str:
        return link_arxiv(text)

    @staticmethod
    def where(job: Job) -> dict[str, str]:
        """channel, and thread_ts only if it is a real message ts (never the DM sentinel)."""
        thread_ts = job.reply.get("thread_ts")
        real = thread_ts and thread_ts != DM
        return {"channel": job.reply["channel"], **({"thread_ts": thread_ts} if real else {})}

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        yield await self._show_working(job)

    async def _show_working(self, job: Job) -> SlackStatus:
        progress = job.progress
        if progress.get("via") == "response_url":
            return SlackStatus(self, job, None)
        if progress.get("placeholder"):  # a re-run: the same message says it goes on
            status = SlackStatus(self, job, progress["placeholder"])
            if progress.get("stream"):  # left open by the run before (it died, or its stop failed)
                ended = await self.stop_stream(status.channel, status.ts)
                progress["stream"] = False
                # the person stopped it: left so, unless it showed none of the answer (a run
                # that died mid-stream did not say: it showed some of the answer it had, none
                # of the one this run computes anew)
                if ended == STOPPED_BY_USER and progress.get("showing", "answer" in progress):
                    status.stopped = progress["stopped"] = True
            if not progress.get("sent") and not status.stopped:
                await status._quietly(
                    self.client.chat_update,
                    channel=status.channel, ts=status.ts, **markdown(STILL_WORKING),
                )  # fmt: skip
            return status
        try:
            status = await self._stream(job) or await self._placeholder(job)
        except SlackApiError as exc:
            if self.passing(exc) or not job.reply.get("response_url"):
                raise  # in passing: runs again; no response_url: nowhere else to answer
            self._to_response_url(job, exc, "the answer")
            return SlackStatus(self, job, None)
        progress["placeholder"] = status.ts
        progress["stream"] = status.streaming
        await status.set_status("is thinking…" if job.kind == "turn" else "is summarizing…")
        return status

    async def stop_stream(self, channel: str, ts: str) -> str:
        """Stop the streamed message `ts`, else it stays "streaming" with part of the answer,
        and refuses every edit. Failing in passing, raised while the job may run again (that
        run stops it); on its last run, logged: the answer is posted anew (a duplicate beats
        an answer lost). A stream Slack ended already (STREAM_ENDED) is stopped; any other
        refusal (the message gone) is met by the edit that follows. Returned: "" when
        stopped, else Slack's error code (STOPPED_BY_USER: the person stopped it first), or
        on the last run the repr() of a network error."""
        try:
            await until_delivered(self.client.chat_stopStream, channel=channel, ts=ts)
        except (SlackApiError, *NETWORK) as exc:
            if self.passing(exc) and may_run_again.get():
                raise
            error = slack_error(exc) if isinstance(exc, SlackApiError) else repr(exc)
            if error not in STREAM_ENDED:
                log.info("stream %s in %s not stopped: %s", ts, channel, error)
            return error
        return ""

    async def _stream(self, job: Job) -> SlackStatus | None:
        """A streamed reply, where the workspace has streaming; None to post a placeholder."""
        where, team = self.where(job), job.reply.get("user_team") or job.scope.tenant
        if job.kind != "turn" or "thread_ts" not in where or team in self.no_streaming:
            return None
        if marker(job, PLACEHOLDER) in job.progress.get(UNSURE, {}):
            return None  # a placeholder a run before may have posted: looked for first
        try:
            started = await self.client.chat_startStream(
                **where, recipient_team_id=team, recipient_user_id=job.scope.user or None
            )
        except SlackApiError as exc:
            if slack_error(exc) in NOT_THERE:
                raise
            if not self.passing(exc) and slack_error(exc) not in OF_THE_PLACE:
                self.no_streaming.add(team)  # the placeholder meets a place's own refusal
            log.info("no streaming in %s (%s); editing a placeholder", *self._why(job, exc))
            return None
        except NETWORK as exc:
            log.info("no stream in %s (%r); editing a placeholder", job.reply.get("channel"), exc)
            return None
        return SlackStatus(self, job, started["ts"], streaming=True)

    async def _placeholder(self, job: Job) -> SlackStatus:
        first = THINKING if job.kind == "turn" else SUMMARIZING
        posted = await self.post(job, PLACEHOLDER, {"text": first})
        return SlackStatus(self, job, posted["ts"])

    async def post(self, job: Job, part: int | str, body: dict[str, Any]) -> Any:
        """Post part `part` of `job`'s reply (or its PLACEHOLDER), marked in its metadata: after
        an error Slack may have posted it despite (MAYBE_POSTED), it is looked for in the
        thread, and found, taken as posted. Not found (Slack may be degraded), it is noted in
        `job.progress` (saved as the job stays queued): a re-run looks for it first."""
        mark, unsure = marker(job, part), job.progress.get(UNSURE, {})
        if (ts := await self._posted_before(job, mark, unsure.get(mark))) is not None:
            log.info("%s was posted by a run before", mark)
            unsure.pop(mark, None)
            return {"ts": ts}
        since = unsure.get(mark, time.time())
        metadata = {"event_type": REPLY_EVENT, "event_payload": {"reply": mark}}
        where = {**self.where(job), "metadata": metadata}
        try:
            posted = await delivered_or_plain(self.client.chat_postMessage, body, **where)
        except (SlackApiError, *NETWORK) as exc:
            if not maybe_posted(exc):
                raise
            try:
                ts = await self._posted(job, mark, since)
            except (SlackApiError, *NETWORK) as lookup:
                log.info("could not look for %s in %s: %r", mark, where["channel"], lookup)
                ts = None
            if ts is None:
                job.progress.setdefault(UNSURE, {})[mark] = since
                raise
            log.info("%s was posted despite %r", mark, exc)
            posted = {"ts": ts}
        unsure.pop(mark, None)
        return posted

    async def _posted_before(self, job: Job, mark: str, since: float | None) -> str | None:
        """The ts of a post a run before may have made (`since`: when; None: none was unsure).
        A lookup failing in passing is raised (the job runs again, nothing posted twice); one
        failing for good (no history scope) lets the post be made."""
        if since is None:
            return None
        try:
            return await self._posted(job, mark, since)
        except (SlackApiError, *NETWORK) as exc:
            if self.passing(exc):
                raise
            log.warning("could not look for %s in %s: %r", mark, job.reply.get("channel"), exc)
            return None

    async def _posted(self, job: Job, mark: str, since: float) -> str | None:
        """The ts of the post marked `mark` in the job's thread (or DM), if Slack has it."""
        where = self.where(job)
        return await marked_post(
            self.client, where["channel"], where.get("thread_ts"), "reply", mark, since
        )

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        assert isinstance(status, SlackStatus)
        turn = feedback_turn(job, index)  # the last part of an answer carries 👍/👎
        if status.ts is None:
            await self._deliver_by_response_url(job, index, part)
            return
        try:
            if index == 0:
                await status.finish(part, turn)
            elif not status.hides():  # the person stopped the answer: no more parts either
                await self.post(job, index, with_feedback(markdown(part), turn))
        except SlackApiError as exc:
            if self.passing(exc) or not job.reply.get("response_url"):
                raise  # in passing: runs again; no response_url: nowhere else to answer
            # the thread closed to the bot since the placeholder (archived, its message gone)
            self._to_response_url(job, exc, "the rest of the answer" if index else "the answer")
            status.ts = None
            await self._deliver_by_response_url(job, index, part)

    def _to_response_url(self, job: Job, exc: SlackApiError, what: str) -> None:
        """The job answers at its response_url from now on (a re-run too: `progress`), saying
        why with the first part it sends there."""
        log.info("cannot post in %s (%s); answering via response_url", *self._why(job, exc))
        job.progress["via"] = "response_url"
        job.progress["why"] = not_posted(exc)
        if job.progress["why"]:
            job.progress["said"] = f"_{job.progress['why']}, so {what} comes here, for you only._"

    async def withdraw(self, job: Job, text: str) -> None:
        ts, channel = job.progress.get("placeholder"), job.reply["channel"]
        if not ts:
            return
        if job.progress.get("stream"):  # left open by the run before
            await self.stop_stream(channel, ts)
            job.progress["stream"] = False
        try:
            await delivered_or_plain(
                self.client.chat_update, markdown(text), channel=channel, ts=ts
            )
        except SlackApiError as exc:
            if slack_error(exc) not in GONE:
                raise
            log.info("placeholder %s gone (%s); nothing posted", ts, slack_error(exc))

    def passing(self, exc: BaseException) -> bool:
        if isinstance(exc, SlackApiError):
            status = http_status(exc)
            return slack_error(exc) in PASSING or status == 429 or status >= 500
        return super().passing(exc)

    def refused(self, exc: BaseException) -> bool:
        """Slack's own answer that is not in passing (is_archived, channel_not_found, ...)."""
        return isinstance(exc, SlackApiError) and not self.passing(exc)

    async def notice(self, job: Job, text: str) -> None:
        if job.progress.get("via") == "response_url":  # the thread refused it already
            await self.respond(job, text)
            return
        try:
            await until_delivered(self.client.chat_postMessage, **self.where(job), **markdown(text))
        except SlackApiError as exc:
            if self.passing(exc):
                raise
            if not job.reply.get("response_url"):
                await self._notice_elsewhere(job, text, exc)
                return
            why = not_posted(exc)
            await self.respond(job, f"{why}. {text}" if why else text)

    async def _notice_elsewhere(self, job: Job, text: str, exc: SlackApiError) -> None:
        """A notice its place refuses for good would never arrive there: a thread gone, in
        its channel (naming the person; nothing when the person's own message started it:
        usually they deleted it); a channel closed to the bot, in a DM with the person
        (naming the channel). Anything else is raised (logged by the pipeline)."""
        channel, user, error = job.reply["channel"], job.scope.user, slack_error(exc)
        if error in THREAD_REFUSED and (thread_ts := self.where(job).get("thread_ts")):
            if job.source == slack_source(channel, thread_ts):
                log.info("%s's own message started its thread, gone: nothing said", job.id)
                return
            said = f"<@{user}> {THREAD_GONE_NOTICE}" if user else THREAD_GONE_NOTICE
            await until_delivered(self.client.chat_postMessage, channel=channel, text=said)
            return
        if error not in PLACE_REFUSED or not user or channel.startswith("D"):
            raise exc
        opened = await self.client.conversations_open(users=user)
        said = f"About your message in <#{channel}>: {text}"
        await until_delivered(
            self.client.chat_postMessage, channel=opened["channel"]["id"], text=said
        )

    async def _deliver_by_response_url(self, job: Job, index: int, part: str) -> None:
        """The parts while the response_url has room for them and a note of what was left out
        (it takes 5 posts, a "Summarizing…" before counted), then that note; the first part it
        carries says why it comes there (`said`)."""
        progress = job.progress
        total = progress.get("parts") or len(
            split_message(self.render(progress.get("answer") or part), self.limit)
        )
        room = RESPONSE_URL_POSTS - progress.get("responded", 0)
        if room > 1 or (room == 1 and index == total - 1):  # the last part needs no note
            said = progress.get("said")
            await self.respond(job, f"{said}\n\n{part}" if said else part)
            progress.pop("said", None)
        elif room == 1:
            how = see_it_all(progress.get("why", ""))
            await self.respond(job, left_out(index, total, how))

    async def respond(self, job: Job, text: str) -> None:
        """Post `text` only the person sees, to the response_url of their command/shortcut."""
        sent = job.progress.get("responded", 0)
        if sent >= RESPONSE_URL_POSTS:
            log.warning("response_url used up in %s: %d chars unsent", job.scope.thread, len(text))
            return
        webhook = AsyncWebhookClient(job.reply["response_url"], session=self.client.session)
        response = await webhook.send(**markdown(text), response_type="ephemeral")
        if response.status_code >= 400:
            raise RuntimeError(f"response_url answered {response.status_code}: {response.body}")
        job.progress["responded"] = sent + 1

    @staticmethod
    def _why(job: Job, exc: SlackApiError) -> tuple[str, str]:
        return job.reply.get("channel", ""), slack_error(exc)
