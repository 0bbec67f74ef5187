"""👍 / 👎 under Discord answers, and the "What was wrong?" modal.

The last part of an answer is sent with two buttons whose custom ids name the vote and the
turn (`feedback:up:<turn>`, `feedback:down:<turn>`). They are a `DynamicItem` registered on
the client (`Client.add_dynamic_items`): discord.py matches any message's button by its custom
id, so buttons sent before a restart, or by another process, still work. 👍 is answered
ephemerally (deferred first); 👎 records the vote and opens a modal whose text is kept as the
vote's comment (or, when the vote takes too long, says it may not have been recorded: it
goes on in the background and may still be kept).

The modal's custom id names the turn and the person (`feedback:why:<turn>:<user>`), and it is
not kept in discord.py's in-memory modal store (which keys modals by custom id, so a second
person's 👎 on the same answer would replace the first's form, and a restart would lose it):
its submission is read from the raw interaction by the client's `on_interaction`, in whichever
process receives it. Anyone who can see the thread may vote, only in the channel the turn was
answered in; each vote is theirs (bot/feedback.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import discord

from adapters.platform_ids import discord_tenant
from bot.feedback import FAILED, MAX_COMMENT, THANKS, FeedbackService

log = logging.getLogger(__name__)

TEMPLATE = r"feedback:(?P<vote>up|down):(?P<turn>[A-Za-z0-9_\-]{1,80})"
FORM = re.compile(r"feedback:why:(?P<turn>[A-Za-z0-9_\-]{1,80}):(?P<user>\d{1,25})")
MODAL_SUBMIT = 5  # the interaction type of a submitted modal
VOTE_WITHIN = 2.0  # seconds a 👎 waits for its vote: Discord wants an answer within 3
MAYBE_KEPT = (
    "My memory is slow right now, so your 👎 may not have been recorded; press it again soon."
)
_VOTING: set[asyncio.Future[str]] = set()  # 👎 votes still running after their answer


def channel_of(interaction: discord.Interaction) -> str:
    return str(interaction.channel_id or "")


class FeedbackButton(discord.ui.DynamicItem[discord.ui.Button], template=TEMPLATE):
    """One of the two buttons; rebuilt from its custom id whenever it is pressed."""

    def __init__(self, vote: str, turn: str) -> None:
        super().__init__(
            discord.ui.Button(
                emoji="👍" if vote == "up" else "👎",
                style=discord.ButtonStyle.secondary,
                custom_id=f"feedback:{vote}:{turn}",
            )
        )
        self.vote, self.turn = vote, turn

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Button, match: re.Match[str]
    ) -> FeedbackButton:
        return cls(match["vote"], match["turn"])

    async def callback(self, interaction: discord.Interaction) -> None:
        """Answered within Discord's 3 s whatever Redis does: a 👍 is deferred first and told
        after; a 👎 (whose answer is the form) waits for its vote `VOTE_WITHIN` at most."""
        service, user = _service(interaction), interaction.user

        def vote() -> Awaitable[str]:
            return service.vote(
                discord_tenant(interaction), self.turn, str(user.id),
                1 if self.vote == "up" else -1, user.display_name,
                channel=channel_of(interaction),
            )  # fmt: skip

        if self.vote == "up":
            await answer_later(interaction, vote)
            return
        voting = asyncio.ensure_future(vote())  # not cancelled by the wait: it may be kept
        _VOTING.add(voting)  # (its rejection then follows), so it is held till it ends
        voting.add_done_callback(_VOTING.discard)
        try:
            said = await asyncio.wait_for(asyncio.shield(voting), VOTE_WITHIN)
        except TimeoutError:
            log.warning("👎 on %s not kept in time: memory slow or unreachable", self.turn)
            said = MAYBE_KEPT
        if said != THANKS:  # not kept: no form to fill in
            await interaction.response.send_message(said, ephemeral=True)
        else:
            await interaction.response.send_modal(WhatWasWrong(self.turn, str(user.id)))


class WhatWasWrong(discord.ui.Modal, title="What was wrong?"):
    """The 👎 form; only sent (its submission is handled by `DiscordFeedback.on_interaction`)."""

    comment: discord.ui.TextInput = discord.ui.TextInput(
        label="What was wrong?", style=discord.TextStyle.paragraph, required=False,
        max_length=MAX_COMMENT, placeholder="Wrong or outdated, a missing source, not what I asked…",
    )  # fmt: skip

    def __init__(self, turn: str, user: str) -> None:
        super().__init__(timeout=None, custom_id=f"feedback:why:{turn}:{user}")
        self.stop()  # finished before it is sent: discord.py does not keep it in memory


def submitted_text(data: dict[str, Any]) -> str:
    """The text typed into a submitted modal, from the interaction's raw data."""
    return "\n".join(v for v in _values(data.get("components") or []) if v).strip()


def _values(components: list[Any]) -> Iterator[str]:
    """Text inputs' values, through action rows and labels (`components` / `component`)."""
    for component in components:
        if not isinstance(component, dict):
            continue
        if isinstance(component.get("value"), str):
            yield component["value"]
        yield from _values(component.get("components") or [])
        if isinstance(component.get("component"), dict):
            yield from _values([component["component"]])


def feedback_view(turn: str) -> discord.ui.View:
    """The buttons an answer's last part is sent with."""
    view = discord.ui.View(timeout=None)
    view.add_item(FeedbackButton("up", turn))
    view.add_item(FeedbackButton("down", turn))
    return view


def send_options(turn: str) -> dict[str, Any]:
    """`channel.send` keyword arguments for a part: the buttons when it ends an answer."""
    return {"view": feedback_view(turn)} if turn else {}


class DiscordFeedback:
    """Registers the buttons and the modal's submissions on the client, and holds the service
    their presses use."""

    def __init__(self, service: FeedbackService, client: discord.Client) -> None:
        self.service = service
        client.add_dynamic_items(FeedbackButton)
        earlier = getattr(client, "on_interaction", None)  # another listener stays one

        async def on_interaction(interaction: discord.Interaction) -> None:
            if earlier is not None:
                await earlier(interaction)
            await self.on_interaction(interaction)

        client.event(on_interaction)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        """A 👎 form submitted (in this process or another, before a restart or after)."""
        data: dict[str, Any] = interaction.data or {}  # type: ignore[assignment]
        if interaction.type.value != MODAL_SUBMIT:
            return
        found = FORM.fullmatch(str(data.get("custom_id", "")))
        if found is None:
            return
        user, turn, opener = interaction.user, found["turn"], found["user"]

        async def comment() -> str:
            if str(user.id) != opener:  # the form is its opener's
                return FAILED
            return await self.service.comment(
                discord_tenant(interaction), turn, str(user.id), submitted_text(data),
                name=user.display_name, channel=channel_of(interaction),
            )  # fmt: skip

        await answer_later(interaction, comment)


async def answer_later(
    interaction: discord.Interaction, work: Callable[[], Awaitable[str]]
) -> None:
    """Deferred first (Discord wants an answer within 3 s; Redis may take longer), then told
    what `work` says. What it keeps is kept even when Discord no longer takes the answer."""
    from adapters.discord_platform import defer  # it imports this module

    await defer(interaction, "feedback", ephemeral=True)  # refused: the work is still kept
    said = await work()
    try:
        await interaction.followup.send(said, ephemeral=True)
    except discord.DiscordException as exc:
        log.info("could not answer feedback: %s", exc)


def _service(interaction: discord.Interaction) -> FeedbackService:
    return interaction.client.adapter.feedback.service  # type: ignore[attr-defined]
