"""`arxivscout discord`: run the Discord bot (gateway connection; needs DISCORD_TOKEN)."""

from __future__ import annotations

import argparse
import logging
import os

from bot.config import ConfigError, Settings
from bot.runtime import open_agent
from bot.turns import TurnHandler


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("discord", help="run the Discord bot (needs DISCORD_TOKEN)")
    parser.add_argument(
        "--guild", type=int, metavar="ID",
        help="also register the slash commands in this server now (global ones can take a while)",
    )  # fmt: skip
    parser.add_argument(
        "--no-sync", action="store_true", help="do not register the slash commands at start-up"
    )
    parser.set_defaults(handler=run)


def discord_token() -> str:
    """The bot token, checked before anything is opened so a missing one is named at once."""
    token = os.environ.get("DISCORD_TOKEN", "").strip()
    if not token:
        raise ConfigError(
            "DISCORD_TOKEN is not set: create a bot at https://discord.com/developers/applications "
            "(your app → Bot → Reset Token) and set DISCORD_TOKEN in the environment or a .env file."
        )
    return token


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()  # loads .env, where DISCORD_TOKEN may live
    token = discord_token()
    import discord  # discord.py loads only for this command

    from adapters.discord import DiscordAdapter

    discord.utils.setup_logging(level=logging.INFO)
    runtime = await open_agent(settings)
    adapter = DiscordAdapter(
        TurnHandler(runtime), runtime.memory.redis, sync=not args.no_sync, sync_guild=args.guild
    )
    try:
        await adapter.start(token)  # until Ctrl-C / SIGTERM; queued turns stay in Redis
    finally:
        await runtime.close()
    return 0
