"""`arxivscout redis start|stop|status`: manage the embedded Redis."""

from __future__ import annotations

import argparse

from app.runtime import embedded_redis
from app.settings import Settings
from memory.connection import redact_url


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("redis", help="start, stop or inspect the embedded Redis")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    server = embedded_redis(settings)
    if settings.redis_url and args.action != "status":
        print(f"REDIS_URL is set; the embedded Redis is not used ({args.action} does nothing).")
        return 0
    if args.action == "start":
        url = redact_url(server.ensure_running())
        print(
            f"embedded Redis running at {url} (data: {server.home}; password in {server.password_file})"
        )
    elif args.action == "stop":
        print("embedded Redis stopped" if server.stop() else "embedded Redis was not running")
    else:
        url = server.running_url()
        print(
            f"embedded Redis: {'running at ' + redact_url(url) if url else 'not running'} "
            f"(data: {server.home}; password in {server.password_file})"
        )
        if settings.redis_url:
            print("REDIS_URL is set, so ArxivScout uses that server instead.")
    return 0
