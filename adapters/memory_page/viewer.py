"""Who is looking at the memory page, and what they may see there.

A signed link names a person in one workspace or server; `access.py` turns that into a `Viewer`
(asking Slack or Discord which private channels and DMs are theirs, and whether they are an
admin). Every handler of the page reads `request[VIEWER]` and shows only what `can_see`
allows: an id outside it is a 404, as if it did not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from memory.scope import PUBLIC


@dataclass(frozen=True, slots=True)
class Viewer:
    tenant: str
    user: str  # platform user id ("local" for the terminal)
    platform: str  # "slack", "discord" or "local"
    admin: bool = False  # sees and manages the whole tenant
    audiences: frozenset[str] = frozenset({PUBLIC})  # public, and dm:/private: of their own
    name: str = ""

    def can_see(self, audience: str | None) -> bool:
        """True when an item learned for `audience` may be shown to this person."""
        return self.admin or (audience or PUBLIC) in self.audiences


# What the guard (`server.py`) hands every page handler, in the request's own storage.
VIEWER = web.RequestKey("viewer", Viewer)
CSRF = web.RequestKey("csrf", str)  # the session's form token
SESSION = web.RequestKey("session", str)  # the session's id (its cookie)
