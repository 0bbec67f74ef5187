"""`arxivscout web`: the memory page (`/memory`) and `/healthz`, for setups without Slack's
HTTP mode (the terminal, Socket Mode, Discord); prints a sign-in link for the terminal's person.
A link signs in one browser; `arxivscout web --link` prints a fresh one (same secret, tenant and
address) and exits, for a page that is already running: run it in the page's environment (the
same ARXIVSCOUT_SECRET, REDIS_URL and ARXIVSCOUT_PUBLIC_URL), or its link will not open there.

Also the memory page's wiring, shared with `slack`, `discord` and `worker`: the link signer
(ARXIVSCOUT_SECRET, or a secret kept in Redis), the public URL links point to, and the
directories that say who a link's person is (Slack and Discord when their tokens are set).
"""

from __future__ import annotations

import argparse
import logging
import shlex
from dataclasses import dataclass

from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import (
    Admins,
    Directories,
    DiscordDirectory,
    SlackDirectory,
    use_discord_api,
)
from adapters.memory_page.auth import Links, LinkSigner, link_secret
from adapters.memory_page.server import MemoryPage, memory_page
from adapters.web import build_web_app
from app.commands.common import add_tenant, memory_session, stop_on_signals
from app.settings import Settings
from bot.errors import ConfigError
from memory.manager import MemoryManager
from memory.web_sessions import WebState

log = logging.getLogger(__name__)

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
LOCAL_USER = "local"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("web", help="serve the memory page (/memory) and print a local link")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST})")  # fmt: skip
    parser.add_argument("--port", type=port_number, default=None,
                        help=f"port to listen on (default $PORT or {DEFAULT_PORT})")  # fmt: skip
    parser.add_argument("--link", action="store_true",
                        help="only print a new sign-in link for the page already running "
                        "(same --host, --port and --tenant), then exit; run it where the page "
                        "runs, with the same ARXIVSCOUT_SECRET, REDIS_URL and "
                        "ARXIVSCOUT_PUBLIC_URL")  # fmt: skip
    add_tenant(parser)
    parser.set_defaults(handler=run)


def port_number(text: str) -> int:
    """--port's type: refused with the command's usage before anything starts."""
    port = int(text) if text.strip().isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0-65535)")
    return port


@dataclass
class PageWiring:
    """What the memory page and the platforms' `/memory` share: links and directories."""

    links: Links
    directories: Directories
    discord: DiscordDirectory | None = None
    configured: bool = True  # links point to a chosen address (ARXIVSCOUT_PUBLIC_URL, Fly's)

    def announce(self) -> None:
        """Say where links point when nobody chose it (the address people open may differ)."""
        if not self.configured:
            log.warning(
                "ARXIVSCOUT_PUBLIC_URL is not set: memory-page links point to %s (set it to "
                "the address people open, e.g. https://your-app.example.com)",
                self.links.public_url,
            )

    def page(self, memory: MemoryManager) -> MemoryPage:
        cleanup = [self.discord.close] if self.discord is not None else []
        return memory_page(memory, self.links, self.directories, cleanup=cleanup)


async def page_wiring(
    settings: Settings, memory: MemoryManager, own_url: str | None = None, announce: bool = True
) -> PageWiring:
    """Links to ARXIVSCOUT_PUBLIC_URL or the Fly app's address (else `own_url`, the address
    this process serves, else where `arxivscout web` listens by default; a Heroku web dyno
    refuses), signed with the shared secret. Also points discord.py at DISCORD_API_URL, for
    the whole process (the bot's client too)."""
    chosen_url = settings.links_url()
    public_url = chosen_url or own_url or f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
    state = WebState(memory.redis)
    secret = await link_secret(settings.secret, state.secrets)
    links = Links(LinkSigner(secret, settings.link_ttl_seconds), public_url)
    slack = None
    if settings.slack_bot_token:
        options = {"base_url": settings.slack_api_url} if settings.slack_api_url else {}
        slack = SlackDirectory(AsyncWebClient(token=settings.slack_bot_token, **options))
    if settings.discord_api_url:
        use_discord_api(settings.discord_api_url)
    discord = DiscordDirectory(settings.discord_token) if settings.discord_token else None
    directories = Directories(state.viewers, Admins(settings.admins), slack=slack, discord=discord)
    wiring = PageWiring(links, directories, discord, configured=chosen_url is not None)
    if announce:
        wiring.announce()
    return wiring


async def listen(runner: web.AppRunner, host: str, port: int) -> web.TCPSite:
    """Serve `runner` on host:port; a port in use or an unknown host is a ConfigError."""
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return site


def print_link(links: Links, tenant: str) -> None:
    print(f"Open this link within {links.ttl // 60} minutes to sign in as the {tenant!r} "
          f"tenant's admin:\n{links.login(tenant, LOCAL_USER, 'local')}", flush=True)  # fmt: skip


def again_command(host: str, port: int, tenant: str) -> str:
    """The `--link` command for the page on host:port, quoted for a shell (a tenant may hold
    spaces or quotes)."""
    return shlex.join(["arxivscout", "web", "--link", "--host", host, "--port", str(port),
                       "--tenant", tenant])  # fmt: skip


async def print_fresh_link(args: argparse.Namespace, settings: Settings, port: int) -> int:
    """`--link`: a new link for the tenant's local admin, signed and addressed as the running
    page's are (its secret, ARXIVSCOUT_PUBLIC_URL or --host/--port), without restarting it."""
    async with memory_session(settings) as memory:
        wiring = await page_wiring(settings, memory, own_url=f"http://{args.host}:{port}")
        print_link(wiring.links, args.tenant)
    return 0


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    port = args.port if args.port is not None else settings.port or DEFAULT_PORT
    if args.link:
        return await print_fresh_link(args, settings, port)
    stop = stop_on_signals()
    async with memory_session(settings) as memory:
        runner = None
        try:
            site_url = f"http://{args.host}:{port}"
            wiring = await page_wiring(settings, memory, own_url=site_url, announce=False)
            runner = web.AppRunner(build_web_app(memory, page=wiring.page(memory)))
            await runner.setup()
            site = await listen(runner, args.host, port)
            if not port:  # --port 0: the port the system chose
                port = site._server.sockets[0].getsockname()[1]
                site_url = f"http://{args.host}:{port}"
                if not wiring.configured:
                    wiring.links.public_url = site_url
            wiring.announce()
            print(f"Memory page on {site_url}/memory (Ctrl-C to stop)", flush=True)
            print_link(wiring.links, args.tenant)
            again = again_command(args.host, port, args.tenant)
            print(f"It signs in one browser; for another link, run: {again}", flush=True)
            await stop.wait()
        finally:
            if runner is not None:
                await runner.cleanup()
    return 0
