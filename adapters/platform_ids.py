"""Who a platform payload belongs to, said once for every adapter module.

- `slack_team`: the workspace (tenant) of a Slack payload: the installation's, as bolt's
  `context.team_id` is. Not an event envelope's `team_id` when it says otherwise: in a shared
  channel that names the workspace that created the channel.
- `slack_in_dm`: whether a Slack message event is in a direct message (a DM's memory is its
  person's own).
- `discord_tenant`: the tenant of a Discord interaction: its server, or the person's DMs.
- `tenant_kind`: a tenant's platform and kind from its shape (memory/scope.py, so memory may
  use it too).
- `slack_source`, `discord_source`: how a stored message names the platform message it came
  from, so that a deletion there finds it (memory/governance.py `forget_deleted`).
"""

from __future__ import annotations

from typing import Any

import discord

from memory.scope import TenantKind, tenant_kind

__all__ = [
    "TenantKind",
    "discord_source",
    "discord_tenant",
    "slack_in_dm",
    "slack_source",
    "slack_team",
    "tenant_kind",
]  # fmt: skip


def slack_team(body: dict[str, Any]) -> str:
    """The workspace whose installation a payload is for, in slack_bolt's order
    (slack_bolt/request/internals.py `extract_team_id`), so our tenant is bolt's
    `context.team_id`:

    - a view's `app_installed_team_id` (a modal submitted from another workspace of a Slack
      Connect channel names that workspace as `team`);
    - an interactive payload's `team.id` (shortcuts, block actions: the installation's); a
      `team` that is a string is taken as is, as bolt does: its `extract_team_id` reads an
      event's `team` (a string) by the same step. No payload is known to carry one at its top:
      kept so that our tenant stays bolt's `context.team_id` whatever comes;
    - an event's `authorizations[0].team_id`: in a shared channel the envelope's `team_id` (and
      `event.team`) may name the workspace that created the channel, or the author's, not ours
      (slackapi java-slack-sdk#629, bolt-js#687, #935);
    - else `team_id` (commands; events of an org-wide install, whose authorization names no
      workspace), `event.team`, and last the person's `user.team_id`."""
    view = body.get("view") if isinstance(body.get("view"), dict) else {}
    if view.get("app_installed_team_id"):
        return str(view["app_installed_team_id"])
    team = body.get("team")
    if isinstance(team, str) and team:
        return team
    if isinstance(team, dict) and team.get("id"):
        return str(team["id"])
    authorizations = body.get("authorizations") or [{}]
    event = body.get("event") if isinstance(body.get("event"), dict) else {}
    user = body.get("user") if isinstance(body.get("user"), dict) else {}
    return str(
        authorizations[0].get("team_id")
        or body.get("team_id")
        or event.get("team")
        or user.get("team_id")
        or view.get("team_id")
        or ""
    )


def slack_in_dm(event: dict[str, Any]) -> bool:
    """A message event of a direct message (its `channel_type`, or a DM channel's `D…` id)."""
    return event.get("channel_type") == "im" or str(event.get("channel", "")).startswith("D")


def slack_source(channel: str, ts: str) -> str:
    """A Slack message (a ts is unique per channel)."""
    return f"slack:{channel}:{ts}"


def discord_source(message_id: int) -> str:
    """A Discord message (ids are global)."""
    return f"discord:{message_id}"


def discord_tenant(interaction: discord.Interaction) -> str:
    if interaction.guild_id is None:
        return f"dm-{interaction.user.id}"
    return str(interaction.guild_id)
