"""The Slack adapter (slack-bolt AsyncApp): Slack events in, `Job`s out; placeholders and
Markdown blocks back. Everything between is the spine's (`adapters/spine.py`).

- An @-mention in a channel is answered in its thread (`thread_ts`, else the message's `ts`);
  later messages in a thread the bot answered need no mention; direct messages work.
- Scope: tenant = the workspace (team id); thread `slack:<team>:<channel>:<thread_ts>`;
  visibility from the channel (public channel, private channel, DM).
- Bolt ignores the bot's own events; a middleware drops other bots, edits and deletions.
  Listeners only acknowledge and queue; `/expand` answers from a `lazy=` listener.
- `/summarize [thread link]` (Slack has no slash commands inside threads: default is the
  caller's most recent thread with the bot in that channel), `/expand <summary_id>`, and the
  message shortcut `summarize_thread`.
- Answers stream (chat.startStream/appendStream/stopStream, status via setStatus) where the
  workspace has it, else a placeholder is edited at most once a second; a 429 skips updates
  until its Retry-After, and the final answer waits it out. Where the bot may not post, a
  command's or shortcut's response_url carries the answer (5 posts at most).
- A message that cannot be queued (Redis down) is answered 503, so Slack sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.spine import (
    NOT_TAKEN,
    SHUTDOWN_GRACE_SECONDS,
    Job,
    MemoryUnavailable,
    Pipeline,
    Platform,
    Status,
)
from adapters.text import link_arxiv, split_message
from bot.agent import AgentEvent
from bot.tools import TOOL_ACTIVITY
from bot.turns import TurnHandler
from memory.scope import Scope, Visibility
from memory.text import clean_text

log = logging.getLogger(__name__)

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
IGNORED_SUBTYPES = {
    "bot_message",
    "message_changed",
    "message_deleted",
    "channel_join",
    "channel_leave",
}
DM = "dm"  # the thread of a direct message conversation with the bot
_THREAD_LINK = re.compile(
    r"/archives/(?P<channel>[A-Z0-9]+)/p(?P<ts>\d{16})(?:\?.*?thread_ts=(?P<thread>[\d.]+))?"
)


def thread_id(team: str, channel: str, thread_ts: str) -> str:
    return f"slack:{team}:{channel}:{thread_ts}"


def parse_thread_link(text: str) -> tuple[str, str] | None:
    """(channel, thread_ts) from a Slack message link, or None."""
    match = _THREAD_LINK.search(text)
    if not match:
        return None
    ts = match["thread"] or f"{match['ts'][:10]}.{match['ts'][10:]}"
    return match["channel"], ts


def markdown(text: str) -> dict[str, Any]:
    """A message body in standard Markdown (Slack's `markdown` block), with a text fallback."""
    return {"text": text, "blocks": [{"type": "markdown", "text": text}]}


def slack_error(exc: SlackApiError) -> str:
    return str(exc.response.get("error") or "")


def retry_after(exc: SlackApiError) -> float | None:
    """Seconds Slack asks to wait (a 429's `Retry-After`), or None if `exc` is no rate limit."""
    if exc.response.status_code != 429:
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


def left_out(shown: int, total: int, how: str) -> str:
    """The last post a response_url takes: how much of the answer it could not carry."""
    return (
        f"_Slack lets me post only {RESPONSE_URL_POSTS} messages here, so {total - shown} of "
        f"{total} parts are left out. {how}_"
    )


class SlackStatus(Status):
    """What a person sees while a turn runs: the placeholder (a message, or a streamed reply)
    with the tool in use and the answer as it grows. An update that fails or is rate limited
    is skipped, never raised: only the final answer (`finish`) must arrive."""

    def __init__(self, platform: SlackPlatform, job: Job, ts: str | None, streaming: bool = False):
        self.platform, self.job, self.client = platform, job, platform.client
        self.channel: str = job.reply["channel"]
        self.thread_ts: str | None = platform.where(job).get("thread_ts")
        self.ts = ts  # None: the channel is closed to the bot, answers go to response_url
        self.streaming = streaming  # `ts` is a chat stream still open
        self.streamed: list[str] = []
        self._appended = 0  # characters of the answer appended to the stream
        self._last_update = time.monotonic()
        self._quiet_until = 0.0  # a 429's Retry-After: intermediate updates wait until then
        self._status_shown = False

    async def event(self, event: AgentEvent) -> None:
        if event.kind != "tool_start" or self.ts is None or self.streamed:
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
        if self.ts is None or now - self._last_update < self.platform.update_every:
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
            if retry_after(exc) is None:
                self.platform.no_status.add(team)
                log.info("no assistant status in %s (%s)", team, slack_error(exc))
            return False
        self._status_shown = bool(text)
        return True

    async def finish(self, text: str) -> None:
        """Replace the placeholder with `text` (an answer's first part, or a notice): stop the
        stream, edit the message; if it is gone, post `text` anew and follow that message."""
        if self.streaming:
            with contextlib.suppress(SlackApiError):
                await until_delivered(self.client.chat_stopStream, channel=self.channel, ts=self.ts)
            self.streaming = self.job.progress["stream"] = False
        if self._status_shown:
            with contextlib.suppress(SlackApiError, aiohttp.ClientError):
                await self.set_status("")
        try:
            await until_delivered(
                self.client.chat_update, channel=self.channel, ts=self.ts, **markdown(text)
            )
        except SlackApiError as exc:
            if slack_error(exc) not in GONE:
                raise
            log.info("placeholder %s gone (%s); posting anew", self.ts, slack_error(exc))
            posted = await until_delivered(
                self.client.chat_postMessage, **self.platform.where(self.job), **markdown(text)
            )
            self.ts = self.job.progress["placeholder"] = posted["ts"]

    async def _quietly(self, call: Callable[..., Awaitable[Any]], **kwargs: Any) -> bool:
        try:
            await call(**kwargs)
        except SlackApiError as exc:
            wait = retry_after(exc)
            if wait is not None:
                self._quiet_until = time.monotonic() + wait
            elif self.streaming:  # the stream ended (Slack closes idle ones): edit it instead
                self.streaming = False
            log.info("update skipped in %s: %s", self.channel, slack_error(exc))
            return False
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("update skipped in %s: %s", self.channel, exc)
            return False
        return True


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
            if progress.get("stream"):  # left open by the run that died
                with contextlib.suppress(SlackApiError):
                    await self.client.chat_stopStream(channel=status.channel, ts=status.ts)
                progress["stream"] = False
            if not progress.get("sent"):
                await status._quietly(
                    self.client.chat_update,
                    channel=status.channel, ts=status.ts, **markdown(STILL_WORKING),
                )  # fmt: skip
            return status
        try:
            status = await self._stream(job) or await self._placeholder(job)
        except SlackApiError as exc:
            if slack_error(exc) not in NOT_THERE or not job.reply.get("response_url"):
                raise
            log.info("cannot post in %s (%s); answering via response_url", *self._why(job, exc))
            progress["via"] = "response_url"
            return SlackStatus(self, job, None)
        progress["placeholder"] = status.ts
        progress["stream"] = status.streaming
        await status.set_status("is thinking…" if job.kind == "turn" else "is summarizing…")
        return status

    async def _stream(self, job: Job) -> SlackStatus | None:
        """A streamed reply, where the workspace has streaming; None to post a placeholder."""
        where, team = self.where(job), job.scope.tenant
        if job.kind != "turn" or "thread_ts" not in where or team in self.no_streaming:
            return None
        try:
            started = await self.client.chat_startStream(
                **where, recipient_team_id=team, recipient_user_id=job.scope.user or None
            )
        except SlackApiError as exc:
            if slack_error(exc) in NOT_THERE:
                raise
            if retry_after(exc) is None and slack_error(exc) != "invalid_thread_ts":
                self.no_streaming.add(team)
            log.info("no streaming in %s (%s); editing a placeholder", *self._why(job, exc))
            return None
        return SlackStatus(self, job, started["ts"], streaming=True)

    async def _placeholder(self, job: Job) -> SlackStatus:
        first = THINKING if job.kind == "turn" else SUMMARIZING
        posted = await until_delivered(self.client.chat_postMessage, **self.where(job), text=first)
        return SlackStatus(self, job, posted["ts"])

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        assert isinstance(status, SlackStatus)
        if status.ts is None:
            await self._deliver_by_response_url(job, index, part)
        elif index == 0:
            await status.finish(part)
        else:
            await until_delivered(self.client.chat_postMessage, **self.where(job), **markdown(part))

    async def notice(self, job: Job, text: str) -> None:
        try:
            await until_delivered(self.client.chat_postMessage, **self.where(job), **markdown(text))
        except SlackApiError as exc:
            if slack_error(exc) not in NOT_THERE or not job.reply.get("response_url"):
                raise
            await self.respond(job, text)

    async def _deliver_by_response_url(self, job: Job, index: int, part: str) -> None:
        """The first parts, then a note of what was left out: a response_url takes 5 posts."""
        if index < RESPONSE_URL_PARTS:
            await self.respond(job, part)
        elif index == RESPONSE_URL_PARTS:
            answer = self.render(job.progress.get("answer") or part)
            total = len(split_message(answer, self.limit))
            how = "Invite me to the channel (`/invite @ArxivScout`) and ask again to see it all."
            await self.respond(job, left_out(RESPONSE_URL_PARTS, total, how))

    async def respond(self, job: Job, text: str) -> None:
        """Post `text` only the person sees, to the response_url of their command/shortcut."""
        sent = job.progress.get("responded", 0)
        if sent >= RESPONSE_URL_POSTS:
            log.warning("response_url used up in %s; not posted: %s", job.scope.thread, text[:60])
            return
        webhook = AsyncWebhookClient(job.reply["response_url"], session=self.client.session)
        response = await webhook.send(**markdown(text), response_type="ephemeral")
        if response.status_code >= 400:
            raise RuntimeError(f"response_url answered {response.status_code}: {response.body}")
        job.progress["responded"] = sent + 1

    @staticmethod
    def _why(job: Job, exc: SlackApiError) -> tuple[str, str]:
        return job.reply.get("channel", ""), slack_error(exc)


class SlackAdapter:
    """Reads Slack's events into jobs for the pipeline."""

    def __init__(
        self,
        handler: TurnHandler,
        bot_token: str,
        signing_secret: str | None = None,
        api_url: str | None = None,
    ) -> None:
        self.handler = handler
        self.presence = handler.memory.presence
        # one HTTP session for every Web API call (the client opens one per call without it)
        self.session = aiohttp.ClientSession()
        options = {"base_url": api_url} if api_url else {}
        self.client = AsyncWebClient(token=bot_token, session=self.session, **options)
        self.app = AsyncApp(
            # bolt's own client holds no session: bolt deep-copies it for `lazy=` listeners
            client=AsyncWebClient(token=bot_token, **options),
            signing_secret=signing_secret,
            request_verification_enabled=signing_secret is not None,
            process_before_response=True,  # listeners only queue: they finish in milliseconds
        )
        self.pipeline = Pipeline(SlackPlatform(self.client), handler)
        self.bot_user_id = ""
        self._visibility: dict[tuple[str, str], Visibility] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._lazy: set[asyncio.Task] = set()  # bolt's lazy listeners, waited for on close
        self._register()

    async def check_token(self) -> dict[str, Any]:
        """auth.test at start-up: a wrong token is named now, not at the first mention."""
        response = await self.client.auth_test()
        self.bot_user_id = response["user_id"]
        self.pipeline.start()  # from now on, take over the threads of processes that died
        return response.data

    # -- listeners: acknowledge, translate, queue ------------------------------------------

    def _register(self) -> None:
        self.app.error(self.on_error)
        self.app.middleware(self.skip_noise)
        self.app.event("app_mention")(self.on_mention)
        self.app.event("message")(self.on_message)
        self.app.command("/summarize")(self.on_summarize_command)
        self.app.command("/expand")(ack=self.ack_expand, lazy=[self.expand])
        self.app.shortcut("summarize_thread")(self.on_summarize_shortcut)

    @staticmethod
    async def skip_noise(body: dict, next) -> BoltResponse | None:
        """Acknowledge and drop what is never a question: other bots, edits, joins, empty text."""
        event = body.get("event") if body.get("type") == "event_callback" else None
        if event is not None and (
            event.get("bot_id")
            or event.get("subtype") in IGNORED_SUBTYPES
            or not event.get("user")
            or not event.get("text", "").strip()
            or not event.get("channel")
            or not event.get("ts")
        ):
            return BoltResponse(status=200, body="")
        await next()
        return None

    @staticmethod
    async def on_error(error: Exception, logger: logging.Logger) -> BoltResponse | None:
        """A message that could not be queued (memory down) is answered 503, so Slack sends
        the event again later; any other error keeps bolt's 500."""
        if isinstance(error, MemoryUnavailable):
            return BoltResponse(status=503, body="")
        logger.exception("Failed to run listener function (error: %s)", error, exc_info=error)
        return None

    async def on_mention(self, body: dict, event: dict, request: AsyncBoltRequest) -> None:
        await self._queue_turn(body, event, event.get("thread_ts") or event["ts"], request)

    async def on_message(self, body: dict, event: dict, request: AsyncBoltRequest) -> None:
        if event.get("channel_type") == "im":  # Slack sends no app_mention in DMs
            await self._queue_turn(body, event, event.get("thread_ts") or DM, request)
        elif f"<@{self.bot_user_id}>" in event.get("text", ""):
            return  # arrives as app_mention too
        elif event.get("thread_ts"):
            scope = await self._scope(body["team_id"], event, event["thread_ts"])
            if await self.presence.joined(scope):
                await self._queue_turn(body, event, event["thread_ts"], request)

    async def on_summarize_command(self, ack, command: dict) -> None:
        team, user = command["team_id"], command["user_id"]
        link = parse_thread_link(command.get("text", ""))
        here = await self._command_scope(command)
        channel, thread_ts = link if link else (command["channel_id"], None)
        thread_ts = thread_ts or await self.presence.last_thread(here)
        if not thread_ts:
            await ack(
                "I have no thread with you in this channel yet. Use `/summarize <thread link>` "
                "(⋯ on a message → Copy link), or the message shortcut *Summarize thread*."
            )
            return
        try:  # a command is not sent again: the answer to it says what happened
            await self._queue_summary(team, channel, thread_ts, user, command, notify=False)
        except MemoryUnavailable:
            await ack(NOT_TAKEN)
            return
        await ack("Summarizing the thread…")

    @staticmethod
    async def ack_expand(ack) -> None:
        await ack()  # the answer goes to response_url, from the lazy listener

    async def expand(self, command: dict, respond) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._lazy.add(task)
            task.add_done_callback(self._lazy.discard)
        scope = await self._command_scope(command)
        summary_id = command.get("text", "").strip()
        parts = split_message(
            link_arxiv(await self.handler.expand(scope, summary_id)), MARKDOWN_LIMIT
        )
        if len(parts) > RESPONSE_URL_POSTS:  # a response_url takes 5 posts
            how = f"Mention me in the summary's thread with “expand {summary_id}” to see it all."
            parts = [*parts[:RESPONSE_URL_PARTS], left_out(RESPONSE_URL_PARTS, len(parts), how)]
        for part in parts:
            await respond(**markdown(part), response_type="ephemeral")

    async def on_summarize_shortcut(self, ack, body: dict, shortcut: dict) -> None:
        await ack()
        message, channel = shortcut["message"], shortcut["channel"]["id"]
        team = (shortcut.get("team") or {}).get("id") or body["team"]["id"]
        in_dm = channel.startswith("D")  # a DM's messages outside threads are one conversation
        thread_ts = message.get("thread_ts") or (DM if in_dm else message["ts"])
        with contextlib.suppress(MemoryUnavailable):  # told; Slack sends no shortcut twice
            await self._queue_summary(team, channel, thread_ts, shortcut["user"]["id"], shortcut)

    # -- translation -----------------------------------------------------------------------

    async def _queue_turn(
        self, body: dict, event: dict, thread_ts: str, request: AsyncBoltRequest
    ) -> None:
        """Queue a question; memory down raises MemoryUnavailable (so Slack gets a 503 and
        sends the event again), telling the person on the first delivery only."""
        team = body.get("team_id") or event.get("team")
        scope = await self._scope(team, event, thread_ts)
        # a lone surrogate (bad input) would fail the job's JSON in Redis: replace it
        text = clean_text(re.sub(rf"<@{self.bot_user_id}>\s*", "", event["text"]).strip())
        job = Job(
            "turn", scope, text, event_id=body.get("event_id") or f"{event['channel']}:{event['ts']}",
            reply={"channel": event["channel"], "thread_ts": None if thread_ts == DM else thread_ts},
        )  # fmt: skip
        retried = bool(request.headers.get("x-slack-retry-num"))
        if await self.pipeline.submit(job, notify=not retried):
            await self.presence.join(scope, reference=thread_ts)  # a follow-up needs no mention

    async def _queue_summary(
        self, team: str, channel: str, thread_ts: str, user: str, payload: dict,
        notify: bool = True,
    ) -> None:  # fmt: skip
        """Queue a summary; its answer goes to the thread, or (the bot is not in the channel)
        to the response_url of the command or shortcut."""
        scope = await self._scope(team, {"channel": channel, "user": user}, thread_ts)
        reply = {"channel": channel, "thread_ts": None if thread_ts == DM else thread_ts}
        if payload.get("response_url"):
            reply["response_url"] = payload["response_url"]
        await self.pipeline.submit(Job("summarize", scope, reply=reply), notify=notify)

    async def _scope(self, team: str, event: dict, thread_ts: str) -> Scope:
        channel, user = event["channel"], event.get("user", "")
        return Scope(
            tenant=team,
            thread=thread_id(team, channel, thread_ts),
            channel=channel,
            visibility=await self._channel_visibility(team, channel, event.get("channel_type")),
            user=user,
            user_name=await self._user_name(team, user),
        )

    async def _command_scope(self, command: dict) -> Scope:
        """Where a slash command was used: its channel, for what that person may see there."""
        kind = {"directmessage": "im", "privategroup": "group"}.get(command.get("channel_name", ""))
        team, channel = command["team_id"], command["channel_id"]
        return Scope(
            tenant=team, channel=channel, user=command["user_id"],
            visibility=await self._channel_visibility(team, channel, kind),
        )  # fmt: skip

    async def _channel_visibility(self, team: str, channel: str, kind: str | None) -> Visibility:
        """Public, private or DM: from the event's channel_type, else asked of Slack once."""
        if kind == "im" or channel.startswith("D"):
            return Visibility.DM
        if kind in ("group", "mpim"):
            return Visibility.PRIVATE
        if kind == "channel":
            return Visibility.PUBLIC
        if (team, channel) not in self._visibility:
            info: dict[str, Any] = {}
            with contextlib.suppress(SlackApiError, aiohttp.ClientError):
                info = (await self.client.conversations_info(channel=channel)).get("channel") or {}
            private = info.get("is_private") or info.get("is_group") or info.get("is_mpim")
            self._visibility[(team, channel)] = Visibility.PRIVATE if private else Visibility.PUBLIC
        return self._visibility[(team, channel)]

    async def _user_name(self, team: str, user: str) -> str:
        """A person's display name, asked of Slack once per process; their id if unknown."""
        if not user:
            return ""
        if (team, user) not in self._names:
            profile: dict[str, Any] = {}
            with contextlib.suppress(SlackApiError, aiohttp.ClientError):
                found = (await self.client.users_info(user=user)).get("user") or {}
                profile = {**found, **(found.get("profile") or {})}
            self._names[(team, user)] = (
                profile.get("display_name") or profile.get("real_name") or user
            )
        return self._names[(team, user)]

    async def wait_idle(self) -> None:
        await self.pipeline.wait_idle()
        while self._lazy:
            await asyncio.gather(*list(self._lazy), return_exceptions=True)

    async def close(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Stop (SIGTERM, Ctrl-C): running turns get `grace` seconds, then go back to the
        queue for another process."""
        await self.pipeline.shutdown(grace)
        while self._lazy:
            await asyncio.gather(*list(self._lazy), return_exceptions=True)
        await self.session.close()
