"""`arxivscout tasks dead|requeue`: the background tasks given up on, and putting them back.

A task that keeps failing (or whose run took its process down) is dead-lettered to its
stream's `<stream>:dead`; once its cause is fixed, `requeue` queues it again as a fresh task
(its deliveries from 0), moved off the dead letters in one atomic step: never lost, never
doubled. It is marked requeued (its payload's `requeued`, the dead letter's id), so a kind that
keeps its own progress across runs starts afresh (a shared file is read again). Payloads are
shown with their credentials redacted (a Slack response_url, a token).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from typing import Any

from app.commands.common import add_json, print_json
from app.runtime import redis_url
from app.settings import Settings
from memory.connection import connect
from memory.dead_letters import (
    DeadLetter,
    UnknownDeadLetter,
    dead_letter_streams,
    dead_letters,
    requeue,
)
from memory.keys import task_stream, task_stream_name
from memory.shorten import shortened
from memory.tasks import TaskStream

REDACTED = "[redacted]"
# payload keys whose values are credentials (a response_url posts as the bot, for 30 minutes)
SECRET_KEY = re.compile(r"token|secret|password|response_url|webhook|authorization", re.I)
# credentials inside text (an error's message, a payload's strings)
SECRET_TEXT = re.compile(
    r"https://hooks\.slack\.com/\S+|https://discord(?:app)?\.com/api/webhooks/\S+"
    r"|xox[a-z]-[A-Za-z0-9-]+|xapp-[A-Za-z0-9-]+"
)
PREVIEW_CHARS = 120
ERROR_CHARS = 160


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tasks", help="background tasks given up on: list them, requeue them")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    dead = verbs.add_parser("dead", help="list the dead letters of every task stream")
    again = verbs.add_parser("requeue", help="queue dead letters again as fresh tasks")
    again.add_argument("ids", metavar="ID", nargs="*", help="a dead letter, as listed (STREAM/ID)")
    again.add_argument("--all", action="store_true", help="every dead letter (of --stream, --kind)")
    for verb in (dead, again):
        verb.add_argument("--stream", help="only this stream (e.g. tasks, shared-files-slack)")
        verb.add_argument("--kind", help="only tasks of this kind")
        add_json(verb)
    dead.set_defaults(handler=run_dead)
    again.set_defaults(handler=run_requeue, parser=again)  # its parser: to say a usage error


async def run_dead(args: argparse.Namespace) -> int:
    client = await connect(redis_url(Settings.from_env()))
    try:
        letters = await _dead_letters(client, args.stream, args.kind)
    finally:
        await client.aclose()
    records = [_record(letter) for letter in letters]
    if args.json:
        print_json(records)
        return 0
    if not records:
        print("No dead letters.")
    for record in records:
        deliveries = record["deliveries"]
        payload = json.dumps(record["payload"], ensure_ascii=False)
        print(
            f"{record['id']}  {record['dead_at']}  {record['kind']}  "
            f"{deliveries} deliver{'y' if deliveries == 1 else 'ies'}  "
            f"{_one_line(record['error'], ERROR_CHARS)}\n"
            f"    {_one_line(payload, PREVIEW_CHARS)}"
        )
    return 0


async def run_requeue(args: argparse.Namespace) -> int:
    if bool(args.ids) == args.all:  # a usage error: said with the usage, exit status 2
        args.parser.error("give dead letters' ids (STREAM/ID, as `tasks dead` lists) or --all")
    client = await connect(redis_url(Settings.from_env()))
    try:
        if args.all:
            letters = await _dead_letters(client, args.stream, args.kind)
            wanted = [(TaskStream(client, letter.stream), letter.id) for letter in letters]
        else:
            wanted = [_parse_id(client, text) for text in args.ids]
        requeued, unknown = [], []
        for stream, dead_id in wanted:  # every known id, though one before it is not
            new_id = await requeue(stream, dead_id)
            name = task_stream_name(stream.stream)
            if new_id is not None:
                requeued.append({"id": f"{name}/{dead_id}", "task": new_id, "stream": name})
            elif not args.all:  # under --all: requeued meanwhile by another
                unknown.append(f"{name}/{dead_id}")
    finally:
        await client.aclose()
    if args.json:
        print_json(requeued)
    else:
        for row in requeued:
            print(f"requeued {row['id']} as task {row['task']}")
        print(f"{len(requeued)} requeued.")
    for dead in unknown:  # said after what was done, so a partial run is read whole
        print(f"arxivscout: error: No dead letter {dead} (requeued already?).", file=sys.stderr)
    return 2 if unknown else 0


async def _dead_letters(client: Any, stream: str | None, kind: str | None) -> list[DeadLetter]:
    streams = await dead_letter_streams(client)
    if stream:
        streams = [s for s in streams if task_stream_name(s.stream) == stream]
    letters = [letter for s in streams for letter in await dead_letters(s)]
    return [letter for letter in letters if not kind or letter.kind == kind]


def _parse_id(client: Any, text: str) -> tuple[TaskStream, str]:
    name, _, dead_id = text.rpartition("/")
    if not name or not re.fullmatch(r"\d+-\d+", dead_id):
        raise UnknownDeadLetter(f"{text!r} is not a dead letter's id: STREAM/ID, as listed.")
    return TaskStream(client, task_stream(name)), dead_id


def _record(letter: DeadLetter) -> dict[str, Any]:
    """What is shown of a dead letter: credentials redacted, the error's last line."""
    lines = [line for line in letter.error.splitlines() if line.strip()]
    return {
        "id": f"{task_stream_name(letter.stream)}/{letter.id}",
        "stream": task_stream_name(letter.stream),
        "kind": letter.kind,
        "dead_at": datetime.fromtimestamp(letter.dead_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        "deliveries": letter.deliveries,
        "task": letter.task_id,
        "error": redact(lines[-1] if lines else ""),
        "payload": redact(letter.payload),
    }


def redact(value: Any) -> Any:
    """`value` with the credentials it holds replaced (by key, and in any text)."""
    if isinstance(value, dict):
        return {
            k: REDACTED if SECRET_KEY.search(str(k)) and v else redact(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return SECRET_TEXT.sub(REDACTED, value)
    return value


def _one_line(text: str, limit: int) -> str:
    return shortened(" ".join(text.split()), limit)
