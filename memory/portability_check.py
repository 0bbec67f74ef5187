"""The export format's kinds, and the check every line of an export passes before an import
writes anything (the format itself: memory/portability.py).

`Check` reads the records in file order: the header first (its version, and whether the
export's embedding model is the configured one), then known kinds with their fields (a
message only with its type's fields, and a message's, summary's or tool log's each of its type:
the stores read them back as those types; a summary's or tool log's other fields are dropped as
its store skips them), threads declared before their messages and records (a summary's, tool
log's or turn's own thread), no id twice, and (since version 2) the end line last, counting the
lines before it: a file without it was cut short, one that counts others lost lines from its
middle. A malformed record is a `BadExportLine` naming its line.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import types
import typing
from collections import Counter
from dataclasses import MISSING, fields
from typing import Any

from memory.keys import InvalidName, validate_thread
from memory.retention import InvalidRetention, check_days
from memory.stores.conversation import ConversationStore, Message
from memory.stores.entity_pieces import PIECES, PROVENANCE, TAGS
from memory.stores.summary import Summary, SummaryStore
from memory.stores.tool_log import ToolLogEntry, ToolLogStore
from memory.stores.turn_records import TurnRecord
from memory.stores.watches import MIN_PERIOD

HEADER = "arxivscout-export"
END = "end"  # the last line (since version 2): {"kind": "end", "counts": {plural: n, ...}}
VERSION = 2
READS = (1, 2)  # version 1 has no end line
MAX_ID = 1024
PLURALS = {"thread": "threads", "message": "messages", "summary": "summaries",
           "tool_log": "tool_logs", "paper": "papers", "chunk": "chunks", "entity": "entities",
           "workflow": "workflows", "retention": "retention",
           "turn": "turn_records", "watch": "watches"}  # fmt: skip
WATCH_PLATFORMS = ("slack", "discord", "terminal")
WATCH_TEXTS = ("query", "platform", "channel", "thread", "audience", "created_by", "paused")
WATCH_TIMES = ("created_at", "since", "last_posted", "failing_since")
# a turn record's text fields but its id, question and answer (checked on their own)
TURN_TEXTS = tuple(
    f.name
    for f in fields(TurnRecord)
    if typing.get_type_hints(TurnRecord)[f.name] is str
    and f.name not in ("id", "tenant", "thread", "question", "answer")
)


class BadExportLine(ValueError):
    """A line of an export that cannot be imported; nothing was written."""

    def __init__(self, line_no: int, why: str) -> None:
        super().__init__(line_no, why)
        self.line_no, self.why = line_no, why

    def __str__(self) -> str:
        return f"Line {self.line_no} of the export: {self.why} Nothing was imported."


class _Bad(Exception):
    """Why a record is malformed (the line number is added by `Check.line`)."""


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise _Bad(why)


def _is_number(value: Any) -> bool:
    """A finite int or float (JSON as Python reads it also holds NaN and Infinity)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _pieces(value: str) -> bool:
    """An entity's `pieces` (memory/stores/entity_pieces.py): [[question id, text], ...]."""
    try:
        pieces = json.loads(value)
    except ValueError:
        return False
    return isinstance(pieces, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pieces
    )


def _provenance(value: str) -> bool:
    """An entity's `provenance`: {question id: {"authors": [id, ...], "threads": [id, ...]}}.
    A tag left out of an owner's would let a forget drop a tag another piece still holds."""
    try:
        data = json.loads(value)
    except ValueError:
        return False
    return isinstance(data, dict) and all(
        isinstance(owner, str) and owner and isinstance(tags, dict)
        and all(isinstance(tags.get(t), list) and all(isinstance(i, str) for i in tags[t])
                for t in TAGS)
        for owner, tags in data.items()
    )  # fmt: skip


def _id(value: Any, what: str) -> str:
    _need(
        isinstance(value, str) and 0 < len(value) <= MAX_ID, f"its {what} is missing or too long."
    )
    _need(not any(ord(c) < 32 for c in value), f"its {what} holds control characters.")
    return value


def _object(record: dict, name: str) -> dict:
    value = record.get(name)
    _need(isinstance(value, dict), f"its {name!r} must be a JSON object.")
    return value


def _shape(
    kind: type, leave: tuple[str, ...] = (), json_fields: tuple[str, ...] = ()
) -> dict[str, tuple[Any, bool]]:
    """A record type's fields: name -> (type, required). A field its store keeps as JSON, but a
    list its readers go through, may be any JSON value: the store writes whatever it was given
    (a tool's input is the model's JSON arguments, a list or a number as well as an object)."""
    hints = typing.get_type_hints(kind)
    return {
        f.name: (
            Any
            if f.name in json_fields and typing.get_origin(hints[f.name]) is not list
            else hints[f.name],
            f.default is MISSING and f.default_factory is MISSING,
        )
        for f in fields(kind)
        if f.name not in leave
    }


# what the stores read back: a message with a field its type lacks breaks every read of its
# thread (`Message.from_json`), a summary's time that is not a number its thread's summaries;
# a summary's or tool log's fields its type lacks are skipped by its store (and by the import:
# a version 1 export wrote them)
SHAPES = {
    "message": _shape(Message, leave=("duplicate",)),  # `duplicate` is never stored
    "summary": _shape(Summary, json_fields=SummaryStore.JSON_FIELDS),
    "tool_log": _shape(ToolLogEntry, json_fields=ToolLogStore.JSON_FIELDS),
}
STRICT = ("message",)  # the kinds whose unknown fields are refused, not dropped


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a record field's type (as the exporter writes it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return type(value) is int
    if hint is float:
        return _is_number(value)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value if args)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and (not args or _fits(v, args[1])) for k, v in value.items()
        )
    return False  # a type the format does not carry


def _said(hint: Any) -> str:
    """A field's type as the error says it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_said(h) for h in args)
    if origin is list:
        return f"a list of {_said(args[0]).removeprefix('a ')}s"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string",
             type(None): "null", Any: "any value"}  # fmt: skip
    return names.get(hint, "a JSON object" if origin is dict else str(hint))


def _typed(kind: str, item: dict) -> None:
    """The kind's record type's fields each of its type, the required ones there; no others
    in a message (a summary's or tool log's others are dropped as it is written)."""
    shape = SHAPES[kind]
    unknown = sorted(set(item) - set(shape)) if kind in STRICT else []
    listed = ", ".join(map(repr, unknown))
    _need(not unknown, f"its {kind} has fields a {kind} does not have: {listed}.")
    for name, (hint, required) in shape.items():
        if name not in item:
            _need(not required, f"its {kind} has no {name!r}.")
        else:
            _need(_fits(item[name], hint), f"its {kind}'s {name!r} must be {_said(hint)}.")


class Check:
    """Reads every record before anything is written: the header first, known kinds with their
    fields, threads declared before their messages and records, no id twice, the end line
    last."""

    def __init__(self, embedder: Any) -> None:
        self.model = (embedder.model_name, embedder.dims)
        self.header: dict | None = None
        self.reembed = False
        self.threads: set[str] = set()
        self.ids: dict[str, set[str]] = {}
        self.ended = False
        self.last = 0  # the last line's number
        self.tally: Counter[str] = Counter()  # records by kind's plural, as the end line counts
        self.said: tuple[int, dict] | None = None  # the end line: its number, its counts

    def line(self, number: int, record: Any) -> None:
        self.last = number
        try:
            self._record(record)
        except _Bad as bad:
            raise BadExportLine(number, str(bad)) from None
        except RecursionError:  # records handed over whole, nested thousands deep
            raise BadExportLine(number, "it is nested too deeply.") from None

    def done(self, whole: bool = True) -> None:
        """After the last line. `whole`: the records are a file's, which must end with its end
        line (since version 2): one without it was cut short, at a line's end."""
        if self.header is None:
            raise BadExportLine(1, "the file is empty.")
        if whole and self.header["version"] >= 2 and not self.ended:
            raise BadExportLine(
                self.last + 1,
                "the file looks cut short: an export ends with its end line "
                f'({{"kind": "{END}", ...}}), and this one has none. Export it again, or copy '
                "it whole.",
            )
        if self.said is not None and self.header["version"] >= 2:
            number, counts = self.said
            if {k: n for k, n in counts.items() if n} != +self.tally:
                raise BadExportLine(
                    number,
                    "its counts are not those of the lines before it: lines are missing from "
                    "the middle of the file (or were added). Export it again, or copy it whole.",
                )

    def _record(self, record: Any) -> None:
        _need(isinstance(record, dict), "it is not a JSON object.")
        kind = record.get("kind")
        if self.header is None:
            _need(
                kind == HEADER,
                f"this is not an ArxivScout export (its first line must be "
                f'the header, {{"kind": "{HEADER}", ...}}).',
            )
            version = record.get("version")
            _need(
                type(version) is int and version in READS,
                f"export version {version!r} cannot be read (this version reads "
                f"{' and '.join(map(str, READS))}).",
            )
            embeddings = record.get("embeddings") or {}
            self.reembed = (embeddings.get("model"), embeddings.get("dims")) != self.model
            self.header = record
            return
        _need(kind != HEADER, "a second header: two exports joined?")
        _need(kind in PLURALS or kind == END, f"unknown kind {kind!r}.")
        after_end = self.ended  # said once the line itself is checked (e.g. a thread twice)
        getattr(self, f"_{kind}")(record)
        _need(not after_end, "it comes after the export's end line: two exports joined?")
        if kind in PLURALS:
            self.tally[PLURALS[kind]] += 1
        else:
            self.said = (self.last, record.get("counts", {}))

    def _end(self, record: dict) -> None:
        _need(not self.ended, "a second end line: two exports joined?")
        counts = record.get("counts", {})
        _need(
            isinstance(counts, dict) and all(type(n) is int and n >= 0 for n in counts.values()),
            "its 'counts' must be an object of whole numbers.",
        )
        self.ended = True

    def _unique(self, kind: str, item_id: str) -> None:
        seen = self.ids.setdefault(kind, set())
        _need(item_id not in seen, f"the {kind} {item_id!r} appears twice.")
        seen.add(item_id)

    def _declared(self, record: dict) -> str:
        thread = record.get("thread")
        _need(thread in self.threads, f"its thread {thread!r} has no thread line before it.")
        return thread

    def _retention(self, record: dict) -> None:
        days = record.get("days")
        if days is not None:
            try:
                check_days(days)
            except InvalidRetention as exc:
                raise _Bad(str(exc)) from None
        self._unique("retention", "")

    def _thread(self, record: dict) -> None:
        try:
            thread = validate_thread(record.get("thread"))
        except InvalidName as exc:
            raise _Bad(str(exc)) from None
        _need(thread not in self.threads, f"the thread {thread!r} appears twice.")
        _need(_is_number(record.get("last_active")), "its 'last_active' must be a number.")
        summarized = record.get("summarized")
        _need(
            summarized is None or (type(summarized) is int and summarized >= 0),
            "its 'summarized' must be a count or null.",
        )
        _need(isinstance(record.get("channel", ""), str), "its 'channel' must be a string.")
        parent = record.get("parent")  # a Discord thread's channel (since version 2)
        snowflake = isinstance(parent, str) and parent.isascii() and parent.isdigit()
        _need(
            parent is None or (snowflake and len(parent) < 32),
            "its 'parent' must be a Discord channel id or null.",
        )
        person = record.get("dm_person")  # whose DM its place is (optional, since version 2)
        if person is not None:
            _id(person, "'dm_person' (a person's id)")
        self.threads.add(thread)

    def _message(self, record: dict) -> None:
        self._declared(record)
        message = _object(record, "message")
        self._unique("message", _id(message.get("id"), "message id"))
        _need(
            message.get("role") in ConversationStore.ROLES,
            f"its role is not one of {', '.join(ConversationStore.ROLES)}.",
        )
        _need(isinstance(message.get("content"), str), "its content must be a string.")
        _need(_is_number(message.get("timestamp")), "its timestamp must be a number.")
        _typed("message", message)

    def _thread_record(self, kind: str, record: dict) -> None:
        """A summary or tool log of a declared thread, that thread's (its `thread_id`): the
        import lists it in the record's thread's index, and an import replacing it later
        unlists it from its stored `thread_id`'s (memory/portability_write.py)."""
        thread = self._declared(record)
        _need(
            record.get("listed") is None or _is_number(record.get("listed")),
            "its 'listed' must be a number or null.",
        )
        self._unique(kind, _id(_object(record, kind).get("id"), f"{kind} id"))
        _typed(kind, record[kind])
        _need(record[kind]["thread_id"] == thread, f"its {kind} belongs to another thread.")

    def _summary(self, record: dict) -> None:
        self._thread_record("summary", record)

    def _tool_log(self, record: dict) -> None:
        self._thread_record("tool_log", record)

    def _paper(self, record: dict) -> None:
        paper = _object(record, "paper")
        self._unique("paper", _id(paper.get("arxiv_id"), "arxiv_id"))
        _need(type(paper.get("chunks", 0)) is int, "its chunk count must be a whole number.")

    def _vector_record(self, kind: str, record: dict) -> None:
        self._unique(kind, _id(record.get("id"), "id"))
        values = _object(record, "fields")
        _need(all(isinstance(v, str) for v in values.values()), "its fields must be strings.")
        vector = record.get("vector")
        _need(isinstance(vector, str), "its vector must be base64 text.")
        if not self.reembed:
            try:
                size = len(base64.b64decode(vector, validate=True))
            except (binascii.Error, ValueError):
                raise _Bad("its vector is not base64.") from None
            _need(size == 4 * self.model[1], f"its vector does not have {self.model[1]} floats.")

    def _chunk(self, record: dict) -> None:
        self._vector_record("chunk", record)

    def _entity(self, record: dict) -> None:
        self._vector_record("entity", record)
        pieces = record["fields"].get(PIECES)
        if pieces is not None:
            _need(_pieces(pieces), "its pieces must be a JSON list of [question id, text] pairs.")
        provenance = record["fields"].get(PROVENANCE)
        if provenance is not None:
            _need(_provenance(provenance), "its provenance must be a JSON object of question id: "
                  '{"authors": [ids], "threads": [ids]}.')  # fmt: skip

    def _workflow(self, record: dict) -> None:
        self._vector_record("workflow", record)

    def _watch(self, record: dict) -> None:
        """A topic watch (memory/stores/watches.py) with its schedule and the papers its digests
        posted; it is written into the importing tenant, under its own id."""
        watch = _object(record, "watch")
        watch_id = _id(watch.get("id"), "watch id")
        _need(
            not any(c in watch_id for c in ":{}| "), "its watch id holds one of : { } | or a space."
        )
        self._unique("watch", watch_id)
        for name in WATCH_TEXTS:
            _need(isinstance(watch.get(name, ""), str), f"its watch's {name!r} must be a string.")
        _need(
            watch.get("platform") in WATCH_PLATFORMS and watch.get("channel"),
            f"its watch needs a platform ({', '.join(WATCH_PLATFORMS)}) and a channel.",
        )
        period = watch.get("period")
        _need(
            type(period) is int and period >= MIN_PERIOD,
            f"its watch's period must be a whole number of seconds, at least {MIN_PERIOD}.",
        )
        for name in ("categories", "authors"):
            values = watch.get(name, [])
            _need(
                isinstance(values, list) and all(isinstance(v, str) for v in values),
                f"its watch's {name!r} must be a list of strings.",
            )
        _need(
            bool(watch.get("query") or watch.get("categories") or watch.get("authors")),
            "its watch needs a topic, a category or an author.",
        )
        for name in WATCH_TIMES:
            _need(_is_number(watch.get(name, 0)), f"its watch's {name!r} must be a number.")
        for name in ("next_due", "failures"):
            value = watch.get(name, 0)
            _need(
                type(value) is int and value >= 0,
                f"its watch's {name!r} must be a whole number.",
            )
        posted = record.get("posted", {})
        _need(
            isinstance(posted, dict) and all(_is_number(at) for at in posted.values()),
            "its 'posted' must be an object of arXiv ids and times.",
        )

    def _turn(self, record: dict) -> None:
        """A turn record (memory/stores/turn_records.py) of a declared thread, with its
        feedback."""
        thread = self._declared(record)
        turn = _object(record, "turn")
        self._unique("turn", _id(turn.get("id"), "turn id"))
        _need(turn.get("thread", thread) == thread, "its turn belongs to another thread.")
        for name in ("question", "answer"):
            _need(isinstance(turn.get(name), str), f"its {name} must be a string.")
        for name in TURN_TEXTS:  # each indexed or compared as text (`turns_by_key`: the asker)
            _need(isinstance(turn.get(name, ""), str), f"its turn's {name!r} must be a string.")
        _need(_is_number(turn.get("created_at")), "its 'created_at' must be a number.")
        usage = turn.get("usage", {})
        _need(
            isinstance(usage, dict) and all(type(v) is int for v in usage.values()),
            "its usage must be an object of whole numbers.",
        )
        votes = turn.get("feedback", [])
        _need(isinstance(votes, list), "its feedback must be a list.")
        for vote in votes:
            _need(
                isinstance(vote, dict) and isinstance(vote.get("user"), str) and vote["user"]
                and vote.get("rating") in (1, -1) and _is_number(vote.get("at", 0)),
                "a vote of its feedback needs a user, a rating of 1 or -1 and a time.",
            )  # fmt: skip
            _need(
                set(vote) <= {"user", "rating", "name", "comment", "reasons", "at"},
                "a vote of its feedback has unknown fields.",
            )
