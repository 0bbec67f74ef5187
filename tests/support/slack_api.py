"""A local stand-in for Slack: a Web API server that records calls, and signed event requests.

Like slack-bolt's own tests, the real `AsyncWebClient` is pointed at a local server
(`base_url`), so every API call our adapter makes is real HTTP, recorded here for assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web

from tests.support.threaded import ThreadedServer

BOT_USER = "UBOT"
INVALID_TOKEN = "xoxb-invalid"
USERS = {"U1": "Ada", "U2": "Grace", BOT_USER: "arxivscout"}  # id -> display name


TEXT_LIMIT = 40_000  # chat.postMessage / chat.update `text`
MARKDOWN_BLOCK_LIMIT = 12_000  # one markdown block; also chat.*Stream's markdown_text
RESPONSE_URL_POSTS = 5  # a response_url takes at most 5 posts (in 30 minutes)
SLACK_TS = re.compile(r"\d+\.\d+")
STREAMING_METHODS = (
    "chat.startStream",
    "chat.appendStream",
    "chat.stopStream",
    "assistant.threads.setStatus",
)
NEEDS_CHANNEL = ("chat.postMessage", "chat.update", "chat.delete", *STREAMING_METHODS)
CONVERSATION_TYPES = {"public_channel", "private_channel", "mpim", "im"}
MAX_BLOCKS = 100  # a Home tab's view
SECTION_TEXT_LIMIT = 3000
# Block Kit's limits of a message's blocks (Slack answers `invalid_blocks` past them)
MESSAGE_BLOCKS = 50
TEXT_OBJECT_LIMIT = 3000  # any text object's text: a context element's too
HEADER_TEXT_LIMIT = 150
CONTEXT_ELEMENTS = 10


@dataclass
class ApiCall:
    method: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)  # when it reached Slack (held or not)


@dataclass
class Message:
    """A message the bot posted, as people see it now."""

    channel: str
    thread_ts: str | None
    text: str
    streaming: bool = False


def _block_fits(block: dict[str, Any]) -> bool:
    """A message's block within Slack's documented lengths: a section's text (1 to 3,000), a
    header's (1 to 150), a context's elements (at most 10, each text 1 to 3,000)."""
    kind = block.get("type")
    if kind == "section" and "text" in block:
        return 0 < len(block["text"].get("text", "")) <= SECTION_TEXT_LIMIT
    if kind == "header":
        return 0 < len(block.get("text", {}).get("text", "")) <= HEADER_TEXT_LIMIT
    if kind == "context":
        elements = block.get("elements") or []
        return 0 < len(elements) <= CONTEXT_ELEMENTS and all(
            0 < len(element.get("text", "")) <= TEXT_OBJECT_LIMIT
            for element in elements
            if element.get("type") in ("mrkdwn", "plain_text")
        )
    return True


class SlackError(Exception):
    """An answer `{"ok": false, "error": ...}`, as Slack gives it."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class MockSlackApi(ThreadedServer):
    team_id: str = "T1"
    calls: list[ApiCall] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)  # posts to response_url
    responded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by response id
    refused_responses: list[dict[str, Any]] = field(default_factory=list)  # past the 5 posts
    base_url: str = ""
    users: dict[str, str] = field(default_factory=lambda: dict(USERS))
    private_channels: set[str] = field(default_factory=set)  # besides "G…" ids
    not_joined: set[str] = field(default_factory=set)  # channels the bot is not a member of
    missing_channels: set[str] = field(default_factory=set)  # deleted, or never seen
    streaming: bool = False  # True: a workspace with chat.*Stream and setStatus
    messages: dict[str, Message] = field(default_factory=dict)  # by ts, in posting order
    known_ts: set[str] = field(default_factory=set)  # people's messages, from sent events
    strict_threads: bool = False  # True: a thread_ts must be a ts it issued or was told of
    admins: set[str] = field(default_factory=set)  # workspace admins (users.info is_admin)
    owners: set[str] = field(default_factory=set)  # workspace owners (is_owner)
    deactivated: set[str] = field(default_factory=set)  # users.info deleted: true
    guests: set[str] = field(default_factory=set)  # users.info is_restricted (a guest)
    strangers: set[str] = field(default_factory=set)  # users.info is_stranger (another org)
    shared_channels: set[str] = field(default_factory=set)  # Slack Connect: is_ext_shared
    org_shared_channels: set[str] = field(default_factory=set)  # Grid-wide: is_org_shared
    enterprise_id: str = ""  # the workspace's Enterprise Grid org (auth.test; its members')
    homes: dict[str, str] = field(default_factory=dict)  # person -> their workspace, if another
    enterprises: dict[str, str] = field(default_factory=dict)  # person -> their org, if not ours
    members: dict[str, set[str]] = field(default_factory=dict)  # channel -> its people
    # channel -> the workspaces it is of, its host first (conversations.info names them:
    # `context_team_id`, `conversation_host_id`, `shared_team_ids`); unlisted: none named
    channel_teams: dict[str, list[str]] = field(default_factory=dict)
    mpims: set[str] = field(default_factory=set)  # group DMs among `members`' channels
    page_size: int = 100  # users.conversations answers at most this many per page
    home_views: dict[str, dict[str, Any]] = field(default_factory=dict)  # views.publish, by user
    files: dict[str, tuple[dict[str, Any], bytes]] = field(default_factory=dict)  # id: (file, data)
    downloads: list[str] = field(default_factory=list)  # file ids downloaded with a valid token
    redirects: dict[str, str] = field(default_factory=dict)  # file id -> where its download sends
    modals: list[dict[str, Any]] = field(default_factory=list)  # views.open, in order
    _limits: dict[str, list[int]] = field(default_factory=dict)  # method -> [times, after]
    _failures: dict[str, list[Any]] = field(default_factory=dict)  # method -> [times, error]
    _drops: dict[str, int] = field(default_factory=dict)  # method -> calls left unanswered
    _garbled: dict[str, int] = field(default_factory=dict)  # method -> calls answered not JSON
    _held: dict[str, asyncio.Event] = field(default_factory=dict)  # method -> its release
    _ts = itertools.count(1)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)  # Slack takes GET and POST
        app.router.add_post("/respond/{id}", self._respond)
        app.router.add_get("/files-pri/{file}/download/{name}", self._download)  # files.slack.com
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/api/"
        self.response_url = f"http://127.0.0.1:{port}/respond/"
        self.files_url = f"http://127.0.0.1:{port}/files-pri/"
        return self.base_url

    async def close(self) -> None:
        await self._runner.cleanup()

    async def _params(self, request: web.Request) -> dict[str, Any]:
        query = dict(request.query)
        raw = await request.text()
        if request.content_type == "application/json":
            return {**query, **json.loads(raw or "{}")}
        return {**query, **dict(parse_qsl(raw))}

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.calls.append(ApiCall(method, params))
        held = self._held.get(method)
        if held is not None:
            await held.wait()
        if token == INVALID_TOKEN:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if self._drops.get(method, 0) > 0:
            self._drops[method] -= 1
            assert request.transport is not None
            request.transport.close()  # the client sees the connection drop, no answer
            return web.Response()
        if self._garbled.get(method, 0) > 0:
            self._garbled[method] -= 1
            return web.Response(status=502, text="<html>Bad Gateway</html>",
                                content_type="application/json")  # fmt: skip
        limit = self._limits.get(method)
        if limit and limit[0] > 0:
            limit[0] -= 1
            return web.json_response({"ok": False, "error": "ratelimited"}, status=429,
                                     headers={"Retry-After": str(limit[1])})  # fmt: skip
        failure = self._failures.get(method)
        if failure and failure[0] > 0:
            failure[0] -= 1
            if failure[2]:  # done before the error, as Slack's internal_error may have
                with contextlib.suppress(SlackError):
                    self._answer(method, params)
            return web.json_response({"ok": False, "error": failure[1]})
        try:
            return web.json_response({"ok": True, **self._answer(method, params)})
        except SlackError as exc:
            return web.json_response({"ok": False, "error": exc.error})

    def _answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """What Slack answers `method` with, or the SlackError it refuses it with."""
        if method in STREAMING_METHODS and not self.streaming:
            raise SlackError("unknown_method")
        if method in NEEDS_CHANNEL:
            self._check_channel(params.get("channel") or params.get("channel_id") or "")
        if method == "auth.test":
            grid = {"enterprise_id": self.enterprise_id} if self.enterprise_id else {}
            return {"team_id": self.team_id, "user_id": BOT_USER, "bot_id": "BBOT",
                    "user": "arxivscout", "team": "Test", "is_enterprise_install": False,
                    **grid}  # fmt: skip
        if method == "chat.postMessage":
            self._check_thread(params.get("thread_ts"))
            text = shown(self._check_size(params))
            return self._post(params, Message(params["channel"], params.get("thread_ts"), text))
        if method == "chat.update":
            message = self._message(params)
            if message.streaming:
                raise SlackError("cant_update_message")
            message.text = shown(self._check_size(params))
            return {"channel": message.channel, "ts": params["ts"], "text": message.text}
        if method == "chat.startStream":
            return self._start_stream(params)
        if method in ("chat.appendStream", "chat.stopStream"):
            message = self._message(params)
            if not message.streaming:
                raise SlackError("message_not_in_streaming_state")
            message.text += self._check_markdown(params.get("markdown_text") or "")
            message.streaming = method == "chat.appendStream"
            return {"channel": message.channel, "ts": params["ts"]}
        if method == "assistant.threads.setStatus":
            self._check_thread(params.get("thread_ts") or "")
            return {}
        if method == "users.info":
            return self._user(params.get("user", ""))
        if method == "conversations.info":
            return self._conversation(params.get("channel", ""))
        if method == "users.conversations":
            return self._user_conversations(params)
        if method == "conversations.open":
            return self._open(params)
        if method == "files.info":
            found = self.files.get(params.get("file") or "")
            if found is None:
                raise SlackError("file_not_found")
            return {"file": found[0]}
        if method == "views.publish":
            return self._publish(params)
        if method == "views.open":
            return self._open_modal(params)
        if method in ("conversations.history", "conversations.replies"):
            return self._history(method, params)
        return {}

    def _history(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The bot's posted messages in a channel (or a thread's replies) since `oldest`,
        newest first; their metadata only with `include_all_metadata`."""
        self._check_channel(params.get("channel", ""))
        oldest = float(params.get("oldest") or 0)
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        found = []
        for posted in self.of("chat.postMessage"):
            if posted.get("channel") != params["channel"] or "_ts" not in posted:
                continue
            if method == "conversations.replies" and posted.get("thread_ts") != params.get("ts"):
                continue
            if float(posted["_ts"]) < oldest:
                continue
            message = {"type": "message", "ts": posted["_ts"], "text": posted.get("text", ""),
                       "bot_id": "BBOT", "user": BOT_USER}  # fmt: skip
            metadata = posted.get("metadata")
            if with_metadata and metadata:
                message["metadata"] = (
                    json.loads(metadata) if isinstance(metadata, str) else metadata
                )
            found.append(message)
        return {"messages": found[::-1], "has_more": False}

    def _check_channel(self, channel: str) -> None:
        if not channel or channel in self.missing_channels:
            raise SlackError("channel_not_found")
        if channel in self.not_joined:
            raise SlackError("not_in_channel")

    def _check_thread(self, thread_ts: str | None) -> None:
        """Slack takes a thread_ts only if it is the ts of a message it has: never one that
        is no ts at all; with `strict_threads`, only one it issued or was told of (`knows`)."""
        if thread_ts is None:
            return
        known = thread_ts in self.known_ts or thread_ts in self.messages
        if not SLACK_TS.fullmatch(thread_ts) or (self.strict_threads and not known):
            raise SlackError("invalid_thread_ts")

    @staticmethod
    def _check_size(params: dict[str, Any]) -> dict[str, Any]:
        if len(params.get("text") or "") > TEXT_LIMIT:
            raise SlackError("msg_too_long")
        blocks = params.get("blocks") or []
        blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
        if len(blocks) > MESSAGE_BLOCKS:
            raise SlackError("invalid_blocks")
        for block in blocks:
            if (
                block.get("type") == "markdown"
                and len(block.get("text", "")) > MARKDOWN_BLOCK_LIMIT
            ):
                raise SlackError("msg_too_long")
            if not _block_fits(block):
                raise SlackError("invalid_blocks")
        return params

    @staticmethod
    def _check_markdown(text: str) -> str:
        if len(text) > MARKDOWN_BLOCK_LIMIT:
            raise SlackError("msg_too_long")
        return text

    def _message(self, params: dict[str, Any]) -> Message:
        message = self.messages.get(params.get("ts") or "")
        if message is None or message.channel != params.get("channel"):
            raise SlackError("message_not_found")
        return message

    def _post(self, params: dict[str, Any], message: Message) -> dict[str, Any]:
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        params["_ts"] = ts  # recorded, so tests can follow the message's updates
        self.messages[ts] = message
        return {"channel": message.channel, "ts": ts, "message": {"text": message.text, "ts": ts}}

    def _start_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        """A streamed reply: in a thread; outside a DM, for one recipient (user and team)."""
        channel, thread_ts = params["channel"], params.get("thread_ts")
        if not thread_ts:
            raise SlackError("invalid_arguments")
        self._check_thread(thread_ts)
        if not channel.startswith("D") and not (
            params.get("recipient_user_id") and params.get("recipient_team_id")
        ):
            raise SlackError("invalid_arguments")
        text = self._check_markdown(params.get("markdown_text") or "")
        return self._post(params, Message(channel, thread_ts, text, streaming=True))

    # -- what a test makes Slack do ---------------------------------------------------------

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """Answer the next `times` calls of `method` with 429 and `Retry-After` (seconds)."""
        self._limits[method] = [times, retry_after]

    def hold(self, *methods: str) -> None:
        """Keep the answers to `methods` until `release()`: the calls are recorded as they come
        (a slow Slack). For a server on the test's own event loop (`await start()`)."""
        for method in methods:
            self._held[method] = asyncio.Event()

    def release(self) -> None:
        """Answer the held calls, and no longer hold any."""
        for held in self._held.values():
            held.set()
        self._held.clear()

    def fail(self, method: str, error: str, times: int = 1, done: bool = False) -> None:
        """Answer the next `times` calls of `method` with `{"ok": false, "error": error}`
        (e.g. "invalid_auth", "missing_scope"); `done`: the call is done first all the same
        (Slack's internal_error: "some aspect of the operation succeeded")."""
        self._failures[method] = [times, error, done]

    def garble(self, method: str, times: int = 1) -> None:
        """Answer the next `times` calls of `method` with a 502 whose body is not JSON (a
        proxy's error page)."""
        self._garbled[method] = times

    def drop(self, method: str, times: int = 1) -> None:
        """Close the connection of the next `times` calls of `method` without an answer (a
        network failure). slack_sdk retries a dropped connection once by itself."""
        self._drops[method] = times

    def add_file(self, name: str, data: bytes, mimetype: str = "application/pdf",
                 filetype: str = "pdf", pretty_type: str = "PDF", user: str = "U1",
                 size: int | None = None) -> dict[str, Any]:  # fmt: skip
        """A file someone uploaded, as a `file_share` event's `files` item shows it; its
        `url_private_download` serves `data` to a request with a valid bot token."""
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        found = {
            "id": file_id, "created": int(time.time()), "timestamp": int(time.time()),
            "name": name, "title": name, "mimetype": mimetype, "filetype": filetype,
            "pretty_type": pretty_type, "user": user, "user_team": self.team_id,
            "editable": False, "size": len(data) if size is None else size, "mode": "hosted",
            "is_external": False, "external_type": "", "is_public": False,
            "public_url_shared": False, "display_as_bot": False, "username": "",
            "url_private": f"{self.files_url}{self.team_id}-{file_id}/{name}",
            "url_private_download": f"{self.files_url}{self.team_id}-{file_id}/download/{name}",
            "permalink": f"https://test.slack.com/files/{user}/{file_id}/{name}",
            "has_rich_preview": False, "file_access": "visible",
        }  # fmt: skip
        self.files[file_id] = (found, data)
        return found

    def add_remote_file(self, name: str, external_url: str, mimetype: str = "",
                        filetype: str = "", external_type: str = "app") -> dict[str, Any]:  # fmt: skip
        """A file kept outside Slack (Google Drive: `external_type` "gdrive"; or a link an app
        added with files.remote.add): Slack's `url_private` is the other service's address."""
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        found = {
            "id": file_id, "created": int(time.time()), "timestamp": int(time.time()),
            "name": name, "title": name, "mimetype": mimetype, "filetype": filetype,
            "pretty_type": "", "user": "U1", "user_team": self.team_id, "editable": False,
            "mode": "external", "is_external": True, "external_type": external_type,
            "external_url": external_url, "url_private": external_url,
            "permalink": f"https://test.slack.com/files/U1/{file_id}/{name}",
            "has_rich_preview": False, "file_access": "visible",
        }  # fmt: skip
        self.files[file_id] = (found, b"")
        return found

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """files.slack.com: the bytes for `Authorization: Bearer <bot token>`; without a valid
        token Slack answers its sign-in page (200, text/html), not an error."""
        file_id = request.match_info["file"].rpartition("-")[2]
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not token.startswith("xoxb-") or token == INVALID_TOKEN:
            return web.Response(text="<html>Sign in to Slack</html>", content_type="text/html")
        if file_id in self.redirects:  # 302, as a CDN or a sign-in page would
            return web.Response(status=302, headers={"Location": self.redirects[file_id]})
        if file_id not in self.files:
            return web.Response(status=404, text="file not found")
        self.downloads.append(file_id)
        found, data = self.files[file_id]
        return web.Response(body=data, content_type=found["mimetype"])

    def knows(self, *timestamps: str) -> None:
        """Messages people posted (what events carry), so replies may thread under them."""
        self.known_ts.update(t for t in timestamps if t)

    def _user(self, user_id: str) -> dict[str, Any]:
        """users.info as Slack answers it: the name a person chose is profile.display_name."""
        name = self.users.get(user_id)
        if name is None:
            return {"ok": False, "error": "user_not_found"}
        profile = {"display_name": name, "real_name": f"{name} Example"}
        home = self.homes.get(user_id, self.team_id)
        enterprise = self.enterprises.get(user_id, self.enterprise_id)
        member = {"id": user_id, "enterprise_id": enterprise, "enterprise_name": enterprise,
                  "is_admin": False, "is_owner": False, "teams": [home]}  # fmt: skip
        grid = {"enterprise_user": member} if enterprise else {}  # of an Enterprise Grid org
        return {"ok": True, "user": {"id": user_id, "team_id": home, **grid,
                                     "name": name.lower(), "real_name": profile["real_name"],
                                     "is_bot": user_id == BOT_USER, "profile": profile,
                                     "deleted": user_id in self.deactivated,
                                     "is_admin": user_id in self.admins | self.owners,
                                     "is_owner": user_id in self.owners,
                                     "is_primary_owner": False,
                                     "is_restricted": user_id in self.guests,
                                     "is_ultra_restricted": False,
                                     "is_stranger": user_id in self.strangers}}  # fmt: skip

    def dm_channel(self, user_id: str) -> str:
        """The bot's DM channel with a person (what conversations.open gives)."""
        return f"D{user_id}"

    def _channel_object(self, channel: str, user_id: str) -> dict[str, Any]:
        im = channel.startswith("D")
        mpim = channel in self.mpims
        private = im or mpim or channel.startswith("G") or channel in self.private_channels
        found = {"id": channel, "is_channel": not (im or mpim) and not channel.startswith("G"),
                 "is_group": channel.startswith("G"), "is_im": im, "is_mpim": mpim,
                 "is_private": private}  # fmt: skip
        if im:
            found["user"] = user_id
        return found

    def _user_conversations(self, params: dict[str, Any]) -> dict[str, Any]:
        """users.conversations with a bot token: the person's conversations that the bot is in
        too (IMs: the bot's own with them), of the types asked, a page at a time."""
        user_id = params.get("user", "")
        if user_id not in self.users:
            raise SlackError("user_not_found")
        types = set((params.get("types") or "public_channel").split(","))
        if not types <= CONVERSATION_TYPES:
            raise SlackError("invalid_types")
        found = []
        for channel, people in sorted(self.members.items()):
            if user_id not in people or channel in self.not_joined:
                continue
            kind = self._channel_object(channel, user_id)
            if (
                (kind["is_mpim"] and "mpim" in types)
                or (not kind["is_mpim"] and kind["is_private"] and "private_channel" in types)
                or (not kind["is_private"] and "public_channel" in types)
            ):
                found.append(kind)
        if "im" in types:
            found.append(self._channel_object(self.dm_channel(user_id), user_id))
        cursor = params.get("cursor") or ""
        if cursor and not cursor.startswith("next:"):
            raise SlackError("invalid_cursor")
        start = int(cursor.removeprefix("next:") or 0)
        size = min(int(params.get("limit") or 100), self.page_size)
        end = start + size
        more = f"next:{end}" if end < len(found) else ""
        return {"channels": found[start:end], "response_metadata": {"next_cursor": more}}

    def _open(self, params: dict[str, Any]) -> dict[str, Any]:
        users = [u for u in (params.get("users") or "").split(",") if u]
        if not users:
            raise SlackError("users_list_not_supplied")
        if any(u not in self.users for u in users):
            raise SlackError("user_not_found")
        if len(users) > 1:
            raise SlackError("not_supported_here")  # group DMs are not what the tests open
        return {"channel": {"id": self.dm_channel(users[0])}}

    def _publish(self, params: dict[str, Any]) -> dict[str, Any]:
        """views.publish: a Home tab for one person, checked as Slack checks it."""
        view = params.get("view")
        if isinstance(view, str):
            view = json.loads(view)
        user_id = params.get("user_id", "")
        if user_id not in self.users:
            raise SlackError("user_not_found")
        if not isinstance(view, dict) or view.get("type") != "home":
            raise SlackError("invalid_arguments")
        blocks = view.get("blocks") or []
        if len(blocks) > MAX_BLOCKS:
            raise SlackError("invalid_arguments")
        for block in blocks:
            text = (block.get("text") or {}).get("text", "")
            if block.get("type") == "section" and not 0 < len(text) <= SECTION_TEXT_LIMIT:
                raise SlackError("invalid_arguments")
            if block.get("type") == "header" and not 0 < len(text) <= 150:
                raise SlackError("invalid_arguments")
            button = block.get("accessory") or {}
            if len(button.get("url", "")) > 3000:
                raise SlackError("invalid_arguments")
        self.home_views[user_id] = view
        return {"view": {"id": f"V{uuid.uuid4().hex[:8].upper()}", **view}}

    def _open_modal(self, params: dict[str, Any]) -> dict[str, Any]:
        """views.open: a modal, with a trigger_id (Slack's expire in 3 s) and a title of 24."""
        view = params.get("view")
        view = json.loads(view) if isinstance(view, str) else view
        if not params.get("trigger_id"):
            raise SlackError("invalid_trigger_id")
        if not isinstance(view, dict) or view.get("type") != "modal":
            raise SlackError("invalid_arguments")
        if not 0 < len((view.get("title") or {}).get("text", "")) <= 24:
            raise SlackError("invalid_arguments")
        self.modals.append(view)
        return {"view": {"id": f"V{uuid.uuid4().hex[:8].upper()}", **view}}

    def _conversation(self, channel: str) -> dict[str, Any]:
        """conversations.info: "G…" (legacy private groups) and listed channels are private."""
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        im, group = channel.startswith("D"), channel.startswith("G")
        private = group or channel in self.private_channels
        return {"ok": True, "channel": {"id": channel, "is_channel": not (im or group),
                                        "is_group": group, "is_im": im, "is_mpim": False,
                                        "is_private": private,
                                        "is_shared": channel in self.shared_channels
                                        | self.org_shared_channels,
                                        "is_org_shared": channel in self.org_shared_channels,
                                        "is_ext_shared": channel in self.shared_channels,
                                        "is_member": channel not in self.not_joined,
                                        **self._teams_of(channel)}}  # fmt: skip

    def _teams_of(self, channel: str) -> dict[str, Any]:
        """The workspaces conversations.info names for `channel` (`channel_teams`), as Slack
        answers with this workspace's token: in its context if it is one of them."""
        teams = self.channel_teams.get(channel)
        if not teams:
            return {}
        context = self.team_id if self.team_id in teams else teams[0]
        return {"context_team_id": context, "conversation_host_id": teams[0],
                "shared_team_ids": list(teams)}  # fmt: skip

    async def _respond(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        posts = self.responded.setdefault(request.match_info["id"], [])
        if len(posts) >= RESPONSE_URL_POSTS:  # recorded apart: tests assert it never happens
            self.refused_responses.append(body)
            return web.json_response({"ok": False, "error": "used_url"}, status=404)
        self.responses.append(body)
        posts.append(body)
        return web.Response(text="ok")

    # -- what the adapter did -------------------------------------------------------------

    async def response(self, response_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The latest post to `response_url + response_id`, waiting for it to arrive: an app
        answers there after acknowledging, whenever its work is done."""
        deadline = time.monotonic() + timeout
        while not self.responded.get(response_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing was posted to response_url {response_id!r}")
            await asyncio.sleep(0.02)
        return self.responded[response_id][-1]

    def of(self, method: str) -> list[dict[str, Any]]:
        return [c.params for c in self.calls if c.method == method]

    def thread_texts(self, channel: str, thread_ts: str | None) -> list[str]:
        """What the bot's messages in a thread (None: a DM outside threads) show now, in the
        order they were posted: the markdown block's text when a message has blocks."""
        return [
            m.text
            for m in self.messages.values()
            if (m.channel, m.thread_ts) == (channel, thread_ts)
        ]


def shown(params: dict[str, Any]) -> str:
    """What a user sees of a message: its markdown block(s), else its fallback text."""
    blocks = params.get("blocks")
    if isinstance(blocks, str):  # form-encoded calls carry blocks as JSON
        blocks = json.loads(blocks)
    texts = [b.get("text", "") for b in blocks or [] if b.get("type") == "markdown"]
    return "\n".join(texts) if texts else params.get("text", "")


def sign(secret: str, body: str, timestamp: int | None = None) -> dict[str, str]:
    ts = str(timestamp if timestamp is not None else int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}


@dataclass
class SlackSender:
    """Sends signed requests, as Slack does, to an app's /slack/events URL."""

    url: str
    secret: str
    session: aiohttp.ClientSession
    api: MockSlackApi | None = None  # told of the messages events carry (valid thread_ts)

    async def post(self, body: str, content_type: str, headers: dict[str, str] | None = None,
                   signature: dict[str, str] | None = None) -> aiohttp.ClientResponse:  # fmt: skip
        signed = signature if signature is not None else sign(self.secret, body)
        all_headers = {"Content-Type": content_type, **signed, **(headers or {})}
        async with self.session.post(self.url, data=body.encode(), headers=all_headers) as response:
            await response.read()
            return response

    async def event(self, event: dict[str, Any], team: str = "T1", event_id: str | None = None,
                    retry: int = 0, installed: str | None = None,
                    **kwargs) -> aiohttp.ClientResponse:  # fmt: skip
        """`team`: the envelope's `team_id`; `installed`: the workspace of the installation
        receiving it (`authorizations[0].team_id`), `team` unless said: in a shared channel
        another workspace created, Slack names that one as `team_id`."""
        authorization = {"team_id": installed or team, "user_id": BOT_USER, "is_bot": True}
        body = json.dumps({
            "token": "legacy", "team_id": team, "api_app_id": "A1", "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10]}", "event_time": int(time.time()),
            "event": event, "authorizations": [authorization],
        })  # fmt: skip
        if self.api is not None:
            self.api.knows(event.get("ts", ""), event.get("thread_ts", ""))
        headers = (
            {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
            if retry
            else {}
        )
        return await self.post(body, "application/json", headers, **kwargs)

    async def command(self, command: str, text: str, response_url: str, team: str = "T1",
                      channel: str = "C1", user: str = "U1") -> aiohttp.ClientResponse:  # fmt: skip
        body = urlencode({"token": "legacy", "team_id": team, "channel_id": channel, "user_id": user,
                          "command": command, "text": text, "response_url": response_url,
                          "trigger_id": "trig", "api_app_id": "A1"})  # fmt: skip
        return await self.post(body, "application/x-www-form-urlencoded")

    async def home_opened(self, user: str = "U1", team: str = "T1", tab: str = "home"
                          ) -> aiohttp.ClientResponse:  # fmt: skip
        """Someone opens the app's Home (or Messages) tab."""
        event = {"type": "app_home_opened", "user": user, "channel": f"D{user}", "tab": tab,
                 "event_ts": f"{time.time():.6f}"}  # fmt: skip
        if tab == "home":
            event["view"] = {"id": "VHOME", "type": "home"}
        return await self.event(event, team=team)

    async def block_action(self, action_id: str, user: str = "U1", team: str = "T1",
                           url: str = "") -> aiohttp.ClientResponse:  # fmt: skip
        """A button pressed on the Home tab (a url button sends its action too)."""
        action = {"type": "button", "action_id": action_id, "block_id": "b1",
                  "action_ts": f"{time.time():.6f}", "text": {"type": "plain_text", "text": "x"}}  # fmt: skip
        if url:
            action["url"] = url
        payload = {"type": "block_actions", "user": {"id": user, "team_id": team},
                   "team": {"id": team}, "api_app_id": "A1", "token": "legacy",
                   "container": {"type": "view", "view_id": "VHOME"}, "trigger_id": "trig",
                   "view": {"id": "VHOME", "type": "home"}, "actions": [action]}  # fmt: skip
        return await self.post(
            urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded"
        )

    async def shortcut(self, callback_id: str, message: dict[str, Any], response_url: str,
                       team: str = "T1", channel: str = "C1", user: str = "U1") -> aiohttp.ClientResponse:  # fmt: skip
        payload = {"type": "message_action", "callback_id": callback_id, "team": {"id": team},
                   "channel": {"id": channel}, "user": {"id": user}, "message": message,
                   "response_url": response_url, "trigger_id": "trig", "token": "legacy",
                   "api_app_id": "A1"}  # fmt: skip
        if self.api is not None:
            self.api.knows(message.get("ts", ""), message.get("thread_ts", ""))
        return await self.post(
            urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded"
        )


def mention(
    text: str, ts: str, channel: str = "C1", user: str = "U1", thread_ts: str | None = None
) -> dict:
    event = {"type": "app_mention", "user": user, "text": f"<@{BOT_USER}> {text}", "ts": ts,
             "channel": channel, "event_ts": ts}  # fmt: skip
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def file_share(files: list[dict[str, Any]], ts: str, text: str = "", channel: str = "C1",
               user: str = "U1", thread_ts: str | None = None,
               channel_type: str = "channel") -> dict:  # fmt: skip
    """A message sharing files, as Slack sends it (subtype `file_share`, the files inline)."""
    event = {"type": "message", "subtype": "file_share", "text": text, "files": files,
             "upload": False, "user": user, "display_as_bot": False, "ts": ts,
             "channel": channel, "channel_type": channel_type, "event_ts": ts}  # fmt: skip
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def message(text: str, ts: str, channel: str = "C1", user: str = "U1", thread_ts: str | None = None,
            **extra: Any) -> dict:  # fmt: skip
    event = {"type": "message", "user": user, "text": text, "ts": ts, "channel": channel,
             "channel_type": "channel", "event_ts": ts, **extra}  # fmt: skip
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event
