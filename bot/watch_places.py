"""Where a watch posts, and how a platform posts there.

A watch made in chat posts to the channel it was made in (`place_of`; from a public thread the
bot opened for a Discord mention, by a mention or `/watch`, that thread's channel: `HomePlaces`,
the place still holding the thread's own older watches: `asked`); one made in the terminal
posts nowhere (`TERMINAL`: it is run by hand). Each chat adapter registers a `Poster`, the one
seam between the platform-free watch service and Slack's or Discord's API, so that the
scheduler, the digest task and the Save task never name a platform.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from memory.digest import Digest
from memory.scope import Scope
from memory.stores.watches import Watch


class PlaceUnknown(RuntimeError):
    """The platform did not say where a command's watches belong (`HomePlaces.home`: Discord
    failing in passing): nothing is done, and the message says to try again."""


class Undeliverable(RuntimeError):
    """The platform will not take the digest there (channel gone, bot removed): the period is
    given up without moving `since`, so a later digest still shows its papers."""


@dataclass
class WatchPlace:
    """Where a watch made in chat posts: the platform, its channel and thread. `asked`: the
    channel the command was used in when it is not this one (a Discord thread the bot opened,
    whose watches post to its channel): its own watches (made there before) are here too."""

    platform: str
    channel: str
    thread: str = ""
    asked: str = ""

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels whose watches this place lists and manages."""
        return (self.channel, self.asked) if self.asked else (self.channel,)

    def holds(self, watch: Watch) -> bool:
        """The watch posts here (only here may it be paused, resumed or removed)."""
        return watch.platform == self.platform and watch.channel in self.channels


TERMINAL = WatchPlace("terminal", "terminal")


def place_of(scope: Scope) -> WatchPlace | None:
    """The place of a chat message (from its thread id), or None for the terminal. A Discord
    thread the bot opened is that thread here (the scope does not name its channel): the
    commands ask the poster where it belongs (`HomePlaces`)."""
    parts = scope.thread.split(":")
    if parts[0] == "slack" and len(parts) >= 4:
        return WatchPlace("slack", parts[2])  # digests go to the channel, not the thread
    if parts[0] == "discord" and len(parts) >= 3 and scope.channel:
        return WatchPlace("discord", scope.channel)
    return None


@runtime_checkable
class HomePlaces(Protocol):
    """What a `Poster` may also say: where a watch made in chat at `place` posts. Discord's
    answers a public thread the bot opened for a mention with its channel: the thread is only
    the conversation (it archives when it goes quiet), the channel is where the watch was
    asked for and where `/watch list` looks for it."""

    async def home(self, place: WatchPlace) -> WatchPlace:
        """The place itself, or where its watches post; PlaceUnknown when the platform did
        not answer now."""
        ...


@runtime_checkable
class PlaceNotes(Protocol):
    """What a `Poster` may also say to whoever makes or resumes a watch it can post for (by a
    mention or a command): a word on what to grant there. Discord's names Read Message
    History, without which a digest task run again after a long outage cannot find the digest
    it already posted and may post it twice."""

    async def note(self, place: WatchPlace) -> str:
        """What to grant at `place` (where the watch posts), or "" when nothing."""
        ...


@runtime_checkable
class FitsAnswers(Protocol):
    """What a `Poster` may also do: fit a command's answer about one watch (pause, remove,
    resume) to what its platform shows in one answer. Discord refuses one over 2,000
    characters, and the person sees no answer though the command was done (a watch removed:
    asking again says it is not there); an author or category may hold thousands."""

    def fit(self, text: str, watch: Watch) -> str:
        """`text` (about `watch`) as the platform can show it: the watch's description cut."""
        ...


ListLine = Callable[[Watch, str], str]  # a listed watch's line around its description (or "")
# How a platform fits `/watch list` to one answer, from the watches and their line (Discord's
# shows every id and state, cutting descriptions): given per watch, so a description's own
# newline never reads as another watch's line.
FitsList = Callable[[Sequence[Watch], ListLine], str]


class Poster(Protocol):
    """How one platform shows digests and answers the Save button (registered by its adapter)."""

    async def post(self, watch: Watch, digest: Digest, marker: str) -> str:
        """Post the digest; returns the platform's reference of the message."""
        ...

    async def find(self, watch: Watch, marker: str, since: float) -> str | None:
        """The reference of a digest message posted with `marker` since then, if any."""
        ...

    async def answer(self, reply: dict[str, Any], text: str) -> None:
        """Say `text` where a Save button was pressed (`reply`: the adapter's own address)."""
        ...

    async def can_post(self, place: WatchPlace, tenant: str) -> str:
        """ "" if digests can be posted there, else why not (and what to do): refused too when
        the place is not of `tenant` (another server or workspace)."""
        ...

    async def tell(self, watch: Watch, text: str) -> None:
        """Say `text` to the watch's creator alone (a direct message)."""
        ...

    async def notice(self, watch: Watch, text: str) -> None:
        """Say `text` in the watch's place."""
        ...
