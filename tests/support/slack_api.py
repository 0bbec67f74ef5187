"""A local stand-in for Slack: a Web API server that records calls, and signed event requests.

Like slack-bolt's own tests, the real `AsyncWebClient` is pointed at a local server
(`base_url`), so every API call our adapter makes is real HTTP, recorded here for assertions.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
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


@dataclass
class ApiCall:
    method: str
    params: dict[str, Any]


@dataclass
class MockSlackApi(ThreadedServer):
    team_id: str = "T1"
    calls: list[ApiCall] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)  # posts to response_url
    responded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by response id
    base_url: str = ""
    users: dict[str, str] = field(default_factory=lambda: dict(USERS))
    private_channels: set[str] = field(default_factory=set)  # besides "G…" ids
    _ts = itertools.count(1)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)  # Slack takes GET and POST
        app.router.add_post("/respond/{id}", self._respond)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/api/"
        self.response_url = f"http://127.0.0.1:{port}/respond/"
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
        if token == INVALID_TOKEN:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if method == "auth.test":
            return web.json_response({"ok": True, "team_id": self.team_id, "user_id": BOT_USER,
                                      "bot_id": "BBOT", "user": "arxivscout", "team": "Test"})  # fmt: skip
        if method == "chat.postMessage":
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            params["_ts"] = ts  # recorded, so tests can follow the message's updates
            return web.json_response({"ok": True, "channel": params.get("channel"), "ts": ts,
                                      "message": {"text": params.get("text"), "ts": ts}})  # fmt: skip
        if method == "chat.update":
            return web.json_response(
                {"ok": True, "channel": params.get("channel"), "ts": params.get("ts")}
            )
        if method == "users.info":
            return web.json_response(self._user(params.get("user", "")))
        if method == "conversations.info":
            return web.json_response(self._conversation(params.get("channel", "")))
        return web.json_response({"ok": True})

    def _user(self, user_id: str) -> dict[str, Any]:
        """users.info as Slack answers it: the name a person chose is profile.display_name."""
        name = self.users.get(user_id)
        if name is None:
            return {"ok": False, "error": "user_not_found"}
        profile = {"display_name": name, "real_name": f"{name} Example"}
        return {"ok": True, "user": {"id": user_id, "team_id": self.team_id,
                                     "name": name.lower(), "real_name": profile["real_name"],
                                     "is_bot": user_id == BOT_USER, "profile": profile}}  # fmt: skip

    def _conversation(self, channel: str) -> dict[str, Any]:
        """conversations.info: "G…" (legacy private groups) and listed channels are private."""
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        im, group = channel.startswith("D"), channel.startswith("G")
        private = group or channel in self.private_channels
        return {"ok": True, "channel": {"id": channel, "is_channel": not (im or group),
                                        "is_group": group, "is_im": im, "is_mpim": False,
                                        "is_private": private}}  # fmt: skip

    async def _respond(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        self.responses.append(body)
        self.responded.setdefault(request.match_info["id"], []).append(body)
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

    def thread_texts(self, channel: str, thread_ts: str) -> list[str]:
        """What the bot's messages in a thread finally show (each post after its last update):
        the markdown block's text when the message has blocks, else its text."""
        final = {c.params["ts"]: shown(c.params) for c in self.calls if c.method == "chat.update"}
        return [
            final.get(c.params["_ts"], shown(c.params))
            for c in self.calls
            if c.method == "chat.postMessage"
            and c.params.get("channel") == channel
            and c.params.get("thread_ts") == thread_ts
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

    async def post(self, body: str, content_type: str, headers: dict[str, str] | None = None,
                   signature: dict[str, str] | None = None) -> aiohttp.ClientResponse:  # fmt: skip
        signed = signature if signature is not None else sign(self.secret, body)
        all_headers = {"Content-Type": content_type, **signed, **(headers or {})}
        async with self.session.post(self.url, data=body.encode(), headers=all_headers) as response:
            await response.read()
            return response

    async def event(self, event: dict[str, Any], team: str = "T1", event_id: str | None = None,
                    retry: int = 0, **kwargs) -> aiohttp.ClientResponse:  # fmt: skip
        body = json.dumps({
            "token": "legacy", "team_id": team, "api_app_id": "A1", "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10]}", "event_time": int(time.time()),
            "event": event, "authorizations": [{"team_id": team, "user_id": BOT_USER, "is_bot": True}],
        })  # fmt: skip
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

    async def shortcut(self, callback_id: str, message: dict[str, Any], response_url: str,
                       team: str = "T1", channel: str = "C1", user: str = "U1") -> aiohttp.ClientResponse:  # fmt: skip
        payload = {"type": "message_action", "callback_id": callback_id, "team": {"id": team},
                   "channel": {"id": channel}, "user": {"id": user}, "message": message,
                   "response_url": response_url, "trigger_id": "trig", "token": "legacy",
                   "api_app_id": "A1"}  # fmt: skip
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


def message(text: str, ts: str, channel: str = "C1", user: str = "U1", thread_ts: str | None = None,
            **extra: Any) -> dict:  # fmt: skip
    event = {"type": "message", "user": user, "text": text, "ts": ts, "channel": channel,
             "channel_type": "channel", "event_ts": ts, **extra}  # fmt: skip
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event
