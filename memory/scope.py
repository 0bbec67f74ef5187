"""Where a memory read or write happens: tenant, thread, channel, visibility and the person.

An adapter builds one `Scope` per incoming message; every store takes it instead of loose
strings, so the privacy rules live here, once. A place is public (a channel the whole team can
read), private (a channel only its members can read) or a direct message (one person and the
bot). What is said in a public place may be shown anywhere in the tenant; what is said in a
private channel or a DM only where it was said. `audience` is the tag stored with each item and
`can_see` the rule applied on every read. A `walled` scope (a guest, someone of another
organisation, a channel shared with one) sees only its own place's memory; it is never public
itself, so what is learned there stays there, stored as the channel's private memory: whoever
asks in that channel, walled or not, sees it (`audiences`). Whoever asks in a thread may be
shown all of that thread (`may_show`): they can read it where it was said.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from memory.keys import validate_tenant, validate_thread

if TYPE_CHECKING:  # turn records are stored by scope: a runtime import would be circular
    from memory.stores.turn_records import TurnRecord

PUBLIC = "public"
# The audience of a record that holds items of two places, neither narrower than the other:
# no place's `audiences` hold it, so it is shown nowhere but in its own thread (a summary,
# `Scope.may_show`) and to the tenant's admins on the memory page (`narrowest`).
NOWHERE = "nowhere"


class TenantKind(StrEnum):
    """What a tenant is, by its shape alone (`tenant_kind`)."""

    DISCORD_SERVER = "discord_server"  # a server's id: digits
    DISCORD_DM = "discord_dm"  # a Discord person's DMs: `dm-<id>`
    SLACK = "slack"  # a workspace's team id: neither digits nor `dm-…`
    UNKNOWN = "unknown"  # `dm-` and no Discord id: no platform's


def tenant_kind(tenant: str) -> TenantKind:
    """A tenant's platform and kind from its shape: Discord servers are digits, a Discord
    person's DMs `dm-<id>`, a Slack workspace neither. Used wherever a tenant must not be
    mistaken for another platform's (adapters/platform_ids.py re-exports it)."""
    if tenant.isdigit():
        return TenantKind.DISCORD_SERVER
    if tenant.startswith("dm-"):
        return TenantKind.DISCORD_DM if tenant[3:].isdigit() else TenantKind.UNKNOWN
    return TenantKind.SLACK


class Visibility(StrEnum):
    PUBLIC = "public"
    PRIVATE = "private"
    DM = "dm"


@dataclass(frozen=True, slots=True)
class Scope:
    """One place in one tenant, seen by one person; `thread` is empty for tenant-wide work."""

    tenant: str
    thread: str = ""
    channel: str = ""
    visibility: Visibility = Visibility.PUBLIC
    user: str = ""
    user_name: str = ""
    # the team's public memory is not shown here: a guest or someone of another organisation
    # is asking, or the channel is shared with another organisation (adapters/slack.py)
    walled: bool = False

    def __post_init__(self) -> None:
        validate_tenant(self.tenant)
        if self.thread:
            validate_thread(self.thread)
        visibility = Visibility(self.visibility)
        if self.walled and visibility is Visibility.PUBLIC:
            visibility = Visibility.PRIVATE  # what is learned here stays here
        object.__setattr__(self, "visibility", visibility)

    @property
    def audience(self) -> str:
        """Who may see what is learned here: everyone (`public`), or this channel or DM only."""
        if self.visibility is Visibility.PUBLIC:
            return PUBLIC
        return f"{self.visibility.value}:{self.channel or self.thread}"

    @property
    def audiences(self) -> tuple[str, ...]:
        """Every audience whose memory may be shown here (walled: this place's own only). In a
        public channel also what walled people said there (`private:<channel>`): whoever asks
        there can read the channel."""
        own = self.audience
        if self.walled:
            return (own,)
        if own != PUBLIC:
            return (PUBLIC, own)
        if self.channel:
            return (PUBLIC, f"{Visibility.PRIVATE.value}:{self.channel}")
        return (PUBLIC,)

    def can_see(self, audience: str | None) -> bool:
        """True when an item learned for `audience` may be shown in this place."""
        return (audience or PUBLIC) in self.audiences

    def may_show(self, audience: str | None, thread: str) -> bool:
        """`can_see`, and also whatever was said in the asker's own thread: whoever can ask in a
        thread can read it (a guest asking in a public channel's thread; a member asking where
        a guest's turn was summarized). Only a scope with its asker: the memory page's reader
        (`memory/browse_reader.py`) names a thread it does not ask in."""
        return self.can_see(audience) or (
            bool(self.user) and bool(self.thread) and thread == self.thread
        )

    def in_thread(self, thread: str) -> Scope:
        return replace(self, thread=thread)

    @property
    def speaker(self) -> str:
        """The name the conversation shows for this person."""
        return self.user_name or self.user or "user"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "visibility": self.visibility.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scope:
        return cls(**data)

    @classmethod
    def local(cls, thread: str = "", tenant: str = "local", user: str = "local") -> Scope:
        """The terminal: one person, talking in the open of their own tenant."""
        return cls(tenant, thread, channel="terminal", user=user, user_name=user)


def scope_of(record: TurnRecord) -> Scope:
    """The place and asker of an answered turn, as its record keeps them, walled as the turn
    was. A record from before that was kept (`walled` None) is walled unless it was public: a
    walled scope is never public, and any other may have been a guest's or a shared channel's;
    walled only narrows what is read, while what is learned is stored for the same audience."""
    kind, _, place = (record.audience or PUBLIC).partition(":")
    visibility = Visibility.PUBLIC if kind == PUBLIC else Visibility(kind)
    channel = place or record.channel
    walled = visibility is not Visibility.PUBLIC if record.walled is None else record.walled
    return Scope(record.tenant, record.thread, channel, visibility,
                 record.asker, record.asker_name, walled)  # fmt: skip


def legacy_audience(thread: str) -> str:
    """Who may see a message stored before messages kept their audience. Whether its channel
    was public is not known any more, so a chat platform's message stays in its own channel
    (`slack:<team>:<channel>:<ts>`, `discord:<guild>:<thread>`); a terminal's is public."""
    parts = thread.split(":")
    if parts[0] == "slack" and len(parts) >= 4:
        dm = parts[2].startswith("D")  # Slack's DM channel ids
        return f"{(Visibility.DM if dm else Visibility.PRIVATE).value}:{parts[2]}"
    if parts[0] == "discord" and len(parts) >= 3:
        dm = parts[1] == "dm"
        return f"{(Visibility.DM if dm else Visibility.PRIVATE).value}:{parts[2]}"
    return PUBLIC


def narrowest(audiences: Iterable[str | None]) -> str:
    """Who may see a record made of items of these audiences (a summary of messages, a tool
    log of what a call showed): `public` when every item was; a place's own when some items
    were that place's and the others public; `NOWHERE` when two places' items meet (not within
    one thread: fail closed). An empty audience counts as public: resolve a legacy item's
    first (`legacy_audience`)."""
    places = {audience for audience in audiences if audience and audience != PUBLIC}
    if not places:
        return PUBLIC
    return places.pop() if len(places) == 1 else NOWHERE
