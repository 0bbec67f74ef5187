"""`/watch …` and chat watch commands: make, list, pause, resume or remove a watch.

Every command answers with a text to show (a malformed one with the usage), never raises for a
person's mistake. Only the place a watch posts to may remove, pause or resume it, or a tenant's
admin from anywhere (the adapter says who is one: `AdminCheck`, asked only when the watch is
not here); a watch is made or resumed only where this process's poster says it can post (the
bot is in the channel, and the channel is of the watch's tenant: `can_post(place, tenant=…)`),
its answer then adding what the poster says to grant there (`PlaceNotes`: Discord's Read
Message History; best effort, bounded by NOTE_SECONDS: the watch is made or resumed whatever
the note's lookup does). An answer about one watch is fitted to what the asking platform
shows (`FitsAnswers`: Discord's 2,000 characters). A watch of another platform than this
process posts to is not resumed from here (no poster to check its channel).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from bot.watch_places import (
    TERMINAL,
    FitsAnswers,
    FitsList,
    HomePlaces,
    PlaceNotes,
    PlaceUnknown,
    Poster,
    WatchPlace,
    place_of,
)
from bot.watch_texts import (
    RESERVED,
    USAGE,
    WatchRequest,
    chat_command,
    created_text,
    describe,
    parse_watch,
    utc_minute,
    watch_id_of,
)
from memory.scope import Scope
from memory.shorten import shortened
from memory.stores.watches import (
    InvalidWatch,
    Watch,
    WatchStore,
    remake,
    remove_advice,
    unsearchable,
)

log = logging.getLogger(__name__)

AdminCheck = Callable[[], Awaitable[bool]]  # is the person asking an admin of the tenant?
NO_POSTER = (
    "I cannot check this watch's {platform} channel from here, so it stays paused: resume it "
    "from {platform}, where it posts."
)
NOTE_SECONDS = 1.0  # a poster's note (`PlaceNotes`) is looked up within the answer's window
ID_SHOWN = 60  # of an id typed that names no watch, what the answer echoes
REASON_LISTED = 64  # of a paused watch's reason (Discord's error text), what its list line shows


class AdminUnknown(Exception):
    """An `AdminCheck` could not tell (the platform did not answer in time): said as is."""


class WatchCommands:
    """The watch commands of one process (its posters are those the adapters attached)."""

    def __init__(
        self, store: WatchStore, posters: dict[str, Poster], now: Callable[[], float]
    ) -> None:
        self.store = store
        self.posters = posters  # shared with the service: `attach` adds to it
        self.now = now

    async def create(
        self, scope: Scope, text: str | WatchRequest, place: WatchPlace | None,
        watch_id: str = "",
    ) -> Watch:  # fmt: skip
        """A watch posting to `place`, from a command's text or a request already read from
        a form's fields (Discord's `/watch add`: its topic never re-read for a period);
        InvalidWatch when the request is malformed or this process's poster says it cannot
        post there (the bot is not in the channel)."""
        request = parse_watch(text) if isinstance(text, str) else text
        place = place or TERMINAL
        poster = self.posters.get(place.platform)
        if poster is not None and (why := await poster.can_post(place, tenant=scope.tenant)):
            raise InvalidWatch(why)
        return await self.store.create(
            scope, request.query, request.period, platform=place.platform,
            channel=place.channel, thread=place.thread, categories=request.categories,
            authors=request.authors, now=self.now(), watch_id=watch_id,
        )  # fmt: skip

    async def command(
        self, scope: Scope, text: str, place: WatchPlace | None, watch_id: str = "",
        admin: AdminCheck | None = None,
    ) -> str:  # fmt: skip
        """`/watch …` (or a chat watch command): make, list, pause, resume or remove; the
        answer to show. A reserved word never makes a watch; misused, it answers the usage.
        `admin`: whether the person may remove, pause or resume a watch of another place."""
        words = text.split()
        verb = words[0].lower() if words else ""
        try:
            if verb in ("", "help"):
                return USAGE
            if verb in RESERVED:
                return await self._verb(scope, verb, words[1:], place, admin)
            watch = await self.create(scope, text, place, watch_id)
        except (InvalidWatch, AdminUnknown) as exc:
            return str(exc)
        return created_text(watch, elsewhere=bool(place and place.asked)) + await self._note(watch)

    async def _verb(
        self, scope: Scope, verb: str, rest: list[str], place: WatchPlace | None,
        admin: AdminCheck | None,
    ) -> str:  # fmt: skip
        """A reserved word's command; anything else than its one form answers the usage."""
        if verb == "list":
            if rest:
                return "`/watch list` takes no more words. " + USAGE
            return await self.list_text(scope, place)
        if len(rest) != 1:
            return f"`/watch {verb}` takes one id. " + USAGE
        if verb in ("remove", "delete", "stop"):
            return await self.remove_text(scope, rest[0], place, admin)
        if verb == "pause":
            return await self.pause_text(scope, rest[0], place, admin)
        return await self.resume_text(scope, rest[0], place, admin)

    async def message(self, scope: Scope, text: str, turn_id: str = "") -> str | None:
        """A chat message that is a watch command (`chat_command`), answered; None for any
        other message. `turn_id`: the job's id, from which a made watch takes its id."""
        command = chat_command(text)
        if command is None:
            return None
        watch_id = watch_id_of(scope.tenant, turn_id) if turn_id else ""
        try:
            scope, place = await self.home(scope, place_of(scope))
        except PlaceUnknown as exc:
            return str(exc)
        return await self.command(scope, command, place, watch_id)

    async def home(self, scope: Scope, place: WatchPlace | None) -> tuple[Scope, WatchPlace | None]:
        """Where the watch commands of a chat message or a platform's command (`/watch`) used
        at `place` act, the same on both paths: the place, or where its poster says a watch
        made there posts (Discord: a public thread the bot opened gives its channel). Then the
        scope is that channel's (a private channel's watch is seen there, not only in the
        thread) and the place still holds the thread's own watches (`asked`: made there
        before, they stay listed and removable from it). PlaceUnknown: the platform did not
        answer now."""
        poster = self.posters.get(place.platform) if place is not None else None
        if place is None or not isinstance(poster, HomePlaces):
            return scope, place
        home = await poster.home(place)
        if home.channel == place.channel:
            return scope, place
        return replace(scope, channel=home.channel), replace(home, asked=place.channel)

    async def list_text(
        self, scope: Scope, place: WatchPlace | None, fit: FitsList | None = None
    ) -> str:
        """The watches of `place` (all of the tenant's for the terminal) this person may see,
        a line each (`_listed`); `fit`: how the asking platform fits them to one answer
        (Discord's `/watch list`; a chat answer is split instead, so it shows them all)."""
        if place is None:
            watches = await self.store.visible(scope)
        else:
            watches = [
                w for w in await self.store.all(scope.tenant)
                if w.channel in place.channels and _sees(scope, place, w)
            ]  # fmt: skip
        if not watches:
            return "No watches here. " + USAGE
        if fit is not None:
            return fit(watches, _listed)
        return "\n".join(_listed(w, describe(w)) for w in watches)

    async def _here(
        self, scope: Scope, watch_id: str, place: WatchPlace | None, admin: AdminCheck | None
    ) -> tuple[Watch | None, str]:
        """The watch, if it posts to this place and this person may see it there (only the
        place a watch posts to may remove, pause or resume it), or if the person is an admin
        of the tenant (who manages every place's); with where it posts, said when not here."""
        watch = await self.store.get(scope.tenant, watch_id.strip("`"))
        if watch is None:
            return None, ""
        here = place or TERMINAL
        if here.holds(watch) and _sees(scope, here, watch):
            return watch, ""
        if admin is not None and await admin():
            return watch, f" in {_place_name(watch)}"
        return None, ""

    async def remove_text(
        self, scope: Scope, watch_id: str, place: WatchPlace | None,
        admin: AdminCheck | None = None,
    ) -> str:  # fmt: skip
        return await self._on_watch(self._remove, scope, watch_id, place, admin)

    async def pause_text(
        self, scope: Scope, watch_id: str, place: WatchPlace | None,
        admin: AdminCheck | None = None,
    ) -> str:  # fmt: skip
        return await self._on_watch(self._pause, scope, watch_id, place, admin)

    async def resume_text(
        self, scope: Scope, watch_id: str, place: WatchPlace | None,
        admin: AdminCheck | None = None,
    ) -> str:  # fmt: skip
        return await self._on_watch(self._resume, scope, watch_id, place, admin)

    async def _on_watch(
        self, action: Callable[[Scope, Watch, str], Awaitable[str]], scope: Scope,
        watch_id: str, place: WatchPlace | None, admin: AdminCheck | None,
    ) -> str:  # fmt: skip
        """Run `action` on the watch if this person may act on it from here (`_here`); its
        answer fitted to what the asking platform shows (`FitsAnswers`), the watch in hand."""
        watch, where = await self._here(scope, watch_id, place, admin)
        if watch is None:
            return _not_here(watch_id)
        text = await action(scope, watch, where)
        poster = self.posters.get((place or TERMINAL).platform)
        return poster.fit(text, watch) if isinstance(poster, FitsAnswers) else text

    async def _remove(self, scope: Scope, watch: Watch, where: str) -> str:
        await self.store.remove(scope.tenant, watch.id)
        return f"Stopped watching {describe(watch)}{where} (`{watch.id}`)."

    async def _pause(self, scope: Scope, watch: Watch, where: str) -> str:
        if not await self.store.pause(watch, f"paused by {scope.user or 'someone'}"):
            return _not_here(watch.id)  # removed meanwhile
        return (
            f"Paused {describe(watch)}{where} (`{watch.id}`); `/watch resume {watch.id}` "
            "resumes it."
        )

    async def _resume(self, scope: Scope, watch: Watch, where: str) -> str:
        if not watch.paused:  # resuming moves its next digest to now: an extra one, or twice
            return f"`{watch.id}` is not paused{where}: {_state(watch)}."
        if not watch.searchable:  # its digest would only pause it again and tell its creator
            return f"{remake(watch.query)}."
        poster = self.posters.get(watch.platform)
        own = WatchPlace(watch.platform, watch.channel, watch.thread)  # where it posts
        if poster is None and watch.platform != TERMINAL.platform:
            return NO_POSTER.format(platform=watch.platform)
        if poster is not None and (why := await poster.can_post(own, tenant=watch.tenant)):
            return why  # e.g. a channel not of this tenant's (an imported watch): stays paused
        if not await self.store.resume(watch, self.now()):
            return _not_here(watch.id)  # removed meanwhile
        return (
            f"Resumed {describe(watch)}{where} (`{watch.id}`): a digest comes within a few minutes."
        ) + await self._note(watch)

    async def _note(self, watch: Watch) -> str:
        """The poster's word on the place a watch was made or resumed for (`PlaceNotes`:
        Discord's says what to grant so that a digest is not posted twice), after a space;
        "" when it has none. Best effort: the watch is already made or resumed, so a lookup
        failing (a timeout, a dropped connection) or slower than NOTE_SECONDS (the answer has
        its window) is logged and says nothing, never a false "nothing was changed"."""
        poster = self.posters.get(watch.platform)
        if not isinstance(poster, PlaceNotes):
            return ""
        place = WatchPlace(watch.platform, watch.channel, watch.thread)
        try:
            async with asyncio.timeout(NOTE_SECONDS):
                note = await poster.note(place)
        except Exception as exc:  # not CancelledError (a BaseException): that goes on up
            log.warning("no note for watch %s in %s: %r", watch.id, watch.channel, exc)
            return ""
        return f" {note}" if note else ""


def _reason(paused: str) -> str:
    """Why a watch is paused, as its list line shows it: on one line, cut to REASON_LISTED."""
    return shortened(" ".join(paused.split()), REASON_LISTED)


def _not_here(watch_id: str) -> str:
    """The answer to an id naming no watch here; a long one typed is echoed cut (Discord
    refuses an answer over 2,000 characters, and its option may hold more)."""
    return f"No watch `{shortened(watch_id, ID_SHOWN)}` posts here (`/watch list` shows their ids)."


def _sees(scope: Scope, place: WatchPlace, watch: Watch) -> bool:
    """The person may see the watch here: by the audience of the channel it posts to, the
    thread asked from (`asked`) seen as the thread's own scope (before `home` moved it)."""
    if place.asked and watch.channel == place.asked:
        scope = replace(scope, channel=place.asked)
    return scope.can_see(watch.audience)


def _place_name(watch: Watch) -> str:
    """Where a watch posts, as a chat shows it (a channel link; the terminal by name)."""
    return "the terminal" if watch.platform == TERMINAL.platform else f"<#{watch.channel}>"


def _listed(watch: Watch, described: str) -> str:
    """A listed watch's line: its id, what it watches (`described`: its description, perhaps
    cut; left out when ""), and its state (`_state`: a paused one's resume)."""
    what = f" {described}" if described else ""
    return f"• `{watch.id}`{what} — {_state(watch)}"


def _state(watch: Watch) -> str:
    """A listed watch's schedule: its next digest, or why it is paused and what to do (a topic
    arXiv cannot search is not resumed: it is made again). A list line is a summary: the
    reason is cut to one line of REASON_LISTED (a platform's error text may be long and hold
    newlines), what to do kept whole."""
    if watch.paused and not watch.searchable:  # resuming is refused (`_resume`): remake it
        why = unsearchable(watch.query)
        return f"*paused* ({why}): {remove_advice(watch.id)}"
    if watch.paused:
        return f"*paused* ({_reason(watch.paused)}): `/watch resume {watch.id}`"
    retrying = f" (arXiv failed {watch.failures}×, retrying)" if watch.failures else ""
    return f"next digest {utc_minute(watch.next_due)} UTC{retrying}"
