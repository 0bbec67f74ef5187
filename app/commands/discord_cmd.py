"""`arxivscout discord`: run the Discord bot (gateway connection; needs DISCORD_TOKEN)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING

from app.commands.common import stop_on_signals
from app.commands.web_cmd import page_wiring
from app.runtime import open_agent
from app.settings import Settings

if TYPE_CHECKING:
    from adapters.discord import DiscordAdapter

CLOSE_SECONDS = 10.0  # for the gateway to close after a stop
TOKEN_WHY = (
    "create a bot at https://discord.com/developers/applications (your app → Bot → Reset "
    "Token) and set DISCORD_TOKEN in the environment or a .env file."
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("discord", help="run the Discord bot (needs DISCORD_TOKEN)")
    parser.add_argument(
        "--guild", type=int, metavar="ID",
        help="register the slash commands in this server only (they show at once)",
    )  # fmt: skip
    parser.add_argument(
        "--no-sync", action="store_true", help="do not register the slash commands at start-up"
    )
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    token = settings.require("discord_token", TOKEN_WHY)  # named before anything slow starts
    import discord  # discord.py loads only for this command

    from adapters.discord import DiscordAdapter

    discord.utils.setup_logging(level=logging.INFO)
    runtime = await open_agent(settings)
    try:
        wiring = await page_wiring(settings, runtime.memory)  # the links of `/memory`
        adapter = DiscordAdapter(
            runtime.turns(),
            sync=not args.no_sync,
            sync_guild=args.guild,
            links=wiring.links,
            admins=wiring.directories.admins,
        )
        await serve_until_stopped(adapter, token)
    finally:
        await runtime.close()
    return 0


async def serve_until_stopped(adapter: DiscordAdapter, token: str) -> None:
    """Serve until SIGTERM/SIGINT (as the worker does): running turns then finish or go back
    to the queue, and messages kept while the memory was unreachable get a last try, before
    the gateway closes. A rejected token is raised (ConfigError)."""
    stop = asyncio.create_task(stop_on_signals().wait())
    serving = asyncio.create_task(adapter.start(token))
    await asyncio.wait([stop, serving], return_when=asyncio.FIRST_COMPLETED)
    await adapter.stop()
    stop.cancel()
    if serving.done():
        serving.result()  # a rejected token or intent: its ConfigError
        return
    await adapter.client.close()  # `start` returns once the gateway is closed
    _, late = await asyncio.wait([serving], timeout=CLOSE_SECONDS)
    for task in late:
        task.cancel()
    await asyncio.gather(serving, return_exceptions=True)
