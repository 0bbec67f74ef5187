"""The Slack adapter (slack-bolt AsyncApp): translates Slack events to turns and back.

- An @-mention in a channel is answered in its thread (`thread_ts`, else the message's `ts`);
  later messages in a thread the bot answered need no mention; direct messages work.
- Thread id: `slack:<team>:<channel>:<thread_ts>`; tenant: the workspace (team id).
- The bot's own messages, other bots, edits and deletions are ignored.
- Listeners only acknowledge, de-duplicate and queue; turns run in `ThreadDispatcher`, one at
  a time per thread across every process sharing the Redis.
- `/summarize [thread link]` (Slack has no slash commands inside threads: default is the
  caller's most recent thread with the bot in that channel), `/expand <summary_id>`, and the
  message shortcut `summarize_thread`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp
from redis.asyncio import Redis
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_format import to_mrkdwn
from adapters.text import split_message
from bot.agent import AgentEvent
from bot.dispatch import Deduplicator, Job, ThreadDispatcher
from bot.tools import TOOL_ACTIVITY
from bot.turns import TurnHandler
from memory.keys import ROOT

log = logging.getLogger(__name__)

THINKING = "_Thinking…_"
SLACK_TEXT_LIMIT = 3500
UPDATE_EVERY_SECONDS = 1.0
PARTICIPATION_TTL = 90 * 24 * 3600
IGNORED_SUBTYPES = {
    "bot_message",
    "message_changed",
    "message_deleted",
    "channel_join",
    "channel_leave",
}
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


class SlackAdapter:
    def __init__(
        self,
        handler: TurnHandler,
        redis: Redis,
        bot_token: str,
        signing_secret: str | None = None,
        api_url: str | None = None,
    ) -> None:
        self.handler = handler
        self.redis = redis
        # one HTTP session for every Web API call (the client opens one per call without it)
        self.session = aiohttp.ClientSession()
        options = {"base_url": api_url} if api_url else {}
        self.client = AsyncWebClient(token=bot_token, session=self.session, **options)
        self.app = AsyncApp(
            client=self.client,
            signing_secret=signing_secret,
            request_verification_enabled=signing_secret is not None,
            process_before_response=True,  # listeners only queue: they finish in milliseconds
        )
        self.dedup = Deduplicator(redis)
        self.dispatcher = ThreadDispatcher(redis, self.run_job)
        self.bot_user_id = ""
        self._tasks: set[asyncio.Task] = set()
        self._register()

    async def check_token(self) -> dict[str, Any]:
        """auth.test at start-up: a wrong token is named now, not at the first mention."""
        response = await self.client.auth_test()
        self.bot_user_id = response["user_id"]
        return response.data

    # -- listeners: acknowledge, de-duplicate, queue ---------------------------------------

    def _register(self) -> None:
        self.app.event("app_mention")(self.on_mention)
        self.app.event("message")(self.on_message)
        self.app.command("/summarize")(self.on_summarize_command)
        self.app.command("/expand")(self.on_expand_command)
        self.app.shortcut("summarize_thread")(self.on_summarize_shortcut)

    async def on_mention(self, body: dict, event: dict) -> None:
        if self._ignored(event):
            return
        await self._queue_turn(body, event, event.get("thread_ts") or event["ts"])

    async def on_message(self, body: dict, event: dict) -> None:
        if self._ignored(event) or f"<@{self.bot_user_id}>" in event.get("text", ""):
            return  # mentions arrive as app_mention too
        if event.get("channel_type") == "im":
            await self._queue_turn(body, event, event.get("thread_ts") or "dm")
        elif event.get("thread_ts") and await self._participates(
            body["team_id"], event["channel"], event["thread_ts"]
        ):
            await self._queue_turn(body, event, event["thread_ts"])

    async def on_summarize_command(self, ack, body: dict, command: dict) -> None:
        channel, team, user = command["channel_id"], command["team_id"], command["user_id"]
        link = parse_thread_link(command.get("text", ""))
        if link:
            channel, thread_ts = link
        else:
            thread_ts = await self._last_thread(team, channel, user)
        if not thread_ts:
            await ack(
                "I have no thread with you in this channel yet. Use `/summarize <thread link>` "
                "(⋯ on a message → Copy link), or the message shortcut *Summarize thread*."
            )
            return
        await ack("Summarizing the thread…")
        await self._queue_summary(team, channel, thread_ts, user)

    async def on_expand_command(self, ack, command: dict, respond) -> None:
        await ack()  # the answer goes to response_url after the acknowledgement
        self._later(self._expand(command["team_id"], command.get("text", "").strip(), respond))

    async def _expand(self, team: str, summary_id: str, respond) -> None:
        text = await self.handler.expand(team, summary_id)
        for part in split_message(to_mrkdwn(text), SLACK_TEXT_LIMIT):
            await respond(text=part, response_type="ephemeral")

    def _later(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def on_summarize_shortcut(self, ack, body: dict, shortcut: dict) -> None:
        await ack()
        message = shortcut["message"]
        team = (shortcut.get("team") or {}).get("id") or body["team"]["id"]
        thread_ts = message.get("thread_ts") or message["ts"]
        await self._queue_summary(
            team, shortcut["channel"]["id"], thread_ts, shortcut["user"]["id"]
        )

    def _ignored(self, event: dict) -> bool:
        return bool(
            event.get("bot_id")
            or event.get("subtype") in IGNORED_SUBTYPES
            or event.get("user") in (None, self.bot_user_id)
            or not event.get("text", "").strip()
        )

    async def _queue_turn(self, body: dict, event: dict, thread_ts: str) -> None:
        event_id = body.get("event_id") or f"{event['channel']}:{event['ts']}"
        if not await self.dedup.first_time(f"slack:{event_id}"):
            return
        team = body.get("team_id") or event.get("team")
        text = re.sub(rf"<@{self.bot_user_id}>\s*", "", event["text"]).strip()
        job = {"kind": "turn", "team": team, "channel": event["channel"], "thread_ts": thread_ts,
               "user": event["user"], "text": text, "event_id": event_id,
               "reply_in_thread": thread_ts != "dm"}  # fmt: skip
        self.handler.prefetch(text)
        await self._remember(job)  # now, so a follow-up sent right after is recognised
        await self.dispatcher.submit(thread_id(team, event["channel"], thread_ts), job)

    async def _queue_summary(self, team: str, channel: str, thread_ts: str, user: str) -> None:
        job = {
            "kind": "summarize",
            "team": team,
            "channel": channel,
            "thread_ts": thread_ts,
            "user": user,
        }
        await self.dispatcher.submit(thread_id(team, channel, thread_ts), job)

    # -- Redis bookkeeping ---------------------------------------------------------------

    def _participation_key(self, team: str, channel: str, thread_ts: str) -> str:
        return f"{ROOT}:slack:in-thread:{team}:{channel}:{thread_ts}"

    async def _participates(self, team: str, channel: str, thread_ts: str) -> bool:
        return bool(await self.redis.exists(self._participation_key(team, channel, thread_ts)))

    async def _remember(self, job: Job) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(
            self._participation_key(job["team"], job["channel"], job["thread_ts"]),
            1,
            ex=PARTICIPATION_TTL,
        )
        pipe.hset(
            f"{ROOT}:slack:last-thread:{job['team']}:{job['channel']}",
            job["user"],
            job["thread_ts"],
        )
        await pipe.execute()

    async def _last_thread(self, team: str, channel: str, user: str) -> str | None:
        value = await self.redis.hget(f"{ROOT}:slack:last-thread:{team}:{channel}", user)
        return value.decode() if isinstance(value, bytes) else value

    # -- jobs: one at a time per thread ----------------------------------------------------

    async def run_job(self, job: Job) -> None:
        if job["kind"] == "summarize":
            await self._summarize(job)
        else:
            await self._turn(job)

    async def _turn(self, job: Job) -> None:
        channel = job["channel"]
        where = {"thread_ts": job["thread_ts"]} if job["reply_in_thread"] else {}
        placeholder = await self.client.chat_postMessage(channel=channel, text=THINKING, **where)
        ts = placeholder["ts"]
        streamed: list[str] = []
        last_update = [time.monotonic()]

        async def update(text: str) -> None:
            await self.client.chat_update(channel=channel, ts=ts, text=text)

        async def on_event(event: AgentEvent) -> None:
            if event.kind == "tool_start" and not streamed:
                await update(f"_{TOOL_ACTIVITY.get(event.name, 'working').capitalize()}…_")

        async def on_delta(piece: str) -> None:
            streamed.append(piece)
            if time.monotonic() - last_update[0] >= UPDATE_EVERY_SECONDS:
                last_update[0] = time.monotonic()
                await update(to_mrkdwn("".join(streamed))[:SLACK_TEXT_LIMIT] + " …")

        tid = thread_id(job["team"], channel, job["thread_ts"])
        reply = await self.handler.handle(
            job["team"], tid, job["user"], job["text"], on_event, on_delta
        )
        first, *rest = split_message(to_mrkdwn(reply.text), SLACK_TEXT_LIMIT) or ["(no answer)"]
        await update(first)
        for part in rest:
            await self.client.chat_postMessage(channel=channel, text=part, **where)

    async def _summarize(self, job: Job) -> None:
        tid = thread_id(job["team"], job["channel"], job["thread_ts"])
        text = await self.handler.summarize(job["team"], tid)
        await self.client.chat_postMessage(
            channel=job["channel"], thread_ts=job["thread_ts"], text=to_mrkdwn(text)
        )

    async def wait_idle(self) -> None:
        await self.dispatcher.wait_idle()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.wait_idle()
        await self.session.close()
