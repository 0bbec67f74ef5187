"""`/slack/events` with bodies Slack never sends: the signature is checked first, an unreadable
body is a 400 and an event with no channel or ts is acknowledged and dropped, never a 500.

The route serves a bolt app of the test's own, whose listeners record what reaches them, so
"nothing was dispatched" is seen directly; its Web API calls go to the mock Slack API.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from adapters.web import build_web_app
from tests.support.slack_api import MockSlackApi, SlackSender, mention, message, sign

SECRET = "test-signing-secret"


def sign_bytes(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Slack's signature over the body's bytes (`sign` takes text, which these bodies are not)."""
    ts = str(timestamp if timestamp is not None else int(time.time()))
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}


class Route:
    """The web app's `/slack/events` in front of a recording bolt app."""

    def __init__(self, sender: SlackSender, dispatched: list[dict]) -> None:
        self.sender = sender
        self.dispatched = dispatched

    async def post_bytes(
        self, body: bytes, content_type: str, signature: dict[str, str]
    ) -> tuple[int, str]:
        headers = {"Content-Type": content_type, **signature}
        async with self.sender.session.post(self.sender.url, data=body, headers=headers) as got:
            return got.status, await got.text()


async def start_route(memory, api: MockSlackApi, session, stack: list, **web_options) -> Route:
    dispatched: list[dict] = []
    bolt = AsyncApp(
        client=AsyncWebClient(token="xoxb-test", base_url=api.base_url),
        signing_secret=SECRET,
        process_before_response=True,  # listeners run before the answer: nothing is in flight
    )

    async def record(event: dict) -> None:
        dispatched.append(event)

    async def summarize(ack) -> None:
        await ack("ok")

    bolt.event("app_mention")(record)
    bolt.event("message")(record)
    bolt.command("/summarize")(summarize)
    runner = web.AppRunner(build_web_app(memory, bolt, **web_options))
    await runner.setup()
    stack.append(runner)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/slack/events"
    return Route(SlackSender(url, SECRET, session), dispatched)


@pytest.fixture
async def web_env(memory):
    api = MockSlackApi()
    await api.start()
    session = aiohttp.ClientSession()
    runners: list[web.AppRunner] = []

    async def route(**web_options) -> Route:
        return await start_route(memory, api, session, runners, **web_options)

    yield route
    for runner in runners:
        await runner.cleanup()
    await session.close()
    await api.close()


@pytest.fixture
async def route(web_env) -> Route:
    return await web_env(signing_secret=SECRET)


def event_body(event: dict) -> str:
    return json.dumps({"token": "legacy", "team_id": "T1", "api_app_id": "A1",
                       "type": "event_callback", "event_id": f"Ev{event.get('ts')}",
                       "event_time": int(time.time()), "event": event})  # fmt: skip


MALFORMED_JSON = b'{"type": "event_callback", "event": {'
NOT_UTF8 = b'{"type": "event_callback", "event": {"text": "\xff\xfe"}}'


async def test_a_forged_or_stale_signature_is_401_whatever_the_body(route):
    forged = await route.post_bytes(
        MALFORMED_JSON, "application/json", sign_bytes("wrong-secret", MALFORMED_JSON)
    )
    stale = await route.post_bytes(
        NOT_UTF8, "application/json", sign_bytes(SECRET, NOT_UTF8, int(time.time()) - 600)
    )
    missing = await route.post_bytes(MALFORMED_JSON, "application/json", {})
    garbled = await route.post_bytes(
        MALFORMED_JSON, "application/json",
        {"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
    )  # fmt: skip
    assert [forged[0], stale[0], missing[0], garbled[0]] == [401, 401, 401, 401]
    assert route.dispatched == []


async def test_a_signed_body_that_cannot_be_read_is_400(route, caplog):
    form_with_bad_payload = urlencode({"payload": "{not json"}).encode()
    bodies = [
        (MALFORMED_JSON, "application/json"),
        (NOT_UTF8, "application/json"),
        (form_with_bad_payload, "application/x-www-form-urlencoded"),
        (b"[1, 2]", "application/json"),  # JSON, but not an object
        (b'{"type": "event_callback", "event": "x"}', "application/json"),
    ]
    with caplog.at_level(logging.WARNING, logger="adapters.web"):
        answers = [
            await route.post_bytes(body, kind, sign_bytes(SECRET, body)) for body, kind in bodies
        ]
    assert [status for status, _ in answers] == [400] * len(bodies)
    assert caplog.text.count("unreadable body") == len(bodies)
    assert route.dispatched == []


async def test_an_event_without_channel_or_ts_is_acknowledged_and_dropped(route, caplog):
    no_channel = mention("where?", "1700000000.000001")
    del no_channel["channel"]
    no_ts = message("when?", "1700000000.000002")
    del no_ts["ts"]
    with caplog.at_level(logging.WARNING, logger="adapters.web"):
        for event in (no_channel, no_ts):
            assert (await route.sender.event(event)).status == 200
    assert caplog.text.count("ignored: missing field") == 2
    assert route.dispatched == []

    whole = mention("here", "1700000000.000003")
    assert (await route.sender.event(whole)).status == 200
    assert [e["ts"] for e in route.dispatched] == [whole["ts"]]


async def test_well_formed_requests_still_reach_bolt(route):
    challenge = json.dumps({"token": "legacy", "challenge": "c-123", "type": "url_verification"})
    status, text = await route.post_bytes(
        challenge.encode(), "application/json", sign(SECRET, challenge)
    )
    assert status == 200 and "c-123" in text
    response = await route.sender.command("/summarize", "", "http://127.0.0.1:9/unused")
    assert response.status == 200
    body = event_body(message("plain", "1700000000.000004", thread_ts="1700000000.000001"))
    assert (await route.sender.post(body, "application/json")).status == 200
    assert [e["text"] for e in route.dispatched] == ["plain"]


async def test_without_the_secret_bolt_still_checks_the_signature(web_env):
    route = await web_env()  # no signing_secret: only bolt's own check
    body = event_body(mention("forged", "1700000000.000005"))
    forged = await route.sender.post(body, "application/json", signature=sign("wrong", body))
    assert forged.status == 401 and route.dispatched == []
