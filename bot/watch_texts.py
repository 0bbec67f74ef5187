"""The words of topic watches: what a person asked for, and what the bot says back.

Kept apart from the service so that every side (chat, slash commands, the terminal's
`arxivscout watch`, the digest task's notices) reads a request and words a watch the same way.

- `parse_watch` reads "state-space models weekly cat:cs.LG author:Gu" (a slash command's text):
  a period is read only as the topic's last phrase ("daily", "weekly", "every N days", "every
  day|week"), so a topic's own words ("3D reconstruction", "weekly seasonality") stay in it.
- A chat message is a watch command only in an explicit form (`chat_command`): "watch: <topic>",
  or "watch <topic>" ending with a period ("weekly", "every 3 days") or naming an option ("cat:",
  "author:"), or "watch list|remove|pause|resume|help …"; never with a question mark, nor "watch
  out", "watch it" and the like.
- Made from a job, a watch's id comes from the job's id (`watch_id_of`), so a job run again finds
  the watch it made.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field

from memory.stores.watches import DAY, InvalidWatch, Watch

_PERIOD = re.compile(r"^(?:every\s*)?(\d{1,3})\s*(?:d|days?)$", re.I)
_OPTION = re.compile(r"\b(cat|category|au|author):(\"[^\"]+\"|\S+)", re.I)
# the period a topic ends with, before any closing punctuation ("… weekly."): never a bare "3d"
# or "week" (words of topics: "3D reconstruction")
_TRAILING_PERIOD = re.compile(
    r"(?:^|\s)(daily|weekly|every\s+(?:day|week|\d{1,3}\s*(?:d|days?)))[\s.!;,]*$", re.I
)
RESERVED = ("list", "remove", "delete", "stop", "pause", "resume", "help")
_CHAT = re.compile(r"^\s*watch(:|\s)\s*(.*)$", re.I | re.S)
_NOT_A_TOPIC = re.compile(r"^(out|it|this|that|these|those|me|you|him|her|them|us|over)\b", re.I)
_NAMES_OPTION = re.compile(r"\b(cat|category|au|author):", re.I)
UNREACHABLE = "My memory is unreachable right now, so nothing was changed: try again in a minute."
NOT_QUEUED = (
    "I could not take that right now (my memory is unreachable): press it again in a minute."
)
USAGE = (
    "Usage: `/watch <topic> [daily|weekly|every N days] [cat:cs.CL] [author:Name]`, "
    "`/watch list`, `/watch remove <id>`, `/watch pause <id>`, `/watch resume <id>` "
    "(in chat: “watch state-space models weekly” or “watch: state-space models”)."
)


@dataclass
class WatchRequest:
    query: str
    period: int = DAY
    categories: list[str] = field(default_factory=list)
    authors: list[str] = field(default_factory=list)


def parse_period(word: str) -> int | None:
    word = word.strip().lower()
    if word in ("daily", "day", "every day"):
        return DAY
    if word in ("weekly", "week", "every week"):
        return 7 * DAY
    if found := _PERIOD.match(word):
        days = int(found.group(1))
        return days * DAY if days >= 1 else None
    return None


def chat_command(text: str) -> str | None:
    """The command of a chat message that is an explicit watch command (see the module's
    docstring), else None: a message that merely starts with "watch" is a question."""
    found = _CHAT.match(text)
    if found is None or "?" in text:
        return None
    colon, rest = found.group(1) == ":", found.group(2).strip()
    first = rest.split()[0].lower() if rest else ""
    if first in RESERVED:
        return rest
    if not rest or _NOT_A_TOPIC.match(rest) or not (colon or _names_a_watch(rest)):
        return None
    return re.sub(r"^(for|on)\s+", "", rest, flags=re.I)


def _names_a_watch(rest: str) -> bool:
    """Whether a chat message's words (after "watch ") name an option, or end with a period as
    `parse_watch` reads one: "watch weekly diffusion models" would be a daily watch of the
    topic "weekly diffusion models", so it is no command (a sentence, for the agent)."""
    return bool(_NAMES_OPTION.search(rest) or _TRAILING_PERIOD.search(_OPTION.sub(" ", rest)))


def parse_watch(text: str) -> WatchRequest:
    """A watch's topic and options from free text; InvalidWatch when nothing is asked. The
    period is the topic's last phrase only (`_TRAILING_PERIOD`), read once the options are out."""
    request = WatchRequest("")
    for found in _OPTION.finditer(text):
        value = found.group(2).strip('"').replace("_", " ").strip()
        target = request.categories if found.group(1).lower() in ("cat", "category") else None
        (target if target is not None else request.authors).append(value)
    topic = " ".join(_OPTION.sub(" ", text).split())
    if found := _TRAILING_PERIOD.search(topic):
        period = parse_period(" ".join(found.group(1).split()))
        if period is None:  # "every 0 days"
            raise InvalidWatch("A watch's period is at least a day. " + USAGE)
        request.period, topic = period, topic[: found.start()]
    request.query = topic.strip(" .,:;\"'")
    if not (request.query or request.categories or request.authors):
        raise InvalidWatch("What should I watch? " + USAGE)
    return request


def watch_id_of(tenant: str, job_id: str) -> str:
    """A watch's id from the job that made it: the same job run again makes the same watch."""
    return hashlib.blake2b(f"{tenant}:{job_id}".encode(), digest_size=5).hexdigest()


def describe(watch: Watch) -> str:
    what = f"“{watch.query}”" if watch.query else "new papers"
    extra = [f"cat:{c}" for c in watch.categories] + [f"author:{a}" for a in watch.authors]
    return f"{what}{' ' + ' '.join(extra) if extra else ''}, {watch.period_name}"


def period_span(watch: Watch) -> str:
    """A watch's period as a span of time: "day", "week", "3 days"."""
    name = watch.period_name
    return {"daily": "day", "weekly": "week"}.get(name, name.removeprefix("every "))


def created_text(watch: Watch, elsewhere: bool = False) -> str:
    """The answer to a watch made in chat (it starts with "Watching "). `elsewhere`: it posts
    to another channel than it was asked in (a Discord thread's channel), which it names."""
    where = f"in <#{watch.channel}>" if elsewhere else "here"
    if watch.platform == "terminal":
        where = "for the terminal (`arxivscout watch run`)"
    return (
        f"Watching {describe(watch)} {where} (id `{watch.id}`). The first digest comes "
        f"within a few minutes and covers the last {period_span(watch)}; "
        f"`/watch remove {watch.id}` stops it."
    )


def saving_text(arxiv_id: str) -> str:
    """The first answer to a pressed Save (the task answers again once it is saved)."""
    return f"Saving arXiv:{arxiv_id} to the team knowledge base…"


def utc_minute(timestamp: float) -> str:
    """A time as people read it in a notice or a listing ("2026-12-01 10:41", UTC)."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(timestamp))
