"""Telling a watch's creator that it was removed because its channel or thread was deleted.

The place's deletion task (bot/upkeep.py, memory/governance_places.py) hands each watch it is
about to remove to `queue`: a durable `watch-removed` task on the platform's digest stream, with
the watch as it was (the watch itself is gone when the task runs), read where the platform's
`Poster` is. The task says it to the creator alone (`Poster.tell`), as a paused watch's notice
is said. Queued before the watch goes, so a crash loses no notice; a deletion run again after
a crash queues it again, and a notice said or being said is not said twice (a claim taken
before saying it, kept a day once said; while another holds it, the task fails and the stream
delivers it again later: a claim left by a process that died while saying it lapses in a minute).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.watch_places import Poster
from bot.watch_texts import describe
from memory.governance_places import DeletedPlace, Places
from memory.stores.watches import Watch
from memory.tasks import TaskStream

log = logging.getLogger(__name__)

REMOVED = "watch-removed"  # the task's name on a platform's stream


def removed_text(watch: Watch, place: DeletedPlace) -> str:
    """The creator's notice: the watch, the deleted place, and how to make it again (Slack:
    the whole command; Discord's `/watch add` takes its parts as options)."""
    if watch.channel == place.channel:
        where = f"{'the thread' if place.parent else ''} <#{place.channel}>".strip()
    else:  # a thread of the deleted channel
        where = f"a thread of <#{place.channel}>"
    extra = [f"cat:{_word(c)}" for c in watch.categories]
    extra += [f"author:{_word(a)}" for a in watch.authors]
    slack = " ".join([watch.query, watch.period_name, *extra]).strip()
    command = "/watch add" if watch.platform == "discord" else f"/watch {slack}"
    return (
        f"Your watch {describe(watch)} (`{watch.id}`) posted to {where}, which was deleted, so "
        f"I removed the watch. To keep following it, make it again in another channel: "
        f"`{command}` there."
    )


def _word(value: str) -> str:
    """A field's value as `parse_watch` reads it back whole: quoted when it has a space
    (`author:"Albert Gu"`, not `author:Albert` and "Gu" in the topic)."""
    return f'"{value}"' if any(c.isspace() for c in value) else value


class RemovalNotices:
    """The removal notices of one process, said through the posters its adapters attached."""

    def __init__(
        self, places: Places, posters: dict[str, Poster], stream: Callable[[str], TaskStream]
    ) -> None:
        self.places = places  # where a notice is marked said (the governance's)
        self.posters = posters  # shared with the service: `attach` adds to it
        self.stream = stream

    async def queue(self, watches: list[Watch], place: DeletedPlace) -> None:
        """Queue a notice for each watch about to be removed with `place` (in Redis before
        this returns); a watch with no creator (erased, or made in the terminal) has no one."""
        for watch in watches:
            if watch.created_by and watch.platform == place.platform:
                payload = {"watch": watch.fields(), "place": place.to_dict()}
                await self.stream(watch.platform).add(REMOVED, payload)

    async def run(self, payloads: list[dict]) -> None:
        """Each notice once; one that could not be said fails the batch after the others are
        said (a re-run says only what is left)."""
        failed: list[BaseException] = []
        for payload in payloads:
            try:
                await self.tell(payload)
            except Exception as exc:  # the platform or Redis away: the stream tries it again
                log.warning("could not tell of a removed watch: %r", exc)
                failed.append(exc)
        if failed:
            raise failed[0]

    async def tell(self, payload: dict) -> bool:
        """Say one notice unless it was said already; True when said now."""
        watch = Watch.from_fields(payload["watch"])
        place = DeletedPlace.from_dict(payload["place"])
        poster = self.posters.get(watch.platform)
        if poster is None:  # this stream is read only where the platform's poster is
            raise RuntimeError(f"no poster for {watch.platform} here")
        held = await self.places.claim_telling(watch.tenant, watch.id)
        if held == "told":
            return False
        if held:  # a copy of the task (or a process that died saying it): the stream retries
            raise RuntimeError(f"the removal of watch {watch.id} is being said elsewhere")
        try:
            await poster.tell(watch, removed_text(watch, place))
        except BaseException:
            await self.places.told(watch.tenant, watch.id, said=False)
            raise
        await self.places.told(watch.tenant, watch.id, said=True)
        return True
