"""The HTTP server of Slack's HTTP mode: `/slack/events` for Slack, `/healthz` for the platform."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

from adapters.memory_page.server import MemoryPage
from memory.manager import MemoryManager


def health_routes(memory: MemoryManager) -> list[web.RouteDef]:
    async def healthz(request: web.Request) -> web.Response:
        if not await memory.ping():
            return web.json_response({"ok": False, "redis": "down"}, status=503)
        return web.json_response({"ok": True, "redis": "up"})

    return [web.get("/healthz", healthz)]


MESSAGE_EVENTS = ("message", "app_mention")
log = logging.getLogger(__name__)


class BytesSignatureVerifier(SignatureVerifier):
    """Slack signs the body's bytes; the SDK decodes them first, which fails on a body that is
    not UTF-8. Signing the bytes themselves lets such a body be told forged (401) from
    malformed (400)."""

    def generate_signature(self, *, timestamp: str, body: str | bytes) -> str | None:
        if not isinstance(body, bytes):
            return super().generate_signature(timestamp=timestamp, body=body)
        message = b"v0:" + timestamp.encode() + b":" + body
        return "v0=" + hmac.new(self.signing_secret.encode(), message, hashlib.sha256).hexdigest()

    def signed(self, body: bytes, headers: Any) -> bool:
        try:
            return self.is_valid_request(body, headers)
        except ValueError:  # a timestamp that is not a number
            return False


def parse_slack_body(raw: bytes, content_type: str) -> dict[str, Any]:
    """The request's body as bolt will read it: JSON (events), or a form whose `payload` field
    is JSON (interactivity) or whose fields are the data (slash commands). ValueError (which
    UnicodeDecodeError and JSONDecodeError are) when it is none of them."""
    text = raw.decode("utf-8")
    if content_type == "application/json" or text.startswith("{"):
        body = json.loads(text)
    else:
        form = dict(parse_qsl(text, keep_blank_values=True))
        body = json.loads(form["payload"]) if "payload" in form else form
    if not isinstance(body, dict):
        raise ValueError(f"expected an object, got {type(body).__name__}")
    if body.get("type") == "event_callback" and not isinstance(body.get("event"), dict):
        raise ValueError("event_callback without an event object")
    return body


def lacks_message_fields(body: dict[str, Any]) -> bool:
    """A message or mention event with no channel or ts: nothing could be answered."""
    event = body.get("event") if body.get("type") == "event_callback" else None
    return (
        isinstance(event, dict)
        and event.get("type") in MESSAGE_EVENTS
        and not (event.get("channel") and event.get("ts"))
    )


def slack_routes(app: AsyncApp, signing_secret: str | None = None) -> list[web.RouteDef]:
    """`/slack/events`: the signature is checked before anything reads the body, and a body
    bolt could not parse is a 400, never a 500 (bolt checks the signature again)."""
    verifier = BytesSignatureVerifier(signing_secret) if signing_secret else None

    async def events(request: web.Request) -> web.Response:
        raw = await request.read()
        if verifier is not None and not verifier.signed(raw, request.headers):
            log.warning("Slack request rejected: missing, forged or stale signature")
            return web.Response(status=401, text="invalid signature")
        try:
            body = parse_slack_body(raw, request.content_type)
        except ValueError as exc:
            log.warning("Slack request rejected: unreadable body (%s)", exc)
            return web.Response(status=400, text="unreadable body")
        if lacks_message_fields(body):
            log.warning("Slack event ignored: missing field (channel or ts)")
            return web.Response(status=200, text="ignored: missing field")
        bolt_request = AsyncBoltRequest(
            body=raw.decode("utf-8"), query=request.query_string, headers=request.headers
        )
        return await to_aiohttp_response(await app.async_dispatch(bolt_request))

    return [web.post("/slack/events", events)]


def build_web_app(
    memory: MemoryManager, slack: AsyncApp | None = None, signing_secret: str | None = None,
    page: MemoryPage | None = None,
) -> web.Application:  # fmt: skip
    """`signing_secret`: the Slack app's, checked before a body is read (see `slack_routes`);
    `page`: the memory page (`/memory`, `adapters/memory_page/server.py`), if served here."""
    app = web.Application(middlewares=page.middlewares if page else [])
    app.add_routes(health_routes(memory) + (slack_routes(slack, signing_secret) if slack else []))
    if page is not None:
        app.add_routes(page.routes)
        app.on_response_prepare.append(page.on_prepare)
        for close in page.cleanup:
            app.on_cleanup.append(lambda _app, close=close: close())
    return app
