"""Slack's organisation rules, pure: who is of the workspace's own organisation, who manages it.

An organisation is an Enterprise Grid org: a member of a sister workspace of the same org (in an
org-shared channel, their `user_team` is their own workspace) is of it, as users.info's
`enterprise_user.enterprise_id` is the workspace's own (auth.test's `enterprise_id` with the
bot's token: the installation's). Slack Connect people of another org carry another one, or
none; a workspace in no Grid has none: whoever is named of another workspace stays walled.

The bot (adapters/slack_walls.py, adapters/slack_watch.py) and the memory page
(adapters/memory_page/access.py) decide by these same rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

GUEST_FLAGS = ("is_restricted", "is_ultra_restricted")  # users.info: a guest of the workspace
ADMIN_FLAGS = ("is_admin", "is_owner", "is_primary_owner")  # users.info: manages the workspace


class OrganisationUnknown(Exception):
    """Slack could not say which Enterprise Grid org the workspace is of: whether a person of
    another workspace is of it is not known (walled for now, asked again later)."""


def shared_outside(info: dict[str, Any]) -> bool:
    """conversations.info says the channel is (or is being) shared with another organisation.
    `is_org_shared` alone is a channel of several workspaces of one Enterprise Grid org."""
    if info.get("is_ext_shared") or info.get("is_pending_ext_shared"):
        return True
    return bool(info.get("is_shared")) and not info.get("is_org_shared")


def names_another_team(team: str, event: dict[str, Any]) -> bool:
    """The event (or command) names its person's workspace (`user_team`, `source_team`), and
    it is not this one: a sister workspace's member, or someone of another organisation."""
    teams = {event.get("user_team"), event.get("source_team")} - {None, ""}
    return any(t != team for t in teams)


def enterprise_of(user: dict[str, Any]) -> str:
    """users.info's Enterprise Grid org of a person (`enterprise_user.enterprise_id`), or ""."""
    return str((user.get("enterprise_user") or {}).get("enterprise_id") or "")


def same_organisation(enterprise: str, organisation: str | None) -> bool:
    """A person of another workspace is of the workspace's own organisation only when both are
    of one Enterprise Grid org, and Slack says so: the person's `enterprise` (users.info) is
    the workspace's `organisation` (`workspace_organisation`). Either unknown ("", or None:
    Slack could not say) is not."""
    return bool(organisation) and enterprise == organisation


async def outsider(user: dict[str, Any], organisation: Callable[[], Awaitable[str | None]]) -> bool:
    """users.info's person is walled off the workspace's public memory: a guest, or of another
    workspace (`is_stranger`) not of the workspace's own organisation (`organisation`, asked
    only then; None, Slack cannot say: OrganisationUnknown). The bot (`SlackWalls`) and the
    memory page decide by this one rule."""
    if any(user.get(k) for k in GUEST_FLAGS):
        return True
    if not user.get("is_stranger"):
        return False
    found = await organisation()
    if found is None:
        raise OrganisationUnknown("Slack could not say the workspace's organisation")
    return not same_organisation(enterprise_of(user), found)


def flagged_admin(user: dict[str, Any]) -> bool:
    """users.info flags the person an admin or owner, and the account is not deactivated:
    Slack's word only. Whoever is walled (`outsider`) is none of ours all the same."""
    return not user.get("deleted") and any(user.get(k) for k in ADMIN_FLAGS)


async def workspace_admin(
    user: dict[str, Any], organisation: Callable[[], Awaitable[str | None]]
) -> bool:
    """users.info's person manages the workspace (an admin or owner of it), by the rule of the
    bot's `/watch` and of the memory page alike: `flagged_admin`, never someone walled
    (`outsider`: Slack flags a Slack Connect person an admin of their own organisation, a guest
    may carry the flag). `organisation` is asked only for a flagged stranger."""
    return flagged_admin(user) and not await outsider(user, organisation)


async def workspace_organisation(client: AsyncWebClient, team: str) -> str:
    """The workspace's Enterprise Grid org: auth.test's `enterprise_id` when the bot's token is
    this workspace's installation (its `team_id`; or an org-wide install, whose workspaces are
    all of its org); "" for a workspace in no Grid, or a token of another workspace."""
    found = await client.auth_test()
    if found.get("team_id") == team or found.get("is_enterprise_install"):
        return str(found.get("enterprise_id") or "")
    return ""
