"""`arxivscout slack`: serve Slack in HTTP mode (web dyno) or Socket Mode (worker)."""

from __future__ import annotations

import argparse

from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import SlackAdapter
from adapters.web import build_web_app
from app.commands.common import stop_on_signals
from app.commands.web_cmd import listen, page_wiring, port_number
from app.runtime import AgentRuntime, open_agent
from app.settings import Settings
from bot.errors import ConfigError

BOT_TOKEN_WHY = "the bot token from OAuth & Permissions."


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "slack", help="run the Slack bot (HTTP mode, or --socket for Socket Mode)"
    )
    parser.add_argument(
        "--socket", action="store_true", help="use Socket Mode (needs SLACK_APP_TOKEN)"
    )
    parser.add_argument("--port", type=port_number, default=None,
                        help="HTTP port for /slack/events and /healthz (default: $PORT or 3000)")  # fmt: skip
    parser.set_defaults(handler=run)


def web_client(api_url: str | None, token: str | None = None) -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=api_url) if api_url else AsyncWebClient(token=token)


async def check_bot_token(token: str, api_url: str | None) -> dict:
    try:
        return (await web_client(api_url, token).auth_test()).data
    except SlackApiError as exc:
        raise ConfigError(
            f"Slack rejected SLACK_BOT_TOKEN ({exc.response.get('error')})."
        ) from None
    except Exception as exc:
        raise ConfigError(f"Could not reach Slack to check SLACK_BOT_TOKEN: {exc}") from None


# apps.connections.open's answers to a token that can never connect (revoked, without
# connections:write, a bot or user token, a workspace that refuses the app): slack_sdk's
# connect would retry it every 10 s for ever. (A valid app token of another app passes: Slack
# cannot tell it from this app's.)
APP_TOKEN_REFUSALS = frozenset({
    "not_authed", "invalid_auth", "account_inactive", "token_revoked", "token_expired",
    "missing_scope", "not_allowed_token_type", "no_permission", "access_denied",
    "forbidden_team", "team_access_not_granted",
})  # fmt: skip
APP_TOKEN_WHY = "an app-level token (xapp-) of this app with connections:write."


async def check_app_token(token: str, api_url: str | None) -> None:
    """Refuse an app-level token Slack will never let connect, before anything slow starts:
    Socket Mode's own connect logs the refusal and retries for ever. The URL it issues is left
    unused (the socket asks for its own when it connects)."""
    try:
        await web_client(api_url).apps_connections_open(app_token=token)
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error in APP_TOKEN_REFUSALS:
            raise ConfigError(
                f"Slack rejected SLACK_APP_TOKEN ({error}): {APP_TOKEN_WHY}"
            ) from None
    except Exception as exc:
        raise ConfigError(f"Could not reach Slack to check SLACK_APP_TOKEN: {exc}") from None


async def stop_reading(adapter: SlackAdapter, runtime: AgentRuntime) -> None:
    """Every background worker of the process (`/summarize`'s, and the runtime's parts, as
    app/runtime.py `close` takes them) stops reading and hands back the tasks it has not
    started before any running batch is awaited (`adapter.close`, `runtime.close`): no
    hand-back waits for another worker's batches, and the platform's kill."""
    await adapter.summaries.stop_reading()
    await runtime.stop_reading()


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    port = args.port if args.port is not None else settings.port or 3000
    if args.socket:
        from app.commands.worker_cmd import serve

        return await serve(settings, use_slack=True, use_discord=False, port=port)
    bot_token = settings.require("slack_bot_token", BOT_TOKEN_WHY, prefix="xoxb-")
    secret = settings.require("slack_signing_secret", "from Basic Information → App Credentials.")
    settings.links_url()  # a Heroku web dyno without ARXIVSCOUT_PUBLIC_URL stops here
    identity = await check_bot_token(bot_token, settings.slack_api_url)  # before anything slow
    runtime = await open_agent(settings)
    runner = None
    try:
        wiring = await page_wiring(settings, runtime.memory, own_url=f"http://localhost:{port}")
        adapter = SlackAdapter(
            runtime.turns(), bot_token, secret, settings.slack_api_url,
            links=wiring.links, directory=wiring.directories,
        )  # fmt: skip
        await adapter.check_token()
        page = wiring.page(runtime.memory)  # /memory, beside /slack/events
        runner = web.AppRunner(
            build_web_app(runtime.memory, adapter.app, signing_secret=secret, page=page)
        )
        await runner.setup()
        await listen(runner, "0.0.0.0", port)
        print(
            f"ArxivScout on Slack workspace {identity.get('team')} as {identity.get('user')} "
            f"(HTTP mode on :{port}/slack/events, memory page at {wiring.links.page('/memory')})"
        )
        adapter.pipeline.start()  # take over the threads of processes that died
        await stop_on_signals().wait()
        await adapter.pipeline.shutdown()  # what cannot finish in time goes back to the queue
        await stop_reading(adapter, runtime)  # then every worker's hand-back, before any waits
        await adapter.close()
    finally:
        if runner:
            await runner.cleanup()
        await runtime.close()
    return 0
