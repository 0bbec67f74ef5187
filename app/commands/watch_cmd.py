"""`arxivscout watch add|list|remove|run`: topic watches from the terminal.

A watch made here posts nowhere unless given a place (`--platform slack --channel C0123` with
the `--tenant` the channel is of: the Slack team id or Discord server id; the running bot then
posts its digests there); `watch run` prints a digest now. A terminal watch's
run is its delivery, so it records what it showed and the next run shows what is new since;
a run of a chat watch is a preview and records nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from app.commands.common import (
    DEFAULT_TENANT,
    add_json,
    add_tenant,
    memory_session,
    print_json,
)
from app.runtime import watch_service
from app.settings import Settings
from bot.watches import WatchPlace, describe, parse_period
from memory.ingest.errors import IngestError
from memory.portability_write import impossible_place
from memory.scope import Scope
from memory.stores.watches import InvalidWatch


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("watch", help="topic watches: new arXiv papers on a topic, as digests")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser("add", help="watch a topic")
    add.add_argument("topic", help='what to watch, e.g. "state-space models"')
    add.add_argument("--period", default="daily", help="daily, weekly or N days (default daily)")
    add.add_argument("--category", action="append", default=[], help="an arXiv category (repeat)")
    add.add_argument("--author", action="append", default=[], help="an author (repeat)")
    add.add_argument(
        "--platform", choices=("slack", "discord"), help="post digests there (with --tenant)"
    )
    add.add_argument("--channel", help="the Slack or Discord channel id to post in")
    listing = verbs.add_parser("list", help="the tenant's watches")
    remove = verbs.add_parser("remove", help="stop a watch")
    remove.add_argument("watch_id", metavar="ID")
    run = verbs.add_parser("run", help="print a digest now (every watch of the tenant if no ID)")
    run.add_argument("watch_id", metavar="ID", nargs="?")
    run.add_argument(
        "--since",
        help="from this date (YYYY-MM-DD) instead of the last digest, with what earlier digests "
        "were given but did not show",
    )
    for verb in (add, listing, remove, run):
        add_tenant(verb)
        verb.set_defaults(handler=RUN[verb.prog.split()[-1]])
    add_json(listing)


def _since(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise InvalidWatch(f"--since takes a date as YYYY-MM-DD, not {text!r}.") from None


async def run_add(args: argparse.Namespace) -> int:
    text = args.period.strip()
    period = parse_period(f"{text} days" if text.isdigit() else text)  # a bare N is N days
    if period is None:
        raise InvalidWatch(f"--period is daily, weekly or a number of days, not {args.period!r}.")
    if bool(args.platform) != bool(args.channel):
        raise InvalidWatch("--platform and --channel go together (where digests are posted).")
    if args.platform and args.tenant == DEFAULT_TENANT:  # no workspace's nor server's
        raise InvalidWatch(
            f"--platform needs --tenant: the Slack team id (T…) or the Discord server id whose "
            f"channel {args.channel} is (the {DEFAULT_TENANT!r} memory has no channels)."
        )
    if args.platform and (why := impossible_place(args.tenant, args.platform, args.channel)):
        raise InvalidWatch(f"{why}: give the --tenant the channel is of.")
    place = WatchPlace(args.platform, args.channel) if args.platform else None
    async with memory_session() as memory:
        service = watch_service(Settings.from_env(), memory)
        watch = await service.store.create(
            Scope(args.tenant, channel=args.channel or "terminal", user="terminal"),
            args.topic, period, platform=place.platform if place else "terminal",
            channel=place.channel if place else "terminal", categories=args.category,
            authors=args.author,
        )  # fmt: skip
    where = f"posting to {watch.platform} {watch.channel}" if place else "run it with `watch run`"
    print(f"Watching {describe(watch)} ({where}); id {watch.id}")
    return 0


async def run_list(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        watches = await watch_service(Settings.from_env(), memory).store.all(args.tenant)
    if args.json:
        print_json([vars(w) for w in watches])
        return 0
    if not watches:
        print(f"(no watches in tenant {args.tenant!r})")
    for w in watches:
        due = time.strftime("%Y-%m-%d %H:%M", time.gmtime(w.next_due))
        state = f"paused ({w.paused})" if w.paused else f"next {due} UTC"
        print(f"{w.id}  {describe(w)}  [{w.platform} {w.channel}]  {state}")
    return 0


async def run_remove(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        store = watch_service(Settings.from_env(), memory).store
        watch = await store.get(args.tenant, args.watch_id)
        if watch is None or not await store.remove(args.tenant, args.watch_id):
            print(f"arxivscout: error: no watch {args.watch_id!r} in tenant {args.tenant!r}.",
                  file=sys.stderr)  # fmt: skip
            return 2
    print(f"Stopped watching {describe(watch)} ({watch.id}).")
    return 0


async def run_run(args: argparse.Namespace) -> int:
    since = _since(args.since)
    async with memory_session() as memory:
        service = watch_service(Settings.from_env(), memory)
        if args.watch_id:
            watch = await service.store.get(args.tenant, args.watch_id)
            if watch is None:
                print(f"arxivscout: error: no watch {args.watch_id!r} in tenant {args.tenant!r}.",
                      file=sys.stderr)  # fmt: skip
                return 2
            watches = [watch]
        else:
            watches = await service.store.all(args.tenant)
        if not watches:
            print(f"(no watches in tenant {args.tenant!r}: `arxivscout watch add` makes one)")
        for n, watch in enumerate(watches):
            try:
                text = await service.run_by_hand(watch, since)
            except IngestError as exc:
                print(f"arxivscout: error: watch {watch.id}: {exc}", file=sys.stderr)
                return 1
            print(("\n" if n else "") + f"[{watch.id}] {text}")
    return 0


RUN = {"add": run_add, "list": run_list, "remove": run_remove, "run": run_run}
