"""The Slack adapter (slack-bolt AsyncApp): Slack events in, `Job`s out; placeholders and
Markdown blocks back. Everything between is the spine's (`adapters/spine.py`).

- An @-mention in a channel is answered in its thread (`thread_ts`, else the message's `ts`);
  later messages in a thread the bot answered need no mention; direct messages work. A mention
  with no question (sent too early) gets a hint once, and nothing is queued: in a channel or
  thread, its thread is joined (a reply there is answered), and its edit that adds the
  question (Slack's `app_mention` again) is answered as a new mention (Slack sends no
  `app_mention` for a DM's edit). Files shared with the bot where they are not read (no file
  service in this process: adapters/slack_files.py) leave their message a question, noted as
  shared with files not read (the model knows; an edit of it too), the person told so
  (FILES_UNREAD_ANSWERED, alongside its answer); with no question (an edit that adds a bare
  mention too), told that files are not read here (FILES_UNREAD): one or the other, once a
  message, whatever its edits.
- Scope: tenant = the workspace whose installation the payload is for (`platform_ids.
  slack_team`, as bolt's `context.team_id`: in a shared channel an event's envelope `team_id`
  may be the channel creator's workspace); thread `slack:<team>:<channel>:<thread_ts>`;
  visibility from the channel (public channel, private channel, DM). Walled off the team's
  public memory (and stored private to its place) when a guest or someone of another
  organisation asks, or in a channel shared with another organisation (`slack_walls.py`).
- Bolt ignores the bot's own events; a middleware drops other bots, Slack's notices (joins,
  pins, topics: any subtype but a person's message, a broadcast reply, a file share, a /me) and
  empty messages. Listeners only acknowledge and queue; `/expand` answers from a `lazy=` listener.
- A person's message deleted in Slack (`message_deleted`; a thread's parent becomes a
  `tombstone` through `message_changed`) is forgotten: its erasure is queued as a background
  task that finds the stored message by its source (`channel:ts`). A person's edit
  (`message_changed` to a message that is no tombstone) is followed the same way: the stored
  message gets the new text (bot/upkeep.py `message_edited`); the edit is not answered.
- A channel deleted in Slack (`channel_deleted`, `group_deleted`) is forgotten: every thread
  of it, and its watches (memory/governance_places.py).
- The app uninstalled (`app_uninstalled`, or `tokens_revoked` naming the bot): the team's
  memory is erased ARXIVSCOUT_UNINSTALLED_KEEP_DAYS later (memory/governance_tenants.py);
  any later command, or event other than noise and the bot's own, from the team cancels that
  (`note_team_back`, best effort: memory down does not refuse the event).
- A channel another organisation joined or left (`channel_shared`, `channel_unshared`): the
  process that receives the event forgets what it cached of the channel, and asks Slack again
  at its next event there. Slack sends the event to one process only: another process's
  events follow within its cache's 5 minutes (`CACHE_SECONDS`); its digests do not wait for
  that (they ask Slack afresh: adapters/slack_watch.py `walled`). A channel made private or
  public (Slack's `channel_convert_to_private` or `channel_convert_to_public` notice in it) is
  forgotten the same way, in every process at once.
- `/summarize [thread link]` (Slack has no slash commands inside threads: default is the
  caller's most recent thread with the bot in that channel), `/expand <summary_id>`, and the
  message shortcut `summarize_thread`. A link to a thread of another channel is summarized
  only for a member of that channel (users.conversations) who is not walled: the summary is
  theirs to read (checked after the command's answer, as durable work: a membership may take
  pages; `adapters/slack_summarize.py`).
- Slack is asked about a message's channel and person only when the message is for the bot
  (a DM, a mention, a thread it takes part in); not for the rest of a channel's talk.
- `/memory` answers (ephemerally) with the caller's signed link to the memory page; the App
  Home tab is published when opened, and again when its button is pressed
  (`adapters/slack_home.py`).
- How answers are shown and delivered (streams, placeholders, rate limits, response_url) is
  `adapters/slack_delivery.py`.
- A message that cannot be queued (Redis down) is answered 503, so Slack sends it again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import Directory
from adapters.memory_page.auth import Links
from adapters.platform_ids import slack_in_dm, slack_source, slack_team
from adapters.slack_delivery import (
    DM,
    MARKDOWN_LIMIT,
    RESPONSE_URL_PARTS,
    RESPONSE_URL_POSTS,
    SlackPlatform,
    left_out,
    markdown,
)
from adapters.slack_feedback import SlackFeedback
from adapters.slack_files import (
    FILES_UNREAD,
    FILES_UNREAD_ANSWERED,
    SlackFiles,
    slack_reply,
    unread_noted,
)
from adapters.slack_home import BUTTON_ACTION, SlackHome
from adapters.slack_summarize import (
    CLAIM_IDLE_MS,
    GIVEN_UP,
    SHORTCUT_NOT_TAKEN,
    STREAM,
    SlackSummaries,
)
from adapters.slack_walls import CACHE_SECONDS, SlackWalls
from adapters.slack_watch import SlackWatches
from adapters.spine import (
    NOT_TAKEN,
    SHUTDOWN_GRACE_SECONDS,
    Job,
    MemoryUnavailable,
    Pipeline,
    not_queued_for_now,
    unavailable_raised,
)
from adapters.text import link_arxiv, slack_question, split_message
from bot.feedback import FeedbackService
from bot.turns import TurnHandler, command_failure
from memory.errors import memory_unavailable
from memory.governance_places import DeletedPlace
from memory.scope import Scope

log = logging.getLogger(__name__)

MESSAGE_EVENTS = ("message", "app_mention")
EARLY_JOIN_SECONDS = 1.0  # a mention's thread marked joined before Slack is asked about it
# a follow-up waits for that mention, short of Slack's 3 s for the whole listener
EARLY_JOIN_WAIT_SECONDS, EARLY_JOIN_POLLS = 1.0, 10
# what a person writes: Slack's other `message` subtypes are notices (a join, a pin, a topic,
# a bot's post...), never a question; edits and deletions are told apart before this
MESSAGE_SUBTYPES = (None, "thread_broadcast", "file_share", "me_message")
# the channel made private or public: what Slack said of it (cached, by every process) is asked
# again
CONVERTED = ("channel_convert_to_private", "channel_convert_to_public")
# never the app coming back (Slack may send the first two in either order)
REMOVAL_EVENTS = ("app_uninstalled", "tokens_revoked", "team_access_revoked")
# a mention with nothing after it (sent too early): nothing is queued, so its edit is a question
EMPTY_MENTION = (
    "Ask me something after the mention — for example: `@ArxivScout find papers on "
    "retrieval-augmented generation`. You can also edit your message to add the question, or "
    "just reply here."
)
EMPTY_DM = (
    "What would you like to know? Send me your question — for example: `find papers on "
    "retrieval-augmented generation` (no need to mention me here)."
)
NO_THREAD = (
    "I have no thread with you in this channel yet. Use `/summarize <thread link>` "
    "(⋯ on a message → Copy link), or the message shortcut *Summarize thread*."
)
_THREAD_LINK = re.compile(
    r"/archives/(?P<channel>[A-Z0-9]+)/p(?P<ts>\d{16})(?:\?.*?thread_ts=(?P<thread>[\d.]+))?"
)


def thread_id(team: str, channel: str, thread_ts: str) -> str:
    return f"slack:{team}:{channel}:{thread_ts}"


def stored_thread(in_dm: bool, ts: str, thread_ts: str | None) -> str:
    """The thread a person's message (`ts`, in the thread `thread_ts`, if any) is stored in,
    and so what a summary of it is of: the thread it is in; outside threads, a DM's whole
    conversation (DM: its messages are one conversation), else the thread under it."""
    return thread_ts or (DM if in_dm else ts)


def stored_in(team: str, event: dict, message: dict) -> list[str]:
    """The threads `_queue_turn` may have stored a person's message (`message`: its ts and
    thread_ts) of `event`'s channel in: its thread, or a DM's conversation (a DM's message
    with replies under it was stored there, not in their thread)."""
    channel, ts, in_dm = event["channel"], message["ts"], slack_in_dm(event)
    thread_ts = stored_thread(in_dm, ts, message.get("thread_ts"))
    places = [thread_ts, DM] if in_dm and thread_ts == ts else [thread_ts]
    return [thread_id(team, channel, t) for t in places]


def deleted_message(event: dict) -> dict | None:
    """The message (ts, thread_ts, user, bot_id) an event says was deleted, or None. Slack
    sends `message_deleted`, or, for a thread's parent, which stays as a "This message was
    deleted." tombstone, `message_changed` to a message of subtype `tombstone`."""
    if event.get("type") != "message":
        return None
    previous = event.get("previous_message") or {}
    if event.get("subtype") == "message_deleted":
        return {**previous, "ts": event.get("deleted_ts") or previous.get("ts")}
    now = event.get("message") or {}
    if event.get("subtype") == "message_changed" and now.get("subtype") == "tombstone":
        thread_ts = now.get("thread_ts") or previous.get("thread_ts")
        return {**previous, "ts": now.get("ts") or previous.get("ts"), "thread_ts": thread_ts}
    return None


def edited_message(event: dict) -> dict | None:
    """The message a `message_changed` event says was edited (its ts, thread_ts, user,
    bot_id, text), with `previous_text`; None for any other event, and for a deletion (the
    new message a tombstone: `deleted_message`)."""
    if event.get("type") != "message" or event.get("subtype") != "message_changed":
        return None
    now = event.get("message") or {}
    if now.get("subtype") == "tombstone" or not now.get("ts"):
        return None
    previous = event.get("previous_message") or {}
    return {**now, "previous_text": previous.get("text")}


def unread_claim(event: dict) -> str:
    """The claim that a message's person was told its files are not read (FILES_UNREAD or
    FILES_UNREAD_ANSWERED, once whatever its edits): not the turn's `channel:ts`."""
    return f"{event['channel']}:{event['ts']}:unread"


def converted(event: dict) -> bool:
    """Slack's notice, posted in the channel, that it was made private or public (`message` of
    subtype `channel_convert_to_private` or `_public`): Slack has no event of its own for that."""
    return event.get("type") == "message" and event.get("subtype") in CONVERTED


def slack_retry(request: AsyncBoltRequest) -> bool:
    """A redelivery of an event: its retry number above 0. Socket Mode sends `retry_attempt`
    0 with a first delivery, and bolt turns that into the header too."""
    value = request.headers.get("x-slack-retry-num") or ["0"]
    number = value[0] if isinstance(value, list | tuple) else value
    return str(number).strip().isdigit() and int(number) > 0


def parse_thread_link(text: str) -> tuple[str, str] | None:
    """(channel, thread_ts) from a Slack message link (`stored_thread`: a DM's message
    outside threads is its DM's conversation), or None."""
    match = _THREAD_LINK.search(text)
    if not match:
        return None
    ts = f"{match['ts'][:10]}.{match['ts'][10:]}"
    channel = match["channel"]
    return channel, stored_thread(channel.startswith("D"), ts, match["thread"])


class SlackAdapter:
    """Reads Slack's events into jobs for the pipeline."""

    def __init__(
        self,
        handler: TurnHandler,
        bot_token: str,
        signing_secret: str | None = None,
        api_url: str | None = None,
        links: Links | None = None,
        directory: Directory | None = None,
        cache_seconds: float = CACHE_SECONDS,
        summarize_stream: str = STREAM,
        summarize_claim_idle_ms: int = CLAIM_IDLE_MS,
    ) -> None:
        """`links`: the memory page's (for `/memory` and the Home tab); `directory`: who may
        see what there (the Home tab's threads follow it); `cache_seconds`: how long Slack's
        answers about channels and people are kept (adapters/slack_walls.py);
        `summarize_stream`, `summarize_claim_idle_ms`: the checks of `/summarize <link>`'s
        stream, and how long one waits to run again (adapters/slack_summarize.py)."""
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
            # listeners only queue: milliseconds (a follow-up waits at most EARLY_JOIN_WAIT_SECONDS)
            process_before_response=True,
        )
        self.pipeline = Pipeline(SlackPlatform(self.client), handler)
        self.files = SlackFiles(self)  # PDFs shared where the bot takes part
        self.bot_user_id = ""
        # channels' and people's walls
        self.walls = SlackWalls(self.client, cache_seconds, sharing=handler.memory.sharing)
        self._lazy: set[asyncio.Task] = set()  # bolt's lazy listeners, waited for on close
        self.home = SlackHome(handler.memory, self.client, links, directory, self.walls)
        self.summaries = SlackSummaries(self, summarize_stream, summarize_claim_idle_ms)
        self._register()

    async def check_token(self) -> dict[str, Any]:
        """auth.test at start-up: a wrong token is named now, not at the first mention."""
        response = await self.client.auth_test()
        self.bot_user_id = response["user_id"]
        self.home.team_url = response.get("url") or ""
        self.pipeline.start()  # from now on, take over the threads of processes that died
        self.summaries.start()  # and run `/summarize <link>`'s checks, theirs too
        return response.data

    # -- listeners: acknowledge, translate, queue ------------------------------------------

    def _register(self) -> None:
        self.app.error(self.on_error)
        self.app.middleware(self.skip_noise)
        self.app.middleware(self.note_team_back)  # every command and event that is not noise
        self.app.event("app_mention")(self.on_mention)
        self.app.event("message")(self.on_message)
        self.app.event("channel_deleted")(self.on_channel_deleted)
        self.app.event("group_deleted")(self.on_channel_deleted)  # a private channel
        self.app.event("app_uninstalled")(self.on_removed)  # the team's memory: erased later
        self.app.event("tokens_revoked")(self.on_removed)
        self.app.event("team_access_revoked")(self.on_removed)  # an org app's workspaces
        # another organisation joined or left a channel: its walls are asked of Slack again
        self.app.event("channel_shared")(self.walls.on_sharing_changed)
        self.app.event("channel_unshared")(self.walls.on_sharing_changed)
        self.app.command("/summarize")(self.on_summarize_command)
        self.app.command("/expand")(ack=self.ack_expand, lazy=[self.expand])
        self.app.shortcut("summarize_thread")(self.on_summarize_shortcut)
        self.app.command("/memory")(self.on_memory_command)
        self.app.event("app_home_opened")(ack=self.ack_quietly, lazy=[self.publish_home])
        self.app.action(BUTTON_ACTION)(ack=self.ack_quietly, lazy=[self.publish_home])
        admins = getattr(self.home.directory, "admins", None)  # ARXIVSCOUT_ADMINS
        watches = SlackWatches(self.handler.watches, self.client, admins, self.walls)
        watches.register(self.app, self._command_scope)
        SlackFeedback(FeedbackService(self.handler.memory), self.client).register(self.app)

    @staticmethod
    async def skip_noise(body: dict, next) -> BoltResponse | None:
        """Acknowledge and drop what is never a question: other bots, Slack's notices, empty
        text. Deletions, edits and a channel made private or public go on to `on_message`."""
        event = body.get("event") if body.get("type") == "event_callback" else None
        if event is not None and deleted_message(event) is not None:
            await next()  # no user, no text: `on_message` takes it to `on_deleted`
            return None
        if event is not None and edited_message(event) is not None:
            await next()  # no user at its top: `on_message` takes it to `on_edited`
            return None
        if event is not None and converted(event):
            await next()  # not a question: `on_message` has the walls ask Slack again
            return None
        if (
            event is not None
            and event.get("type") in MESSAGE_EVENTS
            and (
                event.get("bot_id")
                or event.get("subtype") not in MESSAGE_SUBTYPES
                or not event.get("user")
                or not (event.get("text", "").strip() or event.get("files"))
                or not event.get("channel")
                or not event.get("ts")
            )
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
        if event.get("files") and not event.get("edited"):
            return  # its `message` event takes it: its files, or its text if they are not read
        if event.get("edited") and await self._taken(slack_team(body), event):
            return  # Slack's `app_mention` again for an edit: `on_edited` follows the edit
        if event.get("files") and await self.files.take(body, event):
            return  # an edit that adds the mention to a file share: taken once
        await self._queue_turn(body, event, event.get("thread_ts") or event["ts"], request)

    async def _taken(self, team: str, event: dict) -> bool:
        """Whether the bot stored this message already (an edit of a question it answered,
        which Slack sends as a new `app_mention`; one still queued is kept out by its job's
        `channel:ts` event id). Memory down answers 503, so Slack sends the event again."""
        source = slack_source(event["channel"], event["ts"])
        with unavailable_raised():
            edits = self.handler.memory.governance.edits
            return await edits.stored(team, stored_in(team, event, event), source)

    async def on_message(self, body: dict, event: dict, request: AsyncBoltRequest) -> None:
        if converted(event):  # cached answers of its walls go, here and in every process
            with unavailable_raised():
                return await self.walls.on_sharing_changed(event)
        if (deleted := deleted_message(event)) is not None:
            return await self.on_deleted(body, event, deleted)
        if (edited := edited_message(event)) is not None:
            return await self.on_edited(body, event, edited)
        if event.get("files") and await self.files.take(body, event, not slack_retry(request)):
            return  # files and text (adapters/slack_files.py)
        # files aimed at the bot and not taken (not read here): their text is the question
        unread_in = self.files.addressed_thread(event) if event.get("files") else None
        if not event.get("text", "").strip() and unread_in is None:
            return  # files not for the bot, and no text
        if unread_in is not None:  # its `app_mention`, if any, leaves a file share to this event
            await self._queue_turn(body, event, unread_in, request)
        elif event.get("channel_type") == "im":  # Slack sends no app_mention in DMs
            await self._queue_turn(body, event, event.get("thread_ts") or DM, request)
        elif f"<@{self.bot_user_id}>" in event.get("text", ""):
            return  # arrives as app_mention too
        elif event.get("thread_ts") and await self.joined(
            slack_team(body), event["channel"], event["thread_ts"]
        ):  # a thread the bot takes part in: only then is Slack asked about the person
            await self._queue_turn(body, event, event["thread_ts"], request)

    async def on_deleted(self, body: dict, event: dict, deleted: dict) -> None:
        """A message deleted in Slack: queue its erasure from memory (a person's only; the
        bot's own, such as a replaced placeholder, were never stored as theirs). Memory down
        answers 503, so Slack sends the event again."""
        team = slack_team(body)
        channel, ts = event.get("channel"), deleted["ts"]
        if not (team and channel and ts) or deleted.get("bot_id"):
            return
        if deleted.get("user") == self.bot_user_id:
            return
        with unavailable_raised():
            await self.handler.message_deleted(
                team, stored_in(team, event, deleted), slack_source(channel, ts)
            )

    async def on_channel_deleted(self, body: dict, event: dict) -> None:
        """A channel deleted in Slack (`channel_deleted`; a private one, `group_deleted`):
        queue the erasure of its threads from memory. Memory down answers 503, so Slack sends
        the event again."""
        team, channel = slack_team(body), event.get("channel")
        try:
            place = DeletedPlace(team, "slack", channel or "")
        except ValueError:
            log.warning("channel deletion without a team or channel: %s", event)
            return
        with unavailable_raised():
            await self.handler.place_deleted(place)

    async def note_team_back(self, body: dict, next) -> BoltResponse | None:
        """Any event or command from a team whose memory's erasure is scheduled (it removed
        the app): the app is back, the erasure is off. One ZMSCORE per request; not for the
        removal's own events, nor the bot's own (its posts, each update of a streamed answer),
        nor noise (`skip_noise` runs first). Best effort: memory down is logged, and the
        request goes on (the team's next event cancels it; one due meanwhile is erased)."""
        event = body.get("event") if body.get("type") == "event_callback" else None
        removal = isinstance(event, dict) and event.get("type") in REMOVAL_EVENTS
        if not removal and not self._from_bot(event) and (team := slack_team(body)):
            try:
                await self.handler.agent.harness.upkeep.bot_returned(team)
            except Exception:  # Redis away: not worth a 503 and Slack's retry of the event
                log.warning("could not cancel the scheduled erasure of team %s", team,
                            exc_info=True)  # fmt: skip
        await next()
        return None

    def _from_bot(self, event: Any) -> bool:
        """An event about the bot's own message: posted, updated, deleted."""
        if not isinstance(event, dict):
            return False
        said = [event, event.get("message") or {}, event.get("previous_message") or {}]
        return any(m.get("bot_id") or m.get("user") == self.bot_user_id for m in said
                   if isinstance(m, dict))  # fmt: skip

    async def on_removed(self, body: dict, event: dict) -> None:
        """The app uninstalled (`app_uninstalled`), its bot's token revoked (a
        `tokens_revoked` naming the bot; a person's token alone is not the app leaving), or an
        org app's access to workspaces revoked (`team_access_revoked`, naming them): schedule
        the erasure of the team's memory (ARXIVSCOUT_UNINSTALLED_KEEP_DAYS later,
        memory/governance_tenants.py). Memory down answers 503, so Slack sends it again."""
        bots = (event.get("tokens") or {}).get("bot") or []
        if event.get("type") == "tokens_revoked" and self.bot_user_id not in bots:
            return
        teams = event.get("team_ids") if event.get("type") == "team_access_revoked" else None
        upkeep = self.handler.agent.harness.upkeep
        with unavailable_raised():
            for team in teams if isinstance(teams, list) else [slack_team(body)]:
                if team and isinstance(team, str):
                    await upkeep.bot_removed(team)

    async def on_edited(self, body: dict, event: dict, edited: dict) -> None:
        """A message edited in Slack: queue the following of its new text in memory; edited
        to nothing (a bare mention), its erasure, as a deletion. Only a person's message the
        bot may hold (in a DM, a mention of it, a thread it answers in): not the bot's own
        `chat.update`s (placeholders, streams), not a channel's talk it never stored, not an
        unchanged text (an unfurl, a reply count). Memory down answers 503, so Slack sends
        the event again."""
        team, channel = slack_team(body), event.get("channel")
        if not (team and channel) or edited.get("bot_id") or edited.get("subtype") == "bot_message":
            return
        if edited.get("user") in (None, "", self.bot_user_id):
            return
        before = edited.get("previous_text") or ""
        text = slack_question(edited.get("text") or "", self.bot_user_id)
        if text == slack_question(before, self.bot_user_id):
            return
        places = stored_in(team, event, edited)
        source = slack_source(channel, edited["ts"])
        at = float((edited.get("edited") or {}).get("ts") or event.get("event_ts") or time.time())
        with unavailable_raised():
            if not await self._may_hold(team, event, before, places):
                return
            if not text:
                await self.handler.message_deleted(team, places, source)
            else:
                if self.files.unread({**event, **edited}):  # noted, as its question was
                    text = unread_noted(text)
                where = dict.fromkeys(places, channel)
                await self.handler.message_edited(team, where, source, text, at)

    async def _may_hold(self, team: str, event: dict, before: str, places: list[str]) -> bool:
        """Whether the bot may have stored a person's message (an edit's `before` text): in a
        DM, a mention of it, or in a thread it answers in (one EXISTS for them all)."""
        if slack_in_dm(event) or f"<@{self.bot_user_id}>" in before:
            return True
        return await self.handler.memory.governance.places.any_joined(team, places)

    async def on_summarize_command(self, ack, command: dict) -> None:
        """Queued before it is answered ("Summarizing…" is a promise kept after a crash), as
        durable work (adapters/slack_summarize.py): Slack is asked who and where after the
        answer, and for a link to another channel's thread, whether they may read it (a
        membership may take longer than its 3 s)."""
        link = parse_thread_link(command.get("text", ""))
        channel, thread_ts = link if link else (command["channel_id"], None)
        await ack(await self.summaries.take(command, channel, thread_ts) or NO_THREAD)

    @staticmethod
    async def ack_expand(ack) -> None:
        await ack()  # the answer goes to response_url, from the lazy listener

    async def expand(self, command: dict, respond) -> None:
        self._track_lazy()
        summary_id = command.get("text", "").strip()
        try:
            scope = await self._command_scope(command)
            answer = await self.handler.expand(scope, summary_id)
        except Exception as exc:  # a lazy listener's error reaches no one: said instead
            answer = command_failure("/expand", exc)
        parts = split_message(link_arxiv(answer), MARKDOWN_LIMIT)
        if len(parts) > RESPONSE_URL_POSTS:  # a response_url takes 5 posts
            how = f"Mention me in the summary's thread with “expand {summary_id}” to see it all."
            parts = [*parts[:RESPONSE_URL_PARTS], left_out(RESPONSE_URL_PARTS, len(parts), how)]
        for part in parts:
            await respond(**markdown(part), response_type="ephemeral")

    async def on_memory_command(self, ack, command: dict) -> None:
        await ack(**self.home.link_message(slack_team(command), command["user_id"]))

    @staticmethod
    async def ack_quietly(ack) -> None:
        await ack()  # the work is done by a lazy listener, after Slack has its answer

    async def publish_home(self, body: dict) -> None:
        """Rebuild the Home tab: opened (`app_home_opened`, its Home tab only) or its button
        pressed (a fresh link for the next press)."""
        self._track_lazy()
        event = body.get("event") or {}
        if event and event.get("tab") != "home":
            return
        user = event.get("user") or (body.get("user") or {}).get("id")
        team = slack_team(body)
        if user and team:
            await self.home.publish(team, user)

    def _track_lazy(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._hold(task)

    def _hold(self, task: asyncio.Task) -> None:
        """Waited for on close."""
        self._lazy.add(task)
        task.add_done_callback(self._lazy.discard)

    async def on_summarize_shortcut(self, ack, shortcut: dict) -> None:
        """The message shortcut, queued before its (quiet) answer as `/summarize`'s durable
        task (adapters/slack_summarize.py): a process lost after the answer leaves it in Redis
        for another. On a message of the channel the person is reading, so theirs to
        summarize; the summary goes to its thread (or, the bot not in the channel, to the
        shortcut's response_url). Memory unable to take it in time: tried again after the
        answer, which tells only the person (SHORTCUT_NOT_TAKEN) if memory still cannot."""
        message, channel = shortcut["message"], shortcut["channel"]["id"]
        in_dm = channel.startswith("D")
        thread_ts = stored_thread(in_dm, message["ts"], message.get("thread_ts"))
        taken, event_id = await self.summaries.take_shortcut(shortcut, thread_ts)
        await ack()
        if not taken:
            untaken = self._summarize_untaken(shortcut, thread_ts, event_id)
            self._hold(asyncio.create_task(untaken))

    async def _summarize_untaken(self, shortcut: dict, thread_ts: str, event_id: str) -> None:
        """A shortcut whose task memory did not take in time: its summary queued from this
        process under the task's own event id (memory only slow, the task may be in Redis all
        the same: summarized once), or the person told, only them (nothing is kept of a
        shortcut, which Slack never sends twice: they run it again)."""
        channel, user = shortcut["channel"]["id"], shortcut["user"]["id"]
        try:
            await self.queue_summary(
                slack_team(shortcut), channel, thread_ts, user, shortcut, notify=False,
                event_id=event_id,
            )  # fmt: skip
        except Exception as exc:
            down = not_queued_for_now(exc)
            if not down:
                log.exception("a Summarize thread shortcut in %s failed", channel)
            text = SHORTCUT_NOT_TAKEN if down else GIVEN_UP
            await self.summaries.answer(shortcut.get("response_url"), text)

    # -- translation -----------------------------------------------------------------------

    async def _queue_turn(
        self, body: dict, event: dict, thread_ts: str, request: AsyncBoltRequest
    ) -> None:
        """Queue a question (a bare mention gets a hint instead; one with files not read
        here, FILES_UNREAD); memory down raises MemoryUnavailable (so Slack gets a 503 and
        sends the event again), telling the person on the first delivery only. A question
        shared with the bot with files not read here (a share to the bot reaches here only
        then: adapters/slack_files.py) is noted so, and the person told once, from a held
        task (Slack waits for the listener's answer, and sends the event again if slow)."""
        team = slack_team(body)
        text = slack_question(event.get("text", ""), self.bot_user_id)
        if text and self.files.unread(event):
            text = unread_noted(text)
            said = FILES_UNREAD_ANSWERED
            told = self._tell_once(team, event, thread_ts, said, unread_claim(event))
            self._hold(asyncio.create_task(told))  # not awaited: Slack waits for its answer
        if not text:  # a bare mention: a hint, and no turn, so its `channel:ts` event id stays
            # free for the edit that adds the question (Slack's `app_mention` again)
            hint = FILES_UNREAD if event.get("files") else None
            self._hold(asyncio.create_task(self._hint(team, event, thread_ts, hint)))
            return
        await self._join_early(Scope(team, thread_id(team, event["channel"], thread_ts)))
        scope = await self.event_scope(team, event, thread_ts)
        job = Job(  # one per message: an edit's `app_mention` again comes under a new event id
            "turn", scope, text, event_id=f"{event['channel']}:{event['ts']}",
            reply=slack_reply(event, team, thread_ts),
            source=slack_source(event["channel"], event["ts"]),
        )  # fmt: skip
        await self.pipeline.submit(job, notify=not slack_retry(request))
        # a follow-up needs no mention; joined on Slack's retry too (idempotent): a listener
        # that failed after queueing (memory went away) is retried, and finds the job queued
        with unavailable_raised():
            await self.presence.join(scope, reference=thread_ts)

    async def _hint(self, team: str, event: dict, thread_ts: str, hint: str | None = None) -> None:
        """A bare mention: outside DMs its thread is joined (a reply there without a mention
        is the question), then the hint (`hint`, else EMPTY_DM or EMPTY_MENTION) is said once
        per message, whichever process or delivery claims it first (an edit is not hinted
        again, unless it is one with a hint of its own: a share to the bot with files not read
        here, edited to add a bare mention). Best effort: memory down leaves the thread
        unjoined, or the hint unsaid (logged)."""
        in_dm = slack_in_dm(event)
        if not in_dm:
            try:
                await self.presence.join(Scope(team, thread_id(team, event["channel"], thread_ts)))
            except Exception:
                log.warning("could not join %s's thread %s", event["channel"], thread_ts,
                            exc_info=True)  # fmt: skip
        if event.get("edited") and hint is None:
            return
        # files not read: told once a message, with or without a question (`unread_claim`)
        hinted = f"{event['channel']}:{event['ts']}:hint"  # not the turn's `channel:ts`
        claim = unread_claim(event) if hint == FILES_UNREAD else hinted
        said = hint or (EMPTY_DM if in_dm else EMPTY_MENTION)
        await self._tell_once(team, event, thread_ts, said, claim)

    async def _tell_once(
        self, team: str, event: dict, thread_ts: str, text: str, claim: str
    ) -> None:
        """Say `text` once per `claim` (a message's `channel:ts:<what>`), whichever process or
        delivery claims it first; best effort: memory down leaves it unsaid (logged)."""
        try:
            if not await self.handler.memory.events.first_time(team, claim):
                return
        except Exception:
            log.warning("not said in %s: %s", event["channel"], text[:60], exc_info=True)
            return
        await self._tell(team, event, thread_ts, text)

    async def tell_not_taken(self, team: str, event: dict, thread_ts: str) -> None:
        """Tell the person their message could not be queued (memory down), where it would
        have been answered, as `Pipeline.submit` does; best effort (logged)."""
        await self._tell(team, event, thread_ts, NOT_TAKEN)

    async def _tell(self, team: str, event: dict, thread_ts: str, text: str) -> None:
        """Say `text` where the person's message would have been answered; best effort
        (logged)."""
        channel = event["channel"]
        scope = Scope(team, thread_id(team, channel, thread_ts), user=event.get("user", ""))
        job = Job(  # its source, as its turn's: a thread its own message started, gone, is
            # left quiet; another's names the person in the channel (`_notice_elsewhere`)
            "turn", scope, reply=slack_reply(event, team, thread_ts),
            source=slack_source(channel, event["ts"]),
        )  # fmt: skip
        try:
            await self.pipeline.platform.notice(job, text)
        except Exception:
            log.exception("could not say in %s: %s", channel, text[:60])

    async def _join_early(self, thread: Scope) -> None:
        """The thread is the bot's before Slack is asked who and where: a follow-up without a
        mention a moment later is taken, after the mention (`joined`). Best effort (the join
        after queueing stands): memory slow or down is left to the queueing, which says so."""
        try:
            async with asyncio.timeout(EARLY_JOIN_SECONDS):
                await self.presence.join_early(thread)
        except Exception as exc:
            if not (memory_unavailable(exc) or isinstance(exc, TimeoutError)):
                raise

    async def queue_summary(
        self, team: str, channel: str, thread_ts: str, user: str, payload: dict,
        notify: bool = True, responded: int = 0, event_id: str = "",
    ) -> None:  # fmt: skip
        """Queue a summary; its answer goes to the thread, or (the bot is not in the channel)
        to the response_url of the command or shortcut (`responded`: posts it already took).
        `event_id`: queued once (a re-run of what queues it takes it for done)."""
        # a shortcut's user.team_id, a command's user_team: a person of another organisation
        user_team = (payload.get("user") or {}).get("team_id") or payload.get("user_team")
        asked = {"channel": channel, "user": user, "user_team": user_team}
        scope = await self.event_scope(team, asked, thread_ts)
        reply = {"channel": channel, "thread_ts": None if thread_ts == DM else thread_ts}
        if payload.get("response_url"):
            reply["response_url"] = payload["response_url"]
        progress = {"responded": responded} if responded else {}
        await self.pipeline.submit(
            Job("summarize", scope, event_id=event_id, reply=reply, progress=progress),
            notify=notify,
        )

    async def event_scope(self, team: str, event: dict, thread_ts: str) -> Scope:
        """The scope of an event's person in its thread, walled as `_walled_scope` says."""
        channel = event["channel"]
        return await self._walled_scope(
            team, channel, event.get("user", ""), event.get("channel_type"),
            event, thread_id(team, channel, thread_ts),
        )  # fmt: skip

    async def joined(self, team: str, channel: str, thread_ts: str) -> bool:
        """The bot takes part in the thread (it answers there without a mention): asked of
        memory before Slack is asked anything about the event. Joined early, by a mention
        Slack is still asked about, it waits a while for that mention to be queued first
        (then is taken anyway: late is better than lost)."""
        thread = Scope(team, thread_id(team, channel, thread_ts))
        for _ in range(EARLY_JOIN_POLLS):
            early = await self.presence.joining(thread)
            if not early:
                return early is not None
            await asyncio.sleep(EARLY_JOIN_WAIT_SECONDS / EARLY_JOIN_POLLS)
        return True  # joined early, its mention still not queued: taken anyway

    async def _command_scope(self, command: dict) -> Scope:
        """Where a slash command was used: its channel, for what that person may see there."""
        kind = {"directmessage": "im", "privategroup": "group"}.get(command.get("channel_name", ""))
        team, channel = slack_team(command), command["channel_id"]
        return await self._walled_scope(team, channel, command["user_id"], kind, command)

    async def _walled_scope(
        self, team: str, channel: str, user: str, kind: str | None, event: dict,
        thread: str = "",
    ) -> Scope:  # fmt: skip
        """A person's scope in a channel, walled off the team's public memory when they are a
        guest or of another organisation (users.info, or `event` names another workspace as
        theirs: `SlackWalls.asked`), or the channel is shared with one
        (adapters/slack_walls.py); a walled scope is never public itself. Slack is asked all
        of it at once: the event waits for one answer, not three in turn."""
        place, person, foreign = await self.walls.asked(team, channel, kind, user, event)
        walled = place.shared or person.outsider or foreign
        return Scope(
            tenant=team, thread=thread, channel=channel, visibility=place.visibility,
            user=user, user_name=person.name, walled=walled,
        )  # fmt: skip

    async def wait_idle(self) -> None:
        await self.summaries.drain()
        await self.pipeline.wait_idle()
        while self._lazy:
            await asyncio.gather(*list(self._lazy), return_exceptions=True)

    async def close(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Stop (SIGTERM, Ctrl-C): running turns get `grace` seconds, then go back to the
        queue for another process; `/summarize`'s running tasks are finished (`arxivscout
        slack` has it hand back first, with every other worker: slack_cmd.py `stop_reading`)."""
        await self.pipeline.shutdown(grace)
        await self.summaries.close()
        while self._lazy:
            await asyncio.gather(*list(self._lazy), return_exceptions=True)
        await self.session.close()
