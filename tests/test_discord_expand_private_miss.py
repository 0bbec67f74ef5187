"""`/expand` past its quick-answer window (Redis slow, so the command defers): a summary is
still shown to the channel, but a miss (an id naming no summary here) or an error is seen only
by the person who asked, as when it is quick: the channel is not told what someone tried to
expand. Discord's rule is modelled by `Shown`: a follow-up takes the visibility of a deferred
"thinking…" while that stands."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from adapters.discord import DiscordAdapter
from bot.turns import COMMAND_MEMORY_DOWN
from tests.support.discord_fakes import FakeDiscord
from tests.test_discord import echo, new_adapter
from tests.test_discord_audit_s28 import gated, summarized_thread, until  # noqa: F401 (fixture)

THINKING = "ArxivScout is thinking…"


class Shown:
    """What an interaction's answers showed, as Discord shows them: (text, only to the person),
    in order. A deferred "thinking…" is a response of the defer's visibility; the first
    follow-up while it stands fills it (its own `ephemeral` ignored); deleted, it is gone and
    a follow-up is a new message of its own visibility."""

    def __init__(self, interaction: Any) -> None:
        self.answers: list[list[Any]] = []
        self.thinking: list[Any] | None = None
        response = interaction.response
        response.send_message.side_effect = self.sent
        response.defer.side_effect = self.deferred
        interaction.followup.send.side_effect = self.followed
        interaction.delete_original_response.side_effect = self.deleted

    async def sent(self, content: str | None = None, *, ephemeral: bool = False, **kw: Any):
        self.answers.append([content, ephemeral])

    async def deferred(self, *, ephemeral: bool = False, thinking: bool = False) -> None:
        self.thinking = [THINKING, ephemeral]
        self.answers.append(self.thinking)

    async def followed(self, content: str | None = None, *, ephemeral: bool = False, **kw: Any):
        if self.thinking is not None and self.thinking[0] == THINKING:
            self.thinking[0] = content
        else:
            self.answers.append([content, ephemeral])

    async def deleted(self) -> None:
        self.answers.remove(self.thinking)
        self.thinking = None


async def expand_while_redis_holds(gate, adapter, interaction, summary_id: str, then) -> None:
    """Run /expand while Redis holds the summary's read, past the quick-answer window (it
    defers), then `then()` (release it, or cut Redis off) and let the command finish."""
    gate.hold(summary_id.encode())
    expand = adapter.tree.get_command("expand").callback
    running = asyncio.create_task(expand(interaction, summary_id))
    try:
        await asyncio.wait_for(gate.held.wait(), 30)
        await until(lambda: interaction.response.defer.await_count == 1, "not deferred")
        then()
        await asyncio.wait_for(running, 30)
    finally:
        gate.release.set()
        gate.mend()
        running.cancel()


def slow_world(world_and_gate) -> tuple[Any, Any, FakeDiscord, DiscordAdapter]:
    """The gated world, its model echoing, a fake Discord and an adapter on both."""
    world, gate = world_and_gate
    world.model.responder = echo
    fake = FakeDiscord()
    return world, gate, fake, new_adapter(world, fake)


async def test_a_slow_expand_shows_a_summary_to_the_channel_and_a_miss_only_to_the_person(
    gated,  # noqa: F811
):
    world, gate, fake, adapter = slow_world(gated)
    thread, user = await summarized_thread(world, fake, adapter)
    await adapter.tree.get_command("summarize").callback(fake.interaction(thread, user))
    [stored] = re.findall(r"\[Summary ID: (sum_\w+)\]", fake.texts(thread.id)[-1])

    found = fake.interaction(thread, user)
    shown = Shown(found)
    await expand_while_redis_holds(gate, adapter, found, stored, gate.release.set)
    [(text, private)] = shown.answers
    assert text.startswith(f"[Summary ID: {stored}]") and not private  # the channel's, as ever

    missed = fake.interaction(thread, user)
    shown = Shown(missed)
    before = fake.texts(thread.id)
    await expand_while_redis_holds(gate, adapter, missed, "sum_nowhere", gate.release.set)
    assert shown.answers == [["No summary with id 'sum_nowhere' here.", True]], shown.answers
    assert fake.texts(thread.id) == before  # nor said in the channel


@pytest.mark.parametrize("slow", [True, False], ids=["deferred", "at-once"])
async def test_an_expand_that_fails_is_said_only_to_the_person(gated, slow):  # noqa: F811
    """Redis is lost while /expand reads (after it deferred), or before it ran."""
    _, gate, fake, adapter = slow_world(gated)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    interaction = fake.interaction(channel, user)
    shown = Shown(interaction)
    if slow:
        await expand_while_redis_holds(gate, adapter, interaction, "sum_lost", gate.cut)
    else:
        gate.cut()
        try:
            await adapter.tree.get_command("expand").callback(interaction, "sum_lost")
        finally:
            gate.mend()
    assert shown.answers == [[COMMAND_MEMORY_DOWN.format(command="/expand"), True]]
    assert fake.texts(channel.id) == []
