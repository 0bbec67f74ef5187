"""Who is looking at the memory page, and what they may see there.

A signed link names a person in one workspace or server; `access.py` turns that into a `Viewer`
(asking Slack or Discord which private channels and DMs are theirs, and whether they are an
admin). Every handler of the page reads `request[VIEWER]` and shows only what `can_see`
allows: an id outside it is a 404, as if it did not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import MultipartReader, web

from memory.scope import PUBLIC


@dataclass(frozen=True, slots=True)
class Viewer:
    tenant: str
    user: str  # platform user id ("local" for the terminal)
    platform: str  # "slack", "discord" or "local"
    admin: bool = False  # the tenant's admin: manages all of its memory, and may import
    audiences: frozenset[str] = frozenset({PUBLIC})  # public, and dm:/private: of their own
    name: str = ""
    # the whole tenant is their own (a Discord DM's memory): they see, fix, erase and export
    # all of it as an admin would, but are no admin (an import is an admin's: it costs the
    # shared server its memory and hours of embedding)
    owner: bool = False

    @property
    def manages(self) -> bool:
        """Sees, fixes, erases and exports the whole tenant's memory: its admin or its owner."""
        return self.admin or self.owner

    def can_see(self, audience: str | None) -> bool:
        """True when an item learned for `audience` may be shown to this person."""
        return self.manages or (audience or PUBLIC) in self.audiences


# What the guard (`server.py`) hands every page handler, in the request's own storage.
VIEWER = web.RequestKey("viewer", Viewer)
CSRF = web.RequestKey("csrf", str)  # the session's form token
SESSION = web.RequestKey("session", str)  # the session's id (its cookie)
# an import's form, its CSRF field read by the guard: the handler streams the rest (its file)
IMPORT_FORM = web.RequestKey("import_form", MultipartReader)
