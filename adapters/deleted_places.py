"""A channel or thread deleted on Slack or Discord is forgotten: the adapter names the place
(`DeletedPlace`) and queues its erasure as durable background work (bot/upkeep.py
`place_deleted`, memory/governance_places.py), then acknowledges the event."""

from __future__ import annotations

from bot.turns import TurnHandler
from memory.governance_places import DeletedPlace

__all__ = ["DeletedPlace", "queue_place_deletion"]


async def queue_place_deletion(handler: TurnHandler, place: DeletedPlace) -> None:
    """Queue the erasure of every thread of `place` (in Redis before this returns)."""
    await handler.agent.harness.upkeep.place_deleted(place)
