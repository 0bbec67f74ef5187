"""A local stand-in for Slack: a Web API server that records calls, and signed event requests.

Like slack-bolt's own tests, the real `AsyncWebClient` is pointed at a local server
(`base_url`), so every API call our adapter makes is real HTTP, recorded here for assertions.
"""

from __future__ import annotations

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


@dataclass
class ApiCall:
    method: str
    params: dict[str, Any]


@dataclass
class MockSlackApi(ThreadedServer):
    team_id: str = "T1"
    calls: list[ApiCall] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)  # posts to response_url
    base_url: str = ""
    _ts = itertools.count(1)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
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
        raw = await request.text()
        if request.content_type == "application/json":
            return json.loads(raw or "{}")
        return dict(parse_qsl(raw))

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
        return web.json_response({"ok": True})

    async def _respond(self, request: web.Request) -> web.Response:
        self.responses.append(json.loads(await request.text()))
        return web.Response(text="ok")

    # -- what the adapter did -------------------------------------------------------------

    def of(self, method: str) -> list[dict[str, Any]]:
        return [c.params for c in self.calls if c.method == method]

    def thread_texts(self, channel: str, thread_ts: str) -> list[str]:
        """What the bot's messages in a thread finally say (each post after its last update)."""
        final = {c.params["ts"]: c.params["text"] for c in self.calls if c.method == "chat.update"}
        return [
            final.get(c.params["_ts"], c.params.get("text", ""))
            for c in self.calls
            if c.method == "chat.postMessage"
            and c.params.get("channel") == channel
            and c.params.get("thread_ts") == thread_ts
        ]


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
