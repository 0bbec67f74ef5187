"""The HTTP server of Slack's HTTP mode: `/slack/events` for Slack, `/healthz` for the platform."""

from __future__ import annotations

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp

from memory.manager import MemoryManager


def health_routes(memory: MemoryManager) -> list[web.RouteDef]:
    async def healthz(request: web.Request) -> web.Response:
        if not await memory.ping():
            return web.json_response({"ok": False, "redis": "down"}, status=503)
        return web.json_response({"ok": True, "redis": "up"})

    return [web.get("/healthz", healthz)]


def slack_routes(app: AsyncApp) -> list[web.RouteDef]:
    async def events(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))

    return [web.post("/slack/events", events)]


def build_web_app(memory: MemoryManager, slack: AsyncApp | None = None) -> web.Application:
    app = web.Application()
    app.add_routes(health_routes(memory) + (slack_routes(slack) if slack else []))
    return app
