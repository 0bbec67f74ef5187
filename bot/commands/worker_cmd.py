"""`arxivscout worker`: the Procfile's worker: Discord and/or Slack Socket Mode in one process.

Runs whichever is configured (DISCORD_TOKEN; SLACK_APP_TOKEN with SLACK_BOT_TOKEN), sharing
one agent and one Redis; serves /healthz on $PORT when PORT is set.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from aiohttp import web

from adapters.web import build_web_app
from bot.commands.common import stop_on_signals
from bot.commands.discord_cmd import discord_token
from bot.commands.slack_cmd import check_bot_token, slack_tokens
from bot.config import ConfigError, Settings
from bot.runtime import open_agent
from bot.turns import TurnHandler


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("worker", help="run Discord and/or Slack Socket Mode (Procfile worker)")
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    Settings.from_env()  # loads .env, where the tokens may live
    return await serve(
        use_slack=bool(os.environ.get("SLACK_APP_TOKEN")),
        use_discord=bool(os.environ.get("DISCORD_TOKEN")),
        port=int(os.environ["PORT"]) if os.environ.get("PORT") else None,
    )


async def serve(use_slack: bool, use_discord: bool, port: int | None) -> int:
    """Slack Socket Mode and/or Discord on one agent; /healthz on `port` if given.
    (`arxivscout slack --socket` is this with Slack alone.)"""
    settings = Settings.from_env()
    if not (use_slack or use_discord):
        raise ConfigError(
            "The worker serves Discord (set DISCORD_TOKEN) and/or Slack Socket Mode (set "
            "SLACK_APP_TOKEN and SLACK_BOT_TOKEN); neither is set."
        )
    api_url = os.environ.get("SLACK_API_URL") or None
    if use_slack:  # every token is checked before anything slow starts
        bot_token, _, app_token = slack_tokens(socket=True)
        await check_bot_token(bot_token, api_url)
    token = discord_token() if use_discord else ""
    runtime = await open_agent(settings)
    handler = TurnHandler(runtime)
    cleanup = [runtime.close]
    try:
        if port is not None:
            runner = web.AppRunner(build_web_app(runtime.memory.redis))
            await runner.setup()
            await web.TCPSite(runner, "0.0.0.0", port).start()
            cleanup.insert(0, runner.cleanup)
        waiters = [asyncio.create_task(stop_on_signals().wait())]
        if use_slack:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            from adapters.slack import SlackAdapter

            slack = SlackAdapter(handler, runtime.memory.redis, bot_token, api_url=api_url)
            await slack.check_token()
            socket = AsyncSocketModeHandler(slack.app, app_token)
            await socket.connect_async()
            cleanup[:0] = [socket.close_async, slack.close]
            print("Slack Socket Mode connected")
        if use_discord:
            from adapters.discord import DiscordAdapter

            discord_adapter = DiscordAdapter(handler, runtime.memory.redis)
            waiters.append(asyncio.create_task(discord_adapter.start(token)))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()  # a rejected Discord token surfaces here as a ConfigError
    finally:
        for close in cleanup:
            with contextlib.suppress(Exception):
                await close()
    return 0
