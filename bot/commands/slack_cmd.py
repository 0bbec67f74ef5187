"""`arxivscout slack`: serve Slack in HTTP mode (web dyno) or Socket Mode (worker)."""

from __future__ import annotations

import argparse
import os

from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import SlackAdapter
from adapters.web import build_web_app
from bot.commands.common import stop_on_signals
from bot.config import ConfigError, Settings
from bot.runtime import open_agent
from bot.turns import TurnHandler


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "slack", help="run the Slack bot (HTTP mode, or --socket for Socket Mode)"
    )
    parser.add_argument(
        "--socket", action="store_true", help="use Socket Mode (needs SLACK_APP_TOKEN)"
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "3000")),
                        help="HTTP port for /slack/events and /healthz (default: $PORT or 3000)")  # fmt: skip
    parser.set_defaults(handler=run)


def require(name: str, prefix: str, why: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set: {why}")
    if prefix and not value.startswith(prefix):
        raise ConfigError(f"{name} should start with '{prefix}' (got '{value[:5]}…'): {why}")
    return value


def slack_tokens(socket: bool) -> tuple[str, str | None, str | None]:
    """(bot token, signing secret, app token), each checked and named when missing."""
    bot = require("SLACK_BOT_TOKEN", "xoxb-", "the bot token from OAuth & Permissions.")
    if socket:
        return (
            bot,
            None,
            require("SLACK_APP_TOKEN", "xapp-", "an app-level token with connections:write."),
        )
    return (
        bot,
        require("SLACK_SIGNING_SECRET", "", "from Basic Information → App Credentials."),
        None,
    )


async def check_bot_token(token: str, api_url: str | None) -> dict:
    client = (
        AsyncWebClient(token=token, base_url=api_url) if api_url else AsyncWebClient(token=token)
    )
    try:
        return (await client.auth_test()).data
    except SlackApiError as exc:
        raise ConfigError(
            f"Slack rejected SLACK_BOT_TOKEN ({exc.response.get('error')})."
        ) from None
    except Exception as exc:
        raise ConfigError(f"Could not reach Slack to check SLACK_BOT_TOKEN: {exc}") from None


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.socket:
        from bot.commands.worker_cmd import serve

        return await serve(use_slack=True, use_discord=False, port=args.port)
    bot_token, signing_secret, _ = slack_tokens(socket=False)
    api_url = os.environ.get("SLACK_API_URL") or None
    identity = await check_bot_token(bot_token, api_url)  # before anything slow starts
    runtime = await open_agent(settings)
    runner = None
    try:
        adapter = SlackAdapter(
            TurnHandler(runtime), runtime.memory.redis, bot_token, signing_secret, api_url
        )
        await adapter.check_token()
        runner = web.AppRunner(build_web_app(runtime.memory.redis, adapter.app))
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", args.port).start()
        print(
            f"ArxivScout on Slack workspace {identity.get('team')} as {identity.get('user')} "
            f"(HTTP mode on :{args.port}/slack/events)"
        )
        await stop_on_signals().wait()
        await adapter.close()
    finally:
        if runner:
            await runner.cleanup()
        await runtime.close()
    return 0
