"""Who a platform payload belongs to, said once for every adapter module.

- `slack_team`: the workspace (tenant) of a Slack payload: events and commands carry `team_id`,
  interactive payloads (buttons, shortcuts, views) `team.id`, and some only `user.team_id`.
- `slack_in_dm`: whether a Slack message event is in a direct message (a DM's memory is its
  person's own).
- `discord_tenant`: the tenant of a Discord interaction: its server, or the person's DMs.
- `slack_source`, `discord_source`: how a stored message names the platform message it came
  from, so that a deletion there finds it (memory/governance.py `forget_deleted`).
"""

from __future__ import annotations

from typing import Any

import discord


def slack_team(body: dict[str, Any]) -> str:
    return (
        body.get("team_id")
        or (body.get("team") or {}).get("id")
        or (body.get("user") or {}).get("team_id")
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
