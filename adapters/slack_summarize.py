"""`/summarize [thread link]` as durable work: the command is answered once its task is in
Redis; who the person is, where, and (a thread of another channel) whether they may read it are
asked of Slack after the answer (a membership may take pages, past Slack's 3 s).

- Before the answer, within ANSWER_SECONDS: the thread (the link's, else the person's last
  with the bot in this channel) and one XADD on the task's own stream (bot/background.py). The
  answer: "Summarizing…", "Checking…" (another channel's thread), or NOT_TAKEN when memory
  cannot take it in time. A process lost after the answer leaves the task pending in Redis:
  any live process with Slack's token (its consumer starts with the adapter's `check_token`)
  takes it over after CLAIM_IDLE_MS, so what was promised is kept.
- The run: the summary is queued (adapters/spine.py, de-duplicated by the task's id: a re-run
  never summarizes twice). A thread of another channel is checked first: a guest, a person of
  another organisation, or one not in that channel (users.conversations, adapters/
  slack_walls.py) is refused; a member's summary is queued, then "Summarizing…" said. What a
  check says goes to the command's response_url at most once (a marker in memory before
  posting): of its 5 posts, the summary's answer may use the 4 others.
- Slack cannot say (unreachable, failing, rate limited) whether they are in that channel, or
  who they are (users.info: walled by default, `Person.said` False, not a guest by Slack's
  word): the check runs again on the stream's redelivery, and only its last delivery says so
  (MEMBERSHIP_UNKNOWN, PERSON_UNKNOWN).
- A task that cannot be done (failing on every delivery with an unexpected error, or
  dead-lettered unrun after its last run took its process down: `given_up`) tells the person
  GIVEN_UP once (the same marker as a check's answer), not "Checking…" for ever.
- The message shortcut *Summarize thread* is the same task, queued before its (quiet) answer:
  its thread is of the channel the person reads, so no check; its summary goes to the thread,
  or to its response_url where the bot is not (adapters/slack.py `on_summarize_shortcut`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.platform_ids import slack_team
from adapters.slack_walls import SlackWalls
from adapters.spine import NOT_TAKEN, MemoryUnavailable
from bot.background import BackgroundWork
from bot.spent_tasks import last_delivery
from bot.turns import TurnHandler
from memory.coordination import ThreadPresence
from memory.errors import memory_unavailable
from memory.keys import task_stream
from memory.scope import Scope
from memory.tasks import TaskStream

log = logging.getLogger(__name__)

SUMMARIZE = "slack_summarize"  # the background task's kind
STREAM = "slack-summarize"
CLAIM_IDLE_MS = 30_000  # a check Slack could not answer runs again after this (longer than
# slack_walls.FAILED_SECONDS, so Slack is asked again); a dead process's is taken over then
MAX_DELIVERIES = 5  # about two minutes of Slack not saying, then the person is told
ANSWER_SECONDS = 2.0  # memory's part before the command's answer, of Slack's 3 s
KEPT = ("response_url", "user_team", "source_team")  # of the command: no token, no trigger

SUMMARIZING = "Summarizing the thread…"
CHECKING = "Checking that you may read that thread…"
NOT_A_MEMBER = (
    "You may only summarize threads of channels you are in: use `/summarize` in the thread's "
    "own channel."
)
MEMBERSHIP_UNKNOWN = (
    "Slack did not say whether you are in that thread's channel: try again in a minute, or use "
    "`/summarize` in that channel."
)
PERSON_UNKNOWN = (
    "Slack did not say who you are, so I cannot tell whether you may read that thread: try "
    "again in a minute, or use `/summarize` in that channel."
)
CANNOT_SAY = (MEMBERSHIP_UNKNOWN, PERSON_UNKNOWN)  # run again; said on the last delivery only
GIVEN_UP = "I could not summarize that thread: try again."
SHORTCUT_NOT_TAKEN = (
    "My memory (Redis) is unreachable right now, so I could not take this: if no summary "
    "comes in a few minutes, run *Summarize thread* on the message again."
)


def summary_event(task_id: str) -> str:
    """The event id of a task's summary: queued once, whoever queues it."""
    return f"{SUMMARIZE}:{task_id}"


class SlackCannotSay(Exception):
    """Slack did not say who the person is, or whether they are in the channel: the check
    runs again."""


async def may_not_read(
    walls: SlackWalls, team: str, user: str, channel: str, command: dict[str, Any]
) -> str | None:
    """Why a person may not have a thread of another channel than the command's summarized
    (its summary would be theirs to read): they are not in that channel, or they are walled
    (a guest, of another organisation: the command's own channel only); None: they may.
    Slack unable to say who they are (walled by default, not by its word): PERSON_UNKNOWN."""
    person = await walls.person(team, user)
    if not person.said:
        return PERSON_UNKNOWN
    if person.outsider or await walls.foreign(team, user, command):
        return NOT_A_MEMBER
    member = await walls.member_of(team, user, channel)
    return {True: None, False: NOT_A_MEMBER, None: MEMBERSHIP_UNKNOWN}[member]


class SummaryAdapter(Protocol):
    """What the summaries use of the Slack adapter (adapters/slack.py `SlackAdapter`)."""

    handler: TurnHandler  # its memory: the task stream and the told markers
    presence: ThreadPresence  # the person's last thread with the bot in a channel
    walls: SlackWalls  # who the person is, and whether they are in the thread's channel
    session: aiohttp.ClientSession  # the answers to response_url

    async def queue_summary(
        self, team: str, channel: str, thread_ts: str, user: str, payload: dict,
        notify: bool = True, responded: int = 0, event_id: str = "",
    ) -> None: ...  # fmt: skip


class SlackSummaries:
    """Queues `/summarize`'s and the message shortcut's tasks (their listeners) and runs them
    (any Slack process)."""

    def __init__(
        self, adapter: SummaryAdapter, stream: str = STREAM,
        claim_idle_ms: int = CLAIM_IDLE_MS, max_deliveries: int = MAX_DELIVERIES,
    ) -> None:  # fmt: skip
        """`adapter`: the SlackAdapter, whose memory, presence, walls and session the tasks use
        and whose `queue_summary` queues each summary (`SummaryAdapter`); `claim_idle_ms`: how
        long a task waits to run again, or to be taken over from a process that died."""
        self.adapter = adapter
        self.memory = adapter.handler.memory
        self.stream = TaskStream(self.memory.redis, task_stream(stream))
        self.work = BackgroundWork(
            self.stream, {SUMMARIZE: self.run}, batch=1, workers=2,
            claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries,
            on_dead_letter={SUMMARIZE: self.given_up},
        )  # fmt: skip

    def start(self) -> None:
        """Run the tasks from now on: this process's, and those of processes that died."""
        self.work.start()

    async def take(self, command: dict[str, Any], channel: str, thread_ts: str | None) -> str:
        """Queue the command's task (in Redis before this returns); the command's answer: ""
        when the person has no thread with the bot here (no link), NOT_TAKEN when memory
        cannot take it within ANSWER_SECONDS."""
        team, user, here = slack_team(command), command["user_id"], command["channel_id"]
        kept = {k: command[k] for k in KEPT if command.get(k)}
        thread = thread_ts or ""

        async def queue() -> None:
            nonlocal thread
            scope = Scope(team, channel=here, user=user)
            thread = thread or await self.adapter.presence.last_thread(scope) or ""
            if thread:
                await self._add(team, user, here, channel, thread, kept)

        if not await self._in_time(queue, f"/summarize in {here}"):
            return NOT_TAKEN
        if not thread:
            return ""
        return SUMMARIZING if channel == here else CHECKING

    async def take_shortcut(self, shortcut: dict[str, Any], thread_ts: str) -> tuple[bool, str]:
        """Queue the message shortcut's task (in Redis before this returns): the thread of a
        message in the channel the person is reading, so theirs to summarize (no check). Its
        `user.team_id` is kept as a command's `user_team` (is the person of another
        organisation?), its response_url for an answer where the bot is not. Whether memory
        took it within ANSWER_SECONDS, and its summary's event id: memory only slow, the task
        may have landed all the same, so a summary queued without it must carry that id too
        (queued once)."""
        team, channel = slack_team(shortcut), shortcut["channel"]["id"]
        user, person_team = shortcut["user"]["id"], shortcut["user"].get("team_id")
        kept = {"response_url": shortcut.get("response_url"), "user_team": person_team}
        kept = {k: v for k, v in kept.items() if v}
        task_id = uuid.uuid4().hex
        taken = await self._in_time(
            lambda: self._add(team, user, channel, channel, thread_ts, kept, task_id),
            f"a shortcut in {channel}",
        )
        return taken, summary_event(task_id)

    @staticmethod
    async def _in_time(queue: Callable[[], Awaitable[None]], what: str) -> bool:
        """Run `queue` within ANSWER_SECONDS; False when memory cannot take it in time
        (unavailable, or slow). Any other error is raised."""
        try:
            async with asyncio.timeout(ANSWER_SECONDS):
                await queue()
        except Exception as exc:
            if not (memory_unavailable(exc) or isinstance(exc, TimeoutError)):
                raise
            log.warning("memory unavailable; %s not queued: %r", what, exc)
            return False
        return True

    async def _add(
        self, team: str, user: str, here: str, channel: str, thread_ts: str, kept: dict[str, Any],
        task_id: str = "",
    ) -> None:  # fmt: skip
        """One XADD: the task, whoever runs it (`here`: where it was asked; `kept`: of the
        payload, no token, no trigger)."""
        await self.stream.add(SUMMARIZE, {
            "id": task_id or uuid.uuid4().hex, "team": team, "user": user, "here": here,
            "channel": channel, "thread_ts": thread_ts, "command": kept,
        })  # fmt: skip

    async def drain(self) -> None:
        await self.work.drain()

    async def stop_reading(self) -> None:
        """Close's first half: stop reading, hand back the tasks read but not started
        (bot/background.py `stop_reading`), without waiting for the running ones."""
        await self.work.stop_reading()

    async def close(self) -> None:
        """Finish the tasks in hand; the rest stays in Redis for another process."""
        await self.work.close()

    async def run(self, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            await self.one(payload)

    async def one(self, payload: dict[str, Any]) -> None:
        """One command's task, idempotent: run again, it queues no second summary and says
        nothing twice. Failing on its last delivery (an unexpected error), the person is told
        GIVEN_UP (once: not after the check's own answer)."""
        try:
            await self._check_and_queue(payload)
        except SlackCannotSay:
            raise  # raised before the last delivery only
        except Exception:
            if last_delivery():
                await self.given_up(payload)
            raise

    async def given_up(self, payload: dict[str, Any]) -> None:
        """The task will not be done (the dead-letter hook, too: its last run took its process
        down): the person is told, once. Best effort: memory down, it is logged."""
        try:
            await self._tell(payload, GIVEN_UP)
        except Exception as exc:
            log.warning("could not tell %s their summary was given up: %r", payload["user"], exc)

    async def _check_and_queue(self, payload: dict[str, Any]) -> None:
        """A thread of another channel is checked (may the person read it?), then the summary
        queued (not when refused); the check's answer is told."""
        team, user, channel = payload["team"], payload["user"], payload["channel"]
        command, elsewhere = payload["command"], channel != payload["here"]
        refusal = None
        if elsewhere:  # the summary would be theirs to read: may they read that thread?
            refusal = await may_not_read(self.adapter.walls, team, user, channel, command)
            if refusal in CANNOT_SAY and not last_delivery():
                raise SlackCannotSay(f"who is {user} of {team}, in {channel}?")
        if refusal is None:
            try:  # a check's "Summarizing…" takes one of the response_url's 5 posts
                await self.adapter.queue_summary(
                    team, channel, payload["thread_ts"], user, command, notify=False,
                    responded=int(elsewhere), event_id=summary_event(payload["id"]),
                )  # fmt: skip
            except MemoryUnavailable:
                if not last_delivery():
                    raise  # runs again once memory is back
                await self._post(payload, NOT_TAKEN)
                return
        if elsewhere:
            await self._tell(payload, refusal or SUMMARIZING)

    async def _tell(self, payload: dict[str, Any], text: str) -> None:
        """Say `text` once per task, whatever runs it again: its marker is taken first."""
        told = f"{SUMMARIZE}:{payload['id']}:told"
        if await self.memory.events.first_time(payload["team"], told):
            await self._post(payload, text)

    async def _post(self, payload: dict[str, Any], text: str) -> None:
        await self.answer(payload["command"].get("response_url"), text)

    async def answer(self, url: str | None, text: str) -> None:
        """To a command's or shortcut's response_url, only the person sees it; best effort
        (logged)."""
        if not url:
            return
        try:
            webhook = AsyncWebhookClient(url, session=self.adapter.session)
            response = await webhook.send(text=text, response_type="ephemeral")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("could not answer a /summarize or a shortcut: %r", exc)
            return
        if response.status_code >= 400:
            log.warning(
                "response_url answered %s to a /summarize or a shortcut", response.status_code
            )
