"""RediSearch syntax of episodic memory: the tag values a message is stored with, the clause
every read carries, and FT.SEARCH replies parsed to rows.

Underscored names here are private to the `episodic*` modules: kept as they were when these
lived in `episodic`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from redisvl.utils.token_escaper import TokenEscaper

from memory.scope import PUBLIC, Scope
from memory.stores.base import decoded
from memory.stores.episodic_episode import Episode

SEP = "\x1f"  # tag separator: validated thread ids, like channel and user ids, never hold it
FIELDS = ["thread", "channel", "audience", "author", "author_name", "role", "text", "ts", "seq"]
ROW = ["msg", "meta"]  # what a candidate row carries (see `EpisodicStore._common`)
WORDS_ROW = [*ROW, "text", "part"]  # and its words, for pseudo-relevance feedback
_WORD = re.compile(r"\w+")
_TAG_ESCAPER = TokenEscaper(re.compile(TokenEscaper.TAG_ESCAPED_CHARS))
_TEXT_ESCAPER = TokenEscaper()


def _names(e: Episode) -> list[str]:
    """The words of the author's name, as the `names` tag holds them."""
    return list(dict.fromkeys(_WORD.findall(e.author_name.lower())))


def _pos(thread: str, seq: int) -> str:
    return f"{seq}@{thread}"


@lru_cache(maxsize=65_536)
def _pos_tag(thread: str, seq: int) -> str:
    """`_pos` escaped for a tag clause: remembered, as recall asks for a hundred places a
    question, mostly the same ones, and escaping runs a regex with a callback per character."""
    return _TAG_ESCAPER.escape(_pos(thread, seq))


def _tags(field_name: str, values: Iterable[str]) -> str:
    return f"@{field_name}:{{{'|'.join(_TAG_ESCAPER.escape(v) for v in values)}}}"


ASSISTANT = "assistant"  # the role, and the name, of the bot's messages (`Episode.speaker`)
_MENTION = re.compile(r"<@!?([^>|]+)(?:\|[^>]*)?>")  # <@U1>, <@U1|ana> (Slack), <@!1> (Discord)


def _author(person: str) -> str:
    """Messages by a person named as the model may name them: their platform user id (a
    mention too), or their name, every word of it among the `names` of the author's. The
    bot's own, stored with no author, by the name they are shown under: "assistant"."""
    person = person.strip()
    if mention := _MENTION.fullmatch(person):
        person = mention.group(1)
    person = person.lstrip("@").strip()
    if not person:
        return ""
    words = list(dict.fromkeys(_WORD.findall(person.lower())))
    by_id = _tags("author", [person])
    if not words:
        return by_id
    by_name = " ".join(_tags("names", [w]) for w in words)
    if words == [ASSISTANT]:
        return f"({by_id} | ({by_name}) | {_tags('role', [ASSISTANT])})"
    return f"({by_id} | ({by_name}))"


def _filter(
    scope: Scope,
    thread: str | None = None,
    author: str | None = None,
    since: float | None = None,
    until: float | None = None,
    skip_from: tuple[str, int] | None = None,
) -> str:
    """The query clause every read carries: what this place may see, and the caller's filters.
    A walled scope also finds its own thread's messages, whatever their audience (`Scope.may_show`:
    a guest asking in a public thread); anyone else's own thread holds only what they may see,
    or a guest's turns there, which its summaries cover, so their clause stays narrow."""
    seen = _tags("audience", scope.audiences)
    if scope.walled and scope.thread:
        seen = f"({seen} | {_tags('thread', [scope.thread])})"
    parts = [seen]
    if thread:
        parts.append(_tags("thread", [thread]))
    if author and (clause := _author(author)):
        parts.append(clause)
    if since is not None or until is not None:
        low = "-inf" if since is None else repr(float(since))
        high = "+inf" if until is None else repr(float(until))
        parts.append(f"@ts:[{low} {high}]")
    if skip_from is not None:
        parts.append(f"-({_tags('thread', [skip_from[0]])} @seq:[{skip_from[1]} +inf])")
    return " ".join(parts)


def _rows(reply: Any) -> list[tuple[float, dict[bytes, Any]]]:
    """FT.SEARCH's reply, RESP2 or RESP3, as (score, fields by their names as bytes); the
    score when WITHSCORES. Nothing is decoded here: this runs for every candidate."""
    if isinstance(reply, dict):
        rows = [(r.get(b"score") or 0.0, r[b"extra_attributes"]) for r in reply[b"results"]]
    else:
        step = 3 if len(reply) > 2 and not isinstance(reply[2], list) else 2
        rows = [
            (float(reply[i + 1]) if step == 3 else 0.0,
             dict(zip(reply[i + step - 1][::2], reply[i + step - 1][1::2], strict=True)))
            for i in range(1, len(reply), step)
        ]  # fmt: skip
    if rows and isinstance(next(iter(rows[0][1]), b""), str):  # a client decoding replies
        rows = [(score, {k.encode(): v for k, v in row.items()}) for score, row in rows]
    return rows


def _episode(row: dict[bytes, Any]) -> Episode:
    """A message from its `_fetch` row: every field decoded at once (a hundred rows a recall)."""
    field = decoded(row).get
    return Episode(
        id=field(b"msg") or "", thread=field(b"thread") or "", channel=field(b"channel") or "",
        audience=field(b"audience") or PUBLIC, author=field(b"author") or "",
        author_name=field(b"author_name") or "", role=field(b"role") or "user",
        text=field(b"text") or "", ts=float(field(b"ts") or 0),
        seq=int(float(field(b"seq") or 0)),
    )  # fmt: skip
