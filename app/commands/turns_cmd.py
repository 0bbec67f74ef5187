"""`arxivscout memory usage` (what the model cost, per tenant and thread, and per turn of one
thread) and `arxivscout eval feedback` (the 👍/👎 people gave answers, listed or exported with
the whole turn record)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.commands.common import DEFAULT_TENANT, add_json, add_tenant, memory_session, print_json
from memory.stores.turn_records import TurnRecord, day_of

HEAD = 60  # characters of a question shown in a list
COLUMNS = ("tokens_in", "tokens_out", "model_calls", "tool_calls", "turns")


# -- memory usage ---------------------------------------------------------------------------------


def add_usage_parser(views: argparse._SubParsersAction) -> None:
    usage = views.add_parser(
        "usage", help="model usage (tokens, model and tool calls) per tenant and thread"
    )
    usage.add_argument("--thread", help="only this thread, and each of its turns")
    usage.add_argument("--top", type=thread_count, default=10, help="threads shown (default 10)")
    add_tenant(usage)
    add_json(usage)
    usage.set_defaults(handler=run_usage)


def thread_count(text: str) -> int:
    """--top's type: refused with the command's usage below 1 (0 or less would read the whole
    ranking: Redis takes a stop of -1 as its end)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} is too small: at least 1 thread")
    return count


async def run_usage(args: argparse.Namespace) -> int:
    async with memory_session() as memory:
        records, tenant = memory.turn_records, args.tenant
        today = day_of(time.time())
        data: dict[str, Any] = {
            "tenant": tenant,
            "total": await records.usage(tenant),
            "today": {"day": today, **await records.usage(tenant, day=today)},
        }
        if args.thread:
            threads = [(args.thread, await records.usage(tenant, args.thread))]
            data["turns"] = turn_rows(await records.of_thread(tenant, args.thread))
        else:
            threads = await records.top_threads(tenant, args.top)
        data["threads"] = [{"thread": thread, **counts} for thread, counts in threads]
    if args.json:
        print_json(data)
    else:
        print(usage_text(data))
    return 0


def turn_rows(records: list[TurnRecord]) -> list[dict[str, Any]]:
    """One row per turn, newest first: when, its id, what it cost, its rating."""
    return [
        {"at": r.created_at, "turn": r.id, "tokens_in": r.usage.tokens_in,
         "tokens_out": r.usage.tokens_out, "model_calls": r.usage.model_calls,
         "tool_calls": r.usage.tool_calls, "rating": r.rating}
        for r in records
    ]  # fmt: skip


def turns_text(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "  time              tokens in  tokens out  model calls  tool calls  rating  turn"]
    lines += [
        f"  {time.strftime('%Y-%m-%d %H:%M', time.localtime(t['at']))}  {t['tokens_in']:>9,}  "
        f"{t['tokens_out']:>10,}  {t['model_calls']:>11,}  {t['tool_calls']:>10,}  "
        f"{t['rating']:>+6d}  {t['turn']}"
        for t in rows
    ] or ["  (no turns recorded in this thread)"]
    return lines


def counts_text(counts: dict[str, int]) -> str:
    return (
        f"{counts['tokens_in']:,} tokens in, {counts['tokens_out']:,} out, "
        f"{counts['model_calls']:,} model calls, {counts['tool_calls']:,} tool calls, "
        f"{counts['turns']:,} turns"
    )


def usage_text(data: dict[str, Any]) -> str:
    lines = [
        f"Usage of tenant {data['tenant']!r}: {counts_text(data['total'])}",
        f"Today ({data['today']['day']} UTC): {counts_text(data['today'])}",
        "",
        "  tokens in  tokens out  model calls  tool calls  turns  thread",
    ]
    lines += [
        f"  {t['tokens_in']:>9,}  {t['tokens_out']:>10,}  {t['model_calls']:>11,}  "
        f"{t['tool_calls']:>10,}  {t['turns']:>5,}  {t['thread']}"
        for t in data["threads"]
    ] or ["  (no usage counted yet)"]
    if "turns" in data:
        lines += turns_text(data["turns"])
    return "\n".join(lines)


# -- eval feedback --------------------------------------------------------------------------------


def add_feedback_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rating", choices=["up", "down"], help="feedback: only 👍 or 👎")
    parser.add_argument("-o", "--output", type=Path,
                        help="feedback: write the turn records as JSON Lines to FILE")  # fmt: skip


def feedback_rows(records: list[TurnRecord], rating: str | None) -> list[dict[str, Any]]:
    """One row per vote, latest first: time, thread, who, rating, comment, question head."""
    wanted = {"up": 1, "down": -1}.get(rating or "")
    rows = [
        {"at": vote.at, "turn": r.id, "thread": r.thread, "user": vote.user, "name": vote.name,
         "rating": vote.rating, "comment": vote.comment, "reasons": vote.reasons,
         "question": r.question[:HEAD]}
        for r in records for vote in r.feedback.values()
        if wanted is None or vote.rating == wanted
    ]  # fmt: skip
    return sorted(rows, key=lambda row: row["at"], reverse=True)


def feedback_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no feedback)"
    lines = []
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["at"]))
        mark = "👍" if row["rating"] > 0 else "👎"
        who = f"{row['name']} ({row['user']})" if row["name"] else row["user"]
        said = f"  “{row['comment']}”" if row["comment"] else ""
        why = f"  [{', '.join(row['reasons'])}]" if row["reasons"] else ""
        lines.append(
            f"{when}  {mark}  {who}  {row['thread']}  turn {row['turn']}{said}{why}\n"
            f"    Q: {row['question']}"
        )
    return "\n".join(lines)


async def run_feedback(args: argparse.Namespace) -> int:
    tenant = args.tenant or DEFAULT_TENANT
    async with memory_session() as memory:
        records = await memory.turn_records.with_feedback(tenant)
    rows = feedback_rows(records, args.rating)
    if args.output:
        chosen = {row["turn"] for row in rows}
        lines = [json.dumps(r.to_json(), ensure_ascii=False) for r in records if r.id in chosen]
        partial = args.output.with_name(args.output.name + ".part")
        try:
            partial.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            os.replace(partial, args.output)
        finally:
            partial.unlink(missing_ok=True)
        print(f"Exported {len(lines)} turn records to {args.output}.", file=sys.stderr)
    if args.json:
        print_json(rows)
    elif not args.output:
        print(feedback_text(rows))
    return 0
