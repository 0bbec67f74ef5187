"""`arxivscout discord`: run the Discord bot (gateway connection; needs DISCORD_TOKEN)."""

from __future__ import annotations

import argparse
import logging

from app.commands.web_cmd import page_wiring
from app.runtime import open_agent
from app.settings import Settings

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
        await adapter.start(token)  # until Ctrl-C / SIGTERM; queued turns stay in Redis
    finally:
        await runtime.close()
    return 0
