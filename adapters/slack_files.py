"""Slack files: a PDF shared where the bot takes part is read into the knowledge base.

- The listener (`SlackFiles.take`): a `message` event with `files` (subtype `file_share`) in a
  DM with the bot, mentioning the bot, or in a thread the bot has joined, is queued as one
  `SHARED_FILES` task (adapters/shared_files.py) on Slack's stream, with its files' details,
  never their bytes. Files that are not PDFs get a reply only when the bot is addressed (a DM
  or a mention); in a joined thread they are left alone (an image posted there is not for us).
  Its text, if any, is queued as a turn once the files are read, so the question sees them
  (with a note naming the PDFs saved: adapters/shared_files.py `shared_with`).
  Slack may send such a message as `app_mention` too (or, for file shares, only as `message`:
  slackapi/bolt-python#925), so the `message` event alone takes it. Where files are not read
  (no file service for Slack in this process), nothing is taken: the adapter answers the
  message's text (and an edit's) as a question that says its files were not read
  (`unread_noted`), or, with none, says FILES_UNREAD; the person is told so once a message,
  FILES_UNREAD_ANSWERED or FILES_UNREAD, whichever comes first (adapters/slack.py).
- The task's Slack side (`SlackFileEnd`): `files.info` when the event lacks a file's details
  (Slack unreachable, or busy, is a FetchError that may pass: the task runs again),
  the download from `url_private_download` with the bot token (scope `files:read`; without it
  Slack answers a sign-in page, said as such), and the progress message (chat.postMessage,
  then chat.update). Citations link the file's `permalink`.
- The bot token goes to Slack's file host only (`FileHost`): a file whose address is anywhere
  else is refused before any request, and a redirect away from it is not followed. A file kept
  outside Slack (`mode: external`: Google Drive, or a link an app added with files.remote.add,
  whose `url_private` is that service's address) is declined (`SlackFileEnd.describe`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

from adapters.file_download import download
from adapters.platform_ids import slack_in_dm, slack_source, slack_team
from adapters.shared_files import FetchError, FileEnd, file_name, is_pdf, with_note
from adapters.slack_delivery import DM, markdown, until_delivered
from adapters.spine import Job, MemoryUnavailable, unavailable_raised
from adapters.text import slack_question

DOWNLOAD_TIMEOUT_SECONDS = 120.0
FILE_FIELDS = ("id", "name", "title", "mimetype", "filetype", "pretty_type", "size",
               "url_private_download", "url_private", "permalink", "mode", "is_external",
               "external_type")  # fmt: skip
# Slack's answers that may pass: files.info is asked again on the task's next delivery
PASSING_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                  "request_timeout"}  # fmt: skip
# Slack's API host -> the host it serves files from (`url_private_download`) to the bot token
SLACK_FILE_HOSTS = {"slack.com": "files.slack.com", "slack-gov.com": "files.slack-gov.com"}
# a file shared with the bot, and no question, where files are not read (no file service)
FILES_UNREAD = (
    "I cannot read shared files in this deployment. Ask me your question in words — for "
    "example: `find papers on retrieval-augmented generation`."
)
# ... and with a question: said once, alongside its answer (one or the other, once a message)
FILES_UNREAD_ANSWERED = (
    "I cannot read shared files in this deployment, so I answer from your message's words alone."
)
# below that question, in the form of `shared_with`'s note on the PDFs read
# (adapters/shared_files.py): the model knows files came with it, unread, and can say so;
# a fact of that moment, still true once a file service reads later shares
UNREAD_NOTE = "(shared with this message: files that were not read)"


def slack_reply(event: dict[str, Any], team: str, thread_ts: str) -> dict[str, Any]:
    """Where a turn asked by a message `event` is answered (a job's `reply`, shared by the
    Slack adapter's turns and the turns of files): its channel, its thread (none in a DM's
    conversation), and the person's own workspace (another organisation's, in a shared
    channel: a streamed answer's recipient team)."""
    return {
        "channel": event["channel"],
        "thread_ts": None if thread_ts == DM else thread_ts,
        "user_team": event.get("user_team") or team,
    }


def unread_noted(question: str) -> str:
    """A question shared with files not read here, with UNREAD_NOTE below it (a watch command
    left as it is, as the served path leaves it)."""
    return with_note(question, UNREAD_NOTE)


class FileHost:
    """Where the bot token may be sent for a file's bytes. Slack's API base (SLACK_API_URL,
    Slack's by default) says which Slack it is: slack.com serves files from files.slack.com,
    GovSlack (slack-gov.com) from files.slack-gov.com, over https. Any other API base (a local
    Slack, as the tests run) serves them itself: its origin is the one allowed. An address
    in a file's details never widens this."""

    def __init__(self, api_url: str | None = None) -> None:
        api = URL(api_url or "https://slack.com/api/")
        if api.scheme == "https" and api.host in SLACK_FILE_HOSTS:
            self.origin = ("https", SLACK_FILE_HOSTS[api.host], 443)
        else:
            self.origin = (api.scheme, api.host, api.port)

    def holds(self, url: str | URL) -> bool:
        try:
            found = URL(url)
        except (TypeError, ValueError):
            return False
        if not found.absolute or found.user is not None or found.password is not None:
            return False
        return (found.scheme, found.host, found.port) == self.origin


def is_slack_site(url: URL) -> bool:
    """A page of Slack itself (a workspace's sign-in page), not its file host."""
    host = url.host or ""
    return url.scheme == "https" and any(
        host == site or host.endswith(f".{site}") for site in SLACK_FILE_HOSTS
    )


def slack_escape(text: str) -> str:
    """Text (a file name, a title) put into a Slack message: `&<>` are Slack's markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def file_details(found: dict[str, Any]) -> dict[str, Any]:
    """What the task needs of a Slack file object (an event's `files` item, or files.info's)."""
    return {
        "id": found.get("id", ""),
        "name": found.get("name") or found.get("title") or found.get("id", ""),
        "mimetype": found.get("mimetype") or "",
        "filetype": found.get("filetype") or "",
        "kind": f"a {found['pretty_type']} file" if found.get("pretty_type") else "",
        "size": found.get("size"),
        "url": found.get("url_private_download") or found.get("url_private") or "",
        "link": found.get("permalink") or "",
        # kept outside Slack: its url_private is the other service's address (declined)
        "mode": found.get("mode") or "",
        "is_external": found.get("is_external"),
        "external_type": found.get("external_type") or "",
    }


def is_external(file: dict[str, Any]) -> bool:
    """A file kept outside Slack (`mode: external`: Google Drive, or a link an app added): its
    address is another service's, never fetched with our token."""
    return bool(file.get("is_external")) or file.get("mode") == "external"


def kept_outside(file: dict[str, Any]) -> FetchError:
    """The refusal of a file kept outside Slack, said to the person (it will not pass)."""
    name = file.get("name") or "this file"
    where = " (in Google Drive)" if file.get("external_type") == "gdrive" else ""
    return FetchError(
        f"I cannot read {name}: it is kept outside Slack{where}, and I read only PDFs "
        "uploaded to Slack. Upload the PDF itself to Slack and I will read it."
    )


class SlackFiles:
    """The listener's part: which file shares to take, and queueing them."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.memory = adapter.handler.memory
        self.service = getattr(adapter.handler, "files", None)
        if self.service is not None and "slack" in self.service.ends:
            self.service.attach("slack")  # this process holds Slack's token: read its stream

    async def take(self, body: dict, event: dict, notify: bool = False) -> bool:
        """Queue the files (and the text) of a `message` event that has `files`; False when
        it is not a share for the bot (its text, if any, is then an ordinary message). Memory
        down raises MemoryUnavailable (Slack is answered 503 and sends the event again),
        after telling the person if `notify` (Slack's first delivery) and the share was
        addressed to the bot (a DM, a mention): Slack's retries may all fail as well."""
        try:
            with unavailable_raised():
                return await self._take(body, event)
        except MemoryUnavailable:
            if notify and (thread_ts := self.addressed_thread(event)) is not None:
                await self.adapter.tell_not_taken(slack_team(body), event, thread_ts)
            raise

    def addressed_thread(self, event: dict) -> str | None:
        """The thread_ts (DM for a DM's conversation) of a message aimed at the bot (a DM, a
        mention), else None: where a share to the bot is answered, read here or not."""
        if slack_in_dm(event):
            return event.get("thread_ts") or DM
        if f"<@{self.adapter.bot_user_id}>" in event.get("text", ""):
            return event.get("thread_ts") or event["ts"]
        return None

    def unread(self, message: dict) -> bool:
        """Whether `message` (a `message` event, or an edit's message) has files aimed at the
        bot that this process does not read (no file service for Slack): `take` leaves it."""
        if not message.get("files") or (self.service is not None and "slack" in self.service.ends):
            return False
        return self.addressed_thread(message) is not None

    async def _take(self, body: dict, event: dict) -> bool:
        adapter, bot = self.adapter, self.adapter.bot_user_id
        text = event.get("text", "")
        channel, ts = event["channel"], event["ts"]
        addressed_in = self.addressed_thread(event)
        addressed = addressed_in is not None
        if addressed_in is not None:
            thread_ts = addressed_in
        elif event.get("thread_ts"):
            thread_ts = event["thread_ts"]
        else:
            return False  # a file in a channel, not for the bot
        files = [file_details(f) for f in event.get("files") or []]
        if not addressed:  # only PDFs (or files whose kind the event does not say) are ours
            files = [f for f in files if is_pdf(f) or not (f["mimetype"] or f["filetype"])]
        if not files or self.service is None or "slack" not in self.service.ends:
            return False
        team = slack_team(body)
        if not addressed and not await adapter.joined(team, channel, thread_ts):
            return True  # a thread the bot is not part of: Slack is not asked about it
        scope = await adapter.event_scope(team, event, thread_ts)
        event_id = f"slack-files:{channel}:{ts}"
        # Slack's retry of this very event (its first delivery failed) is taken again
        taker = body.get("event_id") or "1"
        if not await self.memory.events.first_time(team, event_id, taker=taker):
            return True  # a redelivery
        reply = slack_reply(event, team, thread_ts)
        question = slack_question(text, bot)
        turn = Job(
            "turn", scope, question, event_id=f"{channel}:{ts}", reply=reply,
            source=slack_source(channel, ts),
        )  # fmt: skip
        await self.service.submit("slack", {
            "platform": "slack", "scope": scope.to_dict(), "reply": reply,
            "share": slack_source(channel, ts), "files": files, "sharer": event.get("user", ""),
            "turn": turn.to_json() if question else None, "turn_event": f"{event_id}:turn",
        })  # fmt: skip
        await adapter.presence.join(scope, reference=thread_ts)
        return True


class SlackFileEnd(FileEnd):
    """The task's Slack side, from the bot token alone (any process with it may run the task)."""

    def __init__(self, token: str, api_url: str | None = None) -> None:
        self.token = token
        self.options = {"base_url": api_url} if api_url else {}
        self.file_host = FileHost(api_url)

    def client(self) -> AsyncWebClient:
        return AsyncWebClient(token=self.token, **self.options)

    async def describe(self, file: dict[str, Any]) -> dict[str, Any]:
        known = file.get("mimetype") or file.get("filetype")
        if not (file.get("url") and file.get("size") is not None and known):
            file = await self._looked_up(file)
        if is_external(file):  # declined for what it is, before its address is looked at
            raise kept_outside(file)
        self._check_host(file)
        return file

    def _check_host(self, file: dict[str, Any]) -> None:
        """Refuse, before any request, a file whose address is not on Slack's file host."""
        if not self.file_host.holds(file.get("url") or ""):
            raise FetchError(
                f"I could not download {file_name(file)}: its address is not on "
                "Slack's file host, and I download only from there. Upload the PDF itself to "
                "Slack and I will read it."
            )

    async def _looked_up(self, file: dict[str, Any]) -> dict[str, Any]:
        """The file completed by files.info (the event lacked some of its details)."""
        name = file_name(file)
        try:
            found = (await self.client().files_info(file=file["id"])).get("file") or {}
        except SlackApiError as exc:
            why = exc.response.get("error")
            raise FetchError(
                f"I could not look up {name} on Slack ({why}"
                f"{'; the app needs the files:read scope' if why == 'missing_scope' else ''}).",
                retryable=why in PASSING_ERRORS or exc.response.status_code >= 500,
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:  # Slack unreachable: it may pass
            raise FetchError(
                f"I could not look up {name}: Slack did not answer ({type(exc).__name__}).",
                retryable=True,
            ) from None
        details = file_details(found)
        return {**file, **{k: v for k, v in details.items() if v not in ("", None)}}

    async def fetch(self, file: dict[str, Any], max_bytes: int) -> bytes:
        name = file_name(file)
        self._check_host(file)  # the token goes nowhere else, whatever the file says

        def redirected(target: URL) -> None:
            """A redirect is followed on Slack's file host only: never into another address,
            with the token or without it."""
            if self.file_host.holds(target):
                return
            if is_slack_site(target):  # Slack's sign-in page: the token lacks files:read
                raise FetchError(
                    f"Slack sent me to a sign-in page instead of {name}: the app needs the "
                    "files:read scope (reinstall it from its manifest)."
                )
            raise FetchError(
                f"I could not download {name}: Slack sent me away from its file host, and I "
                "do not follow that."
            )

        def signed_in(response) -> None:
            if response.content_type == "text/html":  # a sign-in page: no files:read
                raise FetchError(
                    f"Slack sent a sign-in page instead of {name}: the app needs the "
                    "files:read scope (reinstall it from its manifest)."
                )

        refused = {
            401: f"Slack refused to let me download {name} (files:read).",
            403: f"Slack refused to let me download {name} (files:read).",
            404: f"I could not download {name}: it is gone from Slack.",
        }
        return await download(
            file["url"], name, "Slack", max_bytes, DOWNLOAD_TIMEOUT_SECONDS,
            headers={"Authorization": f"Bearer {self.token}"}, refused=refused, check=signed_in,
            follow=redirected,
        )  # fmt: skip

    async def post(self, reply: dict[str, Any], text: str) -> str:
        where = {"channel": reply["channel"]}
        if reply.get("thread_ts"):
            where["thread_ts"] = reply["thread_ts"]
        body = markdown(slack_escape(text))  # names and titles: no markup, no <!here>
        posted = await until_delivered(self.client().chat_postMessage, **where, **body)
        return str(posted["ts"])

    async def edit(self, reply: dict[str, Any], message: str, text: str) -> None:
        await until_delivered(
            self.client().chat_update,
            channel=reply["channel"],
            ts=message,
            **markdown(slack_escape(text)),
        )
