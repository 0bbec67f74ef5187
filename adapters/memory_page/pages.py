"""The memory page's pages and forms: server-rendered HTML (Jinja2, autoescaped, no script).

Each handler reads the `Viewer` and the CSRF token that the access middleware put on the
request (`server.py`), asks `memory.browse` for what that person may see, and shows it; forms
call `memory.governance` and `memory.portability`, then redirect back with a message that the
guard keeps in the session for the next page (`server.Flashed`), never in the address. An
export's stream and an import's upload are transfer.py's; who may is checked here.
A Forget button leads to a page that shows what would be forgotten (`GET /memory/forget/confirm`),
whose form posts the erasure: nothing is erased by one stray click, and no script is needed.
Who may do what: anyone sees what `Viewer.can_see` allows and may export a thread they see
(its turns with the rating and their own vote only), forget their own messages, the threads,
summaries and tool logs of their own DMs, the PDFs they shared in a private channel or a DM,
and everything about themselves; everything else that changes or exports the tenant is for
whoever manages it (`Viewer.manages`: an admin, or the owner of a Discord DM's memory), but an
import, which is an admin's alone (403). An id the viewer may not see, or of another tenant, is
a 404, like a missing one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web
from jinja2 import Environment, FileSystemLoader
from yarl import URL

from adapters.memory_page.server import FLASH, IMPORT_PATH, Flashed
from adapters.memory_page.transfer import (
    ImportFailed,
    filename,
    import_upload,
    stream_export,
    visible,
)
from adapters.memory_page.viewer import CSRF, VIEWER, Viewer
from memory.browse import PAGE_SIZE, Listing
from memory.governance import Busy, ImportRunning, NotFound
from memory.keys import InvalidName
from memory.manager import MemoryManager
from memory.scope import PUBLIC
from memory.stores.entity import MAX_DESCRIPTION, EntityChanging

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).with_name("templates")
PER_PAGE = 50  # threads, entities or workflows listed on one page
TURNS_SHOWN = 100  # of a thread's turns, newest first, in its usage table
SHOWN_CHARS = 20_000  # of one message or tool output; the export holds the rest
MAX_RETENTION_DAYS = 36_500
ADMIN_KINDS = ("entity", "workflow")
KINDS = ("message", "thread", "summary", "tool_log", "paper", *ADMIN_KINDS)
EDIT_REFUSED = 422  # an edit not saved: its page shows why, and the text typed to mend it
SHARES_TAKEN = (  # a sharer forgot a private PDF others shared too (`sharer_forgets`)
    "Your shares of this PDF were taken back. It stays in the knowledge base for the others "
    "who shared it."
)
NOUNS = {  # how a count of each kind of thing is said, one and many (erasures, imports, pages)
    "messages": ("message", "messages"), "threads": ("thread", "threads"),
    "summaries": ("summary", "summaries"), "tool_logs": ("tool log", "tool logs"),
    "episodes": ("search entry", "search entries"), "entities": ("entity", "entities"),
    "workflows": ("workflow", "workflows"), "papers": ("paper", "papers"),
    "chunks": ("passage", "passages"), "passages": ("passage", "passages"),
    "shares": ("share of a PDF that stays", "shares of PDFs that stay"),
    "cached_embeddings": ("cached embedding", "cached embeddings"),
    "retention": ("retention setting", "retention settings"),
    "re-embedded": ("vector made again", "vectors made again"),
    "watches": ("watch", "watches"), "votes": ("vote", "votes"),
    "paused_watch_imports": ("watch imported paused", "watches imported paused"),
    "dropped_watch_imports": ("watch left out (not a channel of this team)",
                              "watches left out (not channels of this team)"),
}  # fmt: skip


class Missing(Exception):
    """Answered 404: unknown, of another tenant, or not for this viewer to see."""


class Refused(Exception):
    """Answered 403: the viewer may see it but not do this."""


Handler = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]


def page(handler: Handler) -> Handler:
    """Turn the handler's Missing / Refused (and the stores' unknown ids) into error pages."""

    @functools.wraps(handler)
    async def run(self: Pages, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except (Missing, NotFound, InvalidName):
            return self.render(request, "error.html", status=404, title="Not found",
                               message="There is nothing here that you may see.")  # fmt: skip
        except Refused:
            return self.render(request, "error.html", status=403, title="Not allowed",
                               message="Only an admin of this workspace, or the person it "
                               "is about, may do that.")  # fmt: skip
        except ImportRunning:
            return self.render(request, "error.html", status=503, title="Try again later",
                               message="A memory import is running in this workspace. Nothing "
                               "was changed; try again when it has finished.")  # fmt: skip
        except Busy:
            return self.render(request, "error.html", status=503, title="Try again shortly",
                               message="Another erasure is still running in this workspace's "
                               "memory. Nothing was changed; try again in a minute.")  # fmt: skip

    return run


def own_dm(viewer: Viewer, audience: str) -> bool:
    """A direct message between this person and the bot."""
    return audience.startswith("dm:") and audience in viewer.audiences


def may_forget_message(viewer: Viewer, message: Any) -> bool:
    mine = bool(message.author) and message.author == viewer.user
    return viewer.manages or mine or own_dm(viewer, message.audience)


def may_forget_record(viewer: Viewer, audience: str) -> bool:
    """A thread, summary or tool log: whoever manages the tenant's, or the viewer's own DM's."""
    return viewer.manages or own_dm(viewer, audience)


def may_forget_paper(viewer: Viewer, paper: Any) -> bool:
    """A paper: whoever manages the tenant's (its admin, or a Discord DM's owner:
    `Viewer.manages`); a PDF shared in a private channel or a DM, each of its sharers too,
    their own shares (`sharer_forgets`; the team's copies and papers from arXiv are the whole
    team's: theirs who manage it to forget)."""
    return viewer.manages or sharer_forgets(viewer, paper)


def sharer_forgets(viewer: Viewer, paper: Any) -> bool:
    """The viewer, who does not manage the tenant, shared this private PDF (one of its shares,
    not only the first): forgetting it takes back their shares (`Governance.forget_shares`),
    and the copy goes with its last share; one another person shared too stays for them."""
    shared_privately = paper.shared_pdf and paper.audience != PUBLIC
    return not viewer.manages and shared_privately and bool(paper.origins_of(viewer.user))


def when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def place(audience: str | None) -> str:
    """Where an item was learned, in words."""
    audience = audience or PUBLIC
    kind, _, where = audience.partition(":")
    return {"public": "public", "private": f"private channel {where}", "dm": "direct message"}.get(
        kind, audience
    )


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit:,} more characters: export the thread for all)"


def thread_url(thread: str, page_number: int | None = None) -> str:
    url = f"/memory/threads/{quote(thread, safe='')}"
    return url if page_number is None else f"{url}?page={page_number}"


def counted(n: int, what: str) -> str:
    """`n` things in words: "1 entity", "2 summaries", "1 tool log". `what` is a key of NOUNS
    (an erasure's or an import's count), or a noun, singular or plural."""
    one, many = NOUNS.get(what) or next(
        ((o, m) for o, m in NOUNS.values() if what in (o, m)), _forms(what.replace("_", " "))
    )
    return f"{n:,} {one if n == 1 else many}"


def _forms(noun: str) -> tuple[str, str]:
    """One and many of a noun NOUNS does not know (regular English plurals)."""
    if noun.endswith("ies"):
        return noun[:-3] + "y", noun
    if noun.endswith("s"):
        return noun[:-1], noun
    return noun, noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def listed(counts: Iterable[tuple[str, int]]) -> str:
    """Counts in words, joined: "1 message, 2 summaries"; "" when all are naught."""
    return ", ".join(counted(n, what) for what, n in counts if n)


def erased(erasure: Any) -> str:
    """What a forget removed, in words."""
    if not dataclasses.is_dataclass(erasure):
        return "Forgotten."
    counts = listed(dataclasses.asdict(erasure).items())
    return f"Forgotten: {counts}." if counts else "Nothing was left to forget."


@dataclass(frozen=True)
class Paging:
    """Which page of a list (threads, entities, workflows) is shown: `?page=`, 1-based, held to
    the pages there are, `PER_PAGE` a page. The templates' `ui.pager` links its neighbours."""

    number: int
    pages: int
    total: int  # how many the viewer may see in all

    @classmethod
    def of(cls, request: web.Request, total: int) -> Paging:
        pages = max(1, math.ceil(total / PER_PAGE))
        return cls(min(max(1, _int(request.query.get("page"), 1)), pages), pages, total)

    @property
    def start(self) -> int:
        """The position of the page's first item in the whole list."""
        return (self.number - 1) * PER_PAGE


def safe_back(value: str | None, default: str) -> str:
    """A path of the memory page to return to (never another site)."""
    value = (value or "").strip()
    if re.match(r"^/memory(/|\?|$)", value) and "\\" not in value and "//" not in value:
        return value
    return default


@dataclass
class Target:
    """What a forget names, checked: it exists in the viewer's tenant, they may see it and
    forget it. `item` is what the confirmation page shows; `after` where the erasure returns."""

    kind: str
    id: str
    thread: str
    item: Any
    after: str


# The most characters of a workflow's text its edit form sends, so the form stays under
# `server.FORM_BYTES` (1 MB: beyond it the form cannot be read, and what was typed is lost on a
# 413) whatever the characters: percent-encoded, a character is at most 12 bytes (4 in UTF-8;
# a line break is sent as CRLF, 6), 960,000 bytes in all, leaving 88 KB for the CSRF token, the
# id and the page to return to. A browser's `maxlength` counts UTF-16 units, never fewer than
# characters, so a browser never sends more. The bot writes a question, its tool steps and a
# 500-character outcome: far less (a workflow stored longer: `EditForm.allowed`).
WORKFLOW_TEXT_LIMIT = 80_000


def utf16_units(text: str) -> int:
    """A text's length as a browser's `maxlength` counts it."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class EditForm:
    """An admin's edit form of one kind: the field it changes, and the most characters that
    field may hold (None: only the form's 1 MB, `server.FORM_BYTES`), its `maxlength` too.
    `path`: the kind's list, where its forms post (`path/edit`) and return by default (a kind's
    name plus "s" is no path: "entitys"). `rewrites_unchanged`: a save of the text as stored
    still writes it (an entity's description then is a person's: no question owns it); else
    it writes nothing, and the record stays as it was (a workflow's text, steps and vector).
    `longer_kept`: a text another path stored over the limit may be saved that long (`allowed`);
    else the limit is the store's own."""

    field: str
    limit: int | None
    rows: int
    path: str
    rewrites_unchanged: bool = True
    longer_kept: bool = False

    def allowed(self, stored: str) -> int | None:
        """The most characters a save may hold: the limit; for a workflow another path wrote
        longer (the bot, an import), its own length, so it opens whole and is saved as it is
        or shorter, never longer (`longer_kept`)."""
        if self.limit is None:
            return None
        held = len(typed(stored))
        return held if held > self.limit and self.longer_kept else self.limit

    def maxlength(self, stored: str) -> int | None:
        """The field's `maxlength`: the limit, or the stored text's length in UTF-16 units as
        a browser counts when that is more (characters outside the BMP count twice there, once
        in the store), so a text the store holds is never one the browser will not send. A
        longer text typed there still meets `allowed`, counted in characters: the 422 page."""
        return None if self.limit is None else max(self.limit, utf16_units(typed(stored)))


EDITS = {  # the store's own limit, so the browser stops what the store would refuse
    "entity": EditForm("description", MAX_DESCRIPTION, 4, path="/memory/entities"),
    "workflow": EditForm(
        "text",
        WORKFLOW_TEXT_LIMIT,
        8,
        path="/memory/workflows",
        rewrites_unchanged=False,
        longer_kept=True,
    ),
}


def typed(text: str) -> str:
    """A textarea's text as its page held it: a form sends each line break as CRLF, but the
    browser's `maxlength` counted it as one character (and that is how it is stored)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def too_long(field: str, limit: int, text: str) -> str:
    return (f"The {field} may be at most {limit:,} characters; this one has "
            f"{len(text):,}. Shorten it and save again.")  # fmt: skip


class Pages:
    def __init__(self, memory: MemoryManager) -> None:
        self.memory = memory
        self.browse = memory.browse
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
            lstrip_blocks=True,
        )  # fmt: skip
        self.env.filters.update(when=when, place=place, shown=shown, counted=counted)
        self.env.globals.update(
            thread_url=thread_url, quote=lambda s: quote(s, safe=""),
            page_of=lambda seq: seq // PAGE_SIZE + 1,
            may_forget_message=may_forget_message, may_forget_record=may_forget_record,
            may_forget_paper=may_forget_paper, edits=EDITS,
        )  # fmt: skip

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self, request: web.Request, template: str, status: int = 200, **values: Any
    ) -> web.Response:
        """`values` may name `here` (the page a form returns to) or `error` themselves."""
        flash = request.get(FLASH) or {}
        shown_values = {
            "viewer": request.get(VIEWER), "csrf": request.get(CSRF, ""),
            "here": str(request.rel_url), "done": flash.get("done", ""),
            "error": flash.get("error", ""), **values,
        }  # fmt: skip
        html = self.env.get_template(template).render(**shown_values)
        return web.Response(text=html, status=status, content_type="text/html")

    @staticmethod
    def viewer(request: web.Request) -> Viewer:
        return request[VIEWER]

    @staticmethod
    def seen(viewer: Viewer) -> frozenset[str] | None:
        """What browse reads for this viewer: everything for whoever manages the tenant."""
        return None if viewer.manages else viewer.audiences

    @staticmethod
    def back(form: Any, default: str, **flash: str) -> Flashed:
        """Back to the form's page, with `done=` or `error=` for it to show once."""
        target = URL(safe_back(form.get("back"), default), encoded=True)  # ids stay quoted
        return Flashed(str(target), **flash)

    # -- pages ---------------------------------------------------------------------------------

    @page
    async def overview(self, request: web.Request) -> web.StreamResponse:
        v = self.viewer(request)
        threads = await self.browse.threads(v.tenant, self.seen(v))
        threads = [t for t in threads if v.can_see(t.audience)]
        paging = Paging.of(request, len(threads))
        shown_threads = threads[paging.start : paging.start + PER_PAGE]
        days = await self.memory.retention.get(v.tenant) if v.manages else None
        usage = await self.memory.turn_records.usage(v.tenant) if v.manages else None
        return self.render(
            request, "overview.html", threads=shown_threads, paging=paging, retention_days=days,
            usage=usage,
        )  # fmt: skip

    @page
    async def thread(self, request: web.Request) -> web.StreamResponse:
        v = self.viewer(request)
        number = _int(request.query.get("page"), None)
        found = await self.browse.thread(
            v.tenant, request.match_info["thread"], self.seen(v), number
        )
        if found is None or not v.can_see(found.thread.audience):
            raise Missing
        return self.render(
            request, "thread.html", t=found.thread, view=found,
            summaries=[s for s in found.summaries if v.can_see(s.audience)],
            tool_logs=[e for e in found.tool_logs if v.can_see(e.audience)],
            usage=await self.memory.turn_records.usage(v.tenant, found.thread.id),
            turns=[r for r in await self.memory.turn_records.of_thread(
                v.tenant, found.thread.id, TURNS_SHOWN) if v.can_see(r.audience)],
        )  # fmt: skip

    @page
    async def papers(self, request: web.Request) -> web.StreamResponse:
        v = self.viewer(request)
        listed = await self.browse.papers(v.tenant, self.seen(v))
        papers = [p for p in listed if v.can_see(p.audience)]
        return self.render(request, "papers.html", papers=papers)

    @page
    async def paper(self, request: web.Request) -> web.StreamResponse:
        v = self.viewer(request)
        found = await self.browse.paper(v.tenant, request.match_info["arxiv_id"])
        if found is None or not v.can_see(found[0].audience):
            raise Missing
        return self.render(request, "paper.html", paper=found[0], passages=found[1])

    @page
    async def workflows(self, request: web.Request) -> web.StreamResponse:
        return await self._learned(request, self.browse.workflow_listing, "workflows")

    @page
    async def entities(self, request: web.Request) -> web.StreamResponse:
        return await self._learned(request, self.browse.entity_listing, "entities")

    async def _learned(
        self, request: web.Request, read: Callable[..., Awaitable[Listing[Any]]], kind: str
    ) -> web.StreamResponse:
        """A page of the workflows or entities the viewer may see, with who they were learned
        from. They are counted first (no item read), so `?page=` past the end shows the last."""
        v = self.viewer(request)
        paging = Paging.of(request, (await read(v.tenant, self.seen(v), 0)).total)
        listing = await read(v.tenant, self.seen(v), PER_PAGE, paging.start)
        found = [x for x in listing.items if v.can_see(x.audience)]
        names = await self.names(v, (a for x in found for a in x.authors))
        return self.render(request, f"{kind}.html", names=names, paging=paging, **{kind: found})

    async def names(self, v: Viewer, users: Iterable[str]) -> dict[str, str]:
        """Display names of user ids (provenance), the viewer's own from their sign-in."""
        names = await self.browse.names(v.tenant, users)
        if v.name:
            names.setdefault(v.user, v.name)
        return names

    @page
    async def search(self, request: web.Request) -> web.StreamResponse:
        v = self.viewer(request)
        query = request.query.get("q", "").strip()[:500]
        results = await self.browse.search(v.tenant, query, self.seen(v))
        return self.render(
            request, "search.html", q=query, searching=True,
            messages=[m for m in results.messages if v.can_see(m.audience)],
            passages=[p for p in results.passages if v.can_see(p.audience)],
        )  # fmt: skip

    # -- forms ---------------------------------------------------------------------------------

    async def target(self, v: Viewer, kind: str, item: str, thread: str) -> Target:
        """The forget's target, checked (Missing: 404, Refused: 403), for the confirmation page
        and the erasure alike."""
        if kind not in KINDS or not (item or thread):
            raise Missing
        if kind in ADMIN_KINDS and not v.manages:
            raise Refused
        seen = self.seen(v)
        if kind == "message":
            message = await self.browse.message(v.tenant, thread, item, seen)
            if message is None or not v.can_see(message.audience):
                raise Missing
            if not may_forget_message(v, message):
                raise Refused
            return Target(kind, item, thread, message, thread_url(thread))
        if kind == "thread":
            thread = thread or item
            info = await self.browse.thread_info(v.tenant, thread)
            if info is None or not v.can_see(info.audience):
                raise Missing
            if not may_forget_record(v, info.audience):
                raise Refused
            return Target(kind, thread, thread, info, "/memory")  # its page is gone
        if kind in ("summary", "tool_log"):
            read = self.browse.summary if kind == "summary" else self.browse.tool_log
            record = await read(v.tenant, item, seen)
            if record is None or not v.can_see(record.audience):
                raise Missing
            if not may_forget_record(v, record.audience):
                raise Refused
            return Target(kind, item, record.thread_id, record, thread_url(record.thread_id))
        if kind == "paper":
            paper = await self.browse.paper_info(v.tenant, item)
            if paper is None or not v.can_see(paper.audience):
                raise Missing
            if not may_forget_paper(v, paper):
                raise Refused
            return Target(kind, paper.arxiv_id, "", paper, "/memory/papers")
        if kind == "entity":
            found: Any = await self.browse.entity(v.tenant, item, seen)
        else:
            found = await self.browse.workflow(v.tenant, item, seen)
        if found is None or not v.can_see(found.audience):
            raise Missing
        return Target(kind, item, "", found, EDITS[kind].path)

    @page
    async def confirm_forget(self, request: web.Request) -> web.StreamResponse:
        """What a Forget button would erase, and the form that erases it."""
        v, query = self.viewer(request), request.query
        target = await self.target(
            v, query.get("kind", ""), query.get("id", "").strip(), query.get("thread", "").strip()
        )
        authors = getattr(target.item, "authors", None) or []
        names = await self.names(v, authors) if authors else {}
        back = safe_back(query.get("back"), target.after)
        return self.render(
            request, "confirm.html", target=target, x=target.item, back=back, names=names,
            after=target.after if target.kind in ("thread", "paper") else back,
        )  # fmt: skip

    @page
    async def forget(self, request: web.Request) -> web.StreamResponse:
        v, form = self.viewer(request), await request.post()
        target = await self.target(
            v, str(form.get("kind", "")), str(form.get("id", "")).strip(),
            str(form.get("thread", "")).strip(),
        )  # fmt: skip
        governance, kind, item = self.memory.governance, target.kind, target.id
        if kind == "paper" and sharer_forgets(v, target.item):
            erasure = await governance.forget_shares(v.tenant, target.item.origins_of(v.user))
            kept = await self.browse.paper_info(v.tenant, item) is not None
            raise self.back({}, target.after, done=SHARES_TAKEN if kept else erased(erasure))
        if kind == "message":
            erasure = await governance.forget_message(v.tenant, target.thread, item)
        elif kind == "thread":
            erasure = await governance.forget_thread(v.tenant, target.thread)
        else:
            forget = {"summary": governance.forget_summary,
                      "tool_log": governance.forget_tool_log, "paper": governance.forget_paper,
                      "entity": governance.forget_entity,
                      "workflow": governance.forget_workflow}[kind]  # fmt: skip
            erasure = await forget(v.tenant, item)
        if kind in ("thread", "paper"):  # its page is gone
            raise self.back({}, target.after, done=erased(erasure))
        raise self.back(form, target.after, done=erased(erasure))

    @page
    async def edit_entity(self, request: web.Request) -> web.StreamResponse:
        return await self._edit(request, "entity", "description")

    @page
    async def edit_workflow(self, request: web.Request) -> web.StreamResponse:
        return await self._edit(request, "workflow", "text")

    async def _edit(self, request: web.Request, kind: str, field: str) -> web.StreamResponse:
        v, form = self.viewer(request), await request.post()
        if not v.manages:
            raise Refused
        item, value = str(form.get("id", "")), typed(str(form.get(field, ""))).strip()
        edits = EDITS[kind]
        if not value:
            raise self.back(form, edits.path, error=f"The {field} must not be empty.")
        stored = getattr(await self._editing(v, kind, item), field)
        if not edits.rewrites_unchanged and value == typed(stored).strip():
            raise self.back(form, edits.path, done=f"The {kind} is unchanged.")
        # counted as the store counts (characters); the field's `maxlength` (UTF-16 units) is
        # an approximation of it both ways (`EditForm.maxlength`): a longer text is refused here
        limit = edits.allowed(stored)
        if limit is not None and len(value) > limit:
            return await self._kept(request, form, kind, item, value, too_long(field, limit, value))
        governance = self.memory.governance
        edit = governance.edit_entity if kind == "entity" else governance.edit_workflow
        try:
            await edit(v.tenant, item, value)
        except (ValueError, EntityChanging) as exc:  # refused or crossed: say why, keep the text
            return await self._kept(request, form, kind, item, value, str(exc))
        raise self.back(form, edits.path, done=f"The {kind} was saved.")

    async def _editing(self, v: Viewer, kind: str, item: str) -> Any:
        """The entity or workflow an edit changes, as stored; Missing when there is none."""
        read = self.browse.entity if kind == "entity" else self.browse.workflow
        found = await read(v.tenant, item, self.seen(v))
        if found is None:
            raise Missing
        return found

    async def _kept(
        self, request: web.Request, form: Any, kind: str, item: str, value: str, error: str
    ) -> web.Response:
        """An edit refused: its form again, with why and the text as typed, to mend and save
        (a redirect back to the list would show the old text: what was typed would be lost).
        Its `back` stays the list's, where a save then returns. Missing when the item was
        forgotten meanwhile: nothing to edit."""
        found = await self._editing(self.viewer(request), kind, item)
        back = safe_back(form.get("back"), EDITS[kind].path)
        return self.render(
            request, "edit.html", status=EDIT_REFUSED, here=back, error=error, kind=kind,
            form=EDITS[kind], item=found, text=value,
        )  # fmt: skip

    @page
    async def export(self, request: web.Request) -> web.StreamResponse:
        v, thread = self.viewer(request), request.query.get("thread", "")
        if thread:
            audience = await self.browse.thread_audience(v.tenant, thread)
            if audience is None or not v.can_see(audience):
                raise Missing
            portability, name = self.memory.portability, filename(v.tenant, thread)
            records = visible(portability.export_thread(v.tenant, thread), v)
        elif not v.manages:
            raise Refused
        else:
            records, name = self.memory.portability.export_tenant(v.tenant), filename(v.tenant)
        return await stream_export(request, records, name)

    @page
    async def import_file(self, request: web.Request) -> web.StreamResponse:
        """An admin's only (a DM's owner too is refused): an import writes into the shared
        Redis and embeds every message, on the process that serves Slack's events too."""
        v = self.viewer(request)
        if not v.admin:
            raise Refused
        form: dict[str, str] = {}
        try:
            counts = await import_upload(request, form, self.memory.portability, v.tenant)
        except ImportFailed as exc:
            raise self.back(form, "/memory", error=str(exc)) from None
        made = listed(counts.items()) or "nothing"
        raise self.back(form, "/memory", done=f"Imported {made}.")

    @page
    async def retention(self, request: web.Request) -> web.StreamResponse:
        v, form = self.viewer(request), await request.post()
        if not v.manages:
            raise Refused
        raw = str(form.get("days", "")).strip()
        days = _int(raw, -1) if raw else None
        if days is not None and not 1 <= days <= MAX_RETENTION_DAYS:
            raise self.back(
                form, "/memory", error=f"Give a whole number of days, 1 to {MAX_RETENTION_DAYS}, "
                "or leave it empty to keep conversation memory for ever."
            )  # fmt: skip
        try:
            await self.memory.retention.set(v.tenant, days)
        except ValueError as exc:  # refused by the store: say why
            raise self.back(form, "/memory", error=str(exc)) from None
        done = f"Conversation memory is kept {days} days." if days else "Kept for ever."
        raise self.back(form, "/memory", done=done)

    @page
    async def forget_person(self, request: web.Request) -> web.StreamResponse:
        v, form = self.viewer(request), await request.post()
        user = str(form.get("user", "")).strip() or v.user
        if user != v.user and not v.manages:
            raise Refused
        if not form.get("confirm"):
            raise self.back(form, "/memory", error="Tick the box to confirm, then forget.")
        who = "you" if user == v.user else (await self.names(v, [user])).get(user, user)
        try:
            erasure = await self.memory.governance.forget_person(v.tenant, user)
        except NotFound:
            raise self.back(form, "/memory", done=f"Nothing about {who} is remembered.") from None
        counts = listed(dataclasses.asdict(erasure).items()) or "nothing was left"
        raise self.back(form, "/memory", done=f"Forgot everything about {who}: {counts}.")


def _int(value: str | None, default: Any) -> Any:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def page_routes(memory: MemoryManager) -> list[web.RouteDef]:
    """Every page and form of `/memory` (the access middleware guards them all)."""
    p = Pages(memory)
    return [
        web.get("/memory", p.overview),
        web.get("/memory/threads/{thread:.+}", p.thread),
        web.get("/memory/papers", p.papers),
        web.get("/memory/papers/{arxiv_id:.+}", p.paper),
        web.get("/memory/workflows", p.workflows),
        web.get("/memory/entities", p.entities),
        web.get("/memory/search", p.search),
        web.get("/memory/export", p.export),
        web.get("/memory/forget/confirm", p.confirm_forget),
        web.post("/memory/forget", p.forget),
        web.post("/memory/entities/edit", p.edit_entity),
        web.post("/memory/workflows/edit", p.edit_workflow),
        web.post(IMPORT_PATH, p.import_file),
        web.post("/memory/retention", p.retention),
        web.post("/memory/people/forget", p.forget_person),
    ]
