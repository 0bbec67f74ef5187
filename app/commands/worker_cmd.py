"""`arxivscout worker`: the Procfile's worker: Discord and/or Slack Socket Mode in one process.

Runs whichever is configured (DISCORD_TOKEN; SLACK_APP_TOKEN with SLACK_BOT_TOKEN), sharing
one agent and one Redis; serves /healthz on $PORT when PORT is set. With neither token (a
deployment that serves Slack over HTTP from its web process) it idles until stopped, exit 0:
a worker that exits would be restarted in a loop by the platform (Procfile, fly.toml).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from adapters.web import build_web_app
from app.commands.common import stop_on_signals
from app.commands.discord_cmd import TOKEN_WHY
from app.commands.slack_cmd import (
    APP_TOKEN_WHY,
    BOT_TOKEN_WHY,
    check_app_token,
    check_bot_token,
    stop_reading,
)
from app.commands.web_cmd import listen, page_wiring
from app.runtime import open_agent
from app.settings import Settings
from bot.errors import ConfigError

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

IDLE_REASON = (
    "worker idle: neither DISCORD_TOKEN nor SLACK_APP_TOKEN is set; "
    "the web process serves Slack over HTTP"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("worker", help="run Discord and/or Slack Socket Mode (Procfile worker)")
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if not (settings.slack_app_token or settings.discord_token):
        return await idle(settings.port)
    return await serve(
        settings,
        use_slack=bool(settings.slack_app_token),
        use_discord=bool(settings.discord_token),
        port=settings.port,
    )


async def idle(port: int | None) -> int:
    """Nothing to serve: say why once, answer /healthz on `port` (if given) and wait for
    SIGTERM or SIGINT. Opens neither Redis nor the agent: there is no work to do."""
    stop = stop_on_signals()
    runner = None
    if port is not None:
        runner = web.AppRunner(_idle_web_app())
        await runner.setup()
        await listen(runner, "0.0.0.0", port)
    print(IDLE_REASON, flush=True)
    try:
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
    return 0


def _idle_web_app() -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "worker": "idle"})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz)])
    return app


async def serve(settings: Settings, use_slack: bool, use_discord: bool, port: int | None) -> int:
    """Slack Socket Mode and/or Discord on one agent; /healthz on `port` if given.
    (`arxivscout slack --socket` is this with Slack alone.)"""
    if not (use_slack or use_discord):
        raise ConfigError(
            "The worker serves Discord (set DISCORD_TOKEN) and/or Slack Socket Mode (set "
            "SLACK_APP_TOKEN and SLACK_BOT_TOKEN); neither is set."
        )
    if use_slack:  # every token is checked before anything slow starts
        bot_token = settings.require("slack_bot_token", BOT_TOKEN_WHY, prefix="xoxb-")
        app_token = settings.require("slack_app_token", APP_TOKEN_WHY, prefix="xapp-")
        await check_bot_token(bot_token, settings.slack_api_url)
        await check_app_token(app_token, settings.slack_api_url)
    token = settings.require("discord_token", TOKEN_WHY) if use_discord else ""
    settings.links_url()  # a web dyno without its public URL: refused before anything slow
    runtime = await open_agent(settings)
    handler = runtime.turns()
    cleanup = [runtime.close]
    try:
        wiring = await page_wiring(settings, runtime.memory)  # the links of `/memory`
        if port is not None:
            runner = web.AppRunner(build_web_app(runtime.memory, page=wiring.page(runtime.memory)))
            await runner.setup()
            await listen(runner, "0.0.0.0", port)
            cleanup.insert(0, runner.cleanup)
        waiters = [asyncio.create_task(stop_on_signals().wait())]
        stoppers: list[Callable[[], Awaitable[None]]] = []  # each platform's stop taking jobs
        slack = None
        if use_slack:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            from adapters.slack import SlackAdapter

            slack = SlackAdapter(
                handler, bot_token, api_url=settings.slack_api_url, links=wiring.links,
                directory=wiring.directories,
            )  # fmt: skip
            await slack.check_token()  # its pipeline starts: it takes over dead processes' threads
            stoppers.append(slack.pipeline.shutdown)  # connected or not: stopped before hand-back
            socket = AsyncSocketModeHandler(slack.app, app_token)
            cleanup[:0] = [socket.close_async, slack.close]
        if use_discord:  # started first: Slack's connect may take long (Slack unreachable)
            from adapters.discord import DiscordAdapter

            discord_adapter = DiscordAdapter(
                handler, links=wiring.links, admins=wiring.directories.admins
            )
            # its pipeline starts once connected; its stop also queues what waits for Redis
            stoppers.append(discord_adapter.stop)
            waiters.append(asyncio.create_task(discord_adapter.start(token)))
        if slack is not None and await connected(socket, waiters):
            print("Slack Socket Mode connected")
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        # stop taking jobs; what cannot finish in time goes back to the queue for another process
        await asyncio.gather(*(stop() for stop in stoppers))
        # then every worker's hand-back, before any running batch is awaited (the cleanup)
        await (stop_reading(slack, runtime) if slack is not None else runtime.stop_reading())
        for task in pending:
            task.cancel()
        for task in done:
            task.result()  # a rejected Discord token surfaces here as a ConfigError
    finally:
        for close in cleanup:
            with contextlib.suppress(Exception):
                await close()
    return 0


async def connected(socket: AsyncSocketModeHandler, waiters: list[asyncio.Task]) -> bool:
    """Connect Socket Mode unless the process is told to stop (or Discord ends) first. slack_sdk
    retries a failed connect every 10 s for ever (Slack unreachable, a token refused after the
    start-up check): awaited alone, it would keep SIGTERM waiting until the platform's SIGKILL."""
    connecting = asyncio.create_task(socket.connect_async())
    await asyncio.wait([connecting, *waiters], return_when=asyncio.FIRST_COMPLETED)
    if connecting.done():
        connecting.result()
        return True
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await connecting
    return False
