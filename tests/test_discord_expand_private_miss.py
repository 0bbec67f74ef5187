"""`/expand` past its quick-answer window (Redis slow, so the command defers): a summary is
still shown to the channel, but a miss (an id naming no summary here) or an error is seen only
by the person who asked, as when it is quick: the channel is not told what someone tried to
expand. Discord's rule is modelled by `Shown`: a follow-up takes the visibility of a deferred
"thinking…" while that is pending."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any
from unittest import mock

import aiohttp
import discord
import pytest

from adapters.discord import DiscordAdapter
from adapters.discord_platform import ANSWERED_PRIVATELY, tell_privately
from bot.turns import COMMAND_MEMORY_DOWN
from tests.support.discord_fakes import FakeDiscord, Sent
from tests.test_discord import echo, new_adapter
from tests.test_discord_audit_s28 import gated, summarized_thread, until  # noqa: F401 (fixture)

THINKING = "ArxivScout is thinking…"


def unknown_message() -> discord.NotFound:
    return discord.NotFound(mock.Mock(status=404, reason="Not Found"), {"code": 10008})


class Shown:
    """What an interaction's answers showed, as Discord shows them: (text, only to the person),
    in order; what the channel sees of them is also posted to the fake's channel. A deferred
    "thinking…" is a response of the defer's visibility, pending: the first follow-up then
    fills it (its own `ephemeral` ignored). Once the original is edited (or deleted), a
    follow-up is a new message of its own visibility; deleted while pending, Discord may
    refuse the follow-up (Unknown Message, discord/discord-api-docs#3087; #2739 reported
    fixed), modelled as refused. `seen_by_channel` keeps every text the channel was shown
    (sent, followed up, edited), a deleted one too: it was read before it went."""

    def __init__(self, interaction: Any, fake: FakeDiscord) -> None:
        self.answers: list[list[Any]] = []
        self.seen_by_channel: list[str | None] = []
        self.original: list[Any] | None = None
        self.pending = False
        self.lost = False  # deleted while pending
        self.fake, self.channel_id = fake, interaction.channel_id
        response = interaction.response
        response.send_message.side_effect = self.sent
        response.defer.side_effect = self.deferred
        interaction.followup.send.side_effect = self.followed
        interaction.edit_original_response.side_effect = self.edited
        interaction.delete_original_response.side_effect = self.deleted

    def _show(self, content: str | None, private: bool) -> list[Any]:
        answer = [content, private]
        self.answers.append(answer)
        if not private:
            self.seen_by_channel.append(content)
            self.fake.sent.append(Sent(self.channel_id, content or ""))
        return answer

    async def sent(self, content: str | None = None, *, ephemeral: bool = False, **kw: Any):
        self.original = self._show(content, ephemeral)

    async def deferred(self, *, ephemeral: bool = False, thinking: bool = False) -> None:
        self.original, self.pending = [THINKING, ephemeral], True
        self.answers.append(self.original)
        if not ephemeral:
            self.seen_by_channel.append(THINKING)

    async def followed(self, content: str | None = None, *, ephemeral: bool = False, **kw: Any):
        if self.lost:
            raise unknown_message()
        if self.pending and self.original is not None:
            self.pending = False
            self.answers.remove(self.original)
            self.original = self._show(content, self.original[1])
        else:
            self._show(content, ephemeral)

    async def edited(self, *, content: str | None = None, **kw: Any) -> None:
        if self.original is None:
            raise unknown_message()
        self.original[0], self.pending = content, False
        if not self.original[1]:
            self.seen_by_channel.append(content)

    async def deleted(self) -> None:
        if self.original is None:
            raise unknown_message()
        self.answers.remove(self.original)
        self.lost, self.original, self.pending = self.pending, None, False


def assert_channel_told_nothing(shown: Shown) -> None:
    """The channel saw at most the "thinking…" and the words that name nothing: never what
    was answered to the person, not even for a moment before it was edited or deleted."""
    assert set(shown.seen_by_channel) <= {THINKING, ANSWERED_PRIVATELY}, shown.seen_by_channel


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
    shown = Shown(found, fake)
    await expand_while_redis_holds(gate, adapter, found, stored, gate.release.set)
    [(text, private)] = shown.answers
    assert text.startswith(f"[Summary ID: {stored}]") and not private  # the channel's, as ever
    assert fake.texts(thread.id)[-1] == text
    assert shown.seen_by_channel == [THINKING, text]

    missed = fake.interaction(thread, user)
    shown = Shown(missed, fake)
    before = fake.texts(thread.id)
    await expand_while_redis_holds(gate, adapter, missed, "sum_nowhere", gate.release.set)
    assert shown.answers == [["No summary with id 'sum_nowhere' here.", True]], shown.answers
    assert fake.texts(thread.id) == before  # nor said in the channel
    assert_channel_told_nothing(shown)


@pytest.mark.parametrize("slow", [True, False], ids=["deferred", "at-once"])
async def test_an_expand_that_fails_is_said_only_to_the_person(gated, slow):  # noqa: F811
    """Redis is lost while /expand reads (after it deferred), or before it ran."""
    _, gate, fake, adapter = slow_world(gated)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    interaction = fake.interaction(channel, user)
    shown = Shown(interaction, fake)
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
    assert_channel_told_nothing(shown)
    if not slow:  # nothing deferred, so nothing to replace
        interaction.response.defer.assert_not_awaited()
        interaction.edit_original_response.assert_not_awaited()
        interaction.delete_original_response.assert_not_awaited()


async def test_a_slow_miss_is_said_through_a_neutral_original_that_is_then_removed(
    gated,  # noqa: F811
):
    """The "thinking…" is first edited to words that say nothing (then the answer is a
    follow-up of its own, ephemeral), and removed after: a deleted pending response is not
    relied on (Discord may refuse the follow-up then). Its removal refused, the neutral
    words stay; its edit refused, the answer is not sent (the channel would read it)."""
    _, gate, fake, adapter = slow_world(gated)
    channel, user = fake.text_channel(fake.guild()), fake.user()
    missed = "No summary with id 'sum_nowhere' here."

    told = fake.interaction(channel, user)
    shown = Shown(told, fake)
    await expand_while_redis_holds(gate, adapter, told, "sum_nowhere", gate.release.set)
    assert shown.answers == [[missed, True]]
    told.edit_original_response.assert_awaited_once_with(content=ANSWERED_PRIVATELY)
    told.delete_original_response.assert_awaited_once()
    assert_channel_told_nothing(shown)

    kept = fake.interaction(channel, user)
    shown = Shown(kept, fake)
    kept.delete_original_response.side_effect = unknown_message()
    await expand_while_redis_holds(gate, adapter, kept, "sum_nowhere", gate.release.set)
    assert shown.answers == [[ANSWERED_PRIVATELY, False], [missed, True]]
    assert_channel_told_nothing(shown)

    unedited = fake.interaction(channel, user)
    shown = Shown(unedited, fake)
    unedited.edit_original_response.side_effect = unknown_message()
    await expand_while_redis_holds(gate, adapter, unedited, "sum_nowhere", gate.release.set)
    unedited.followup.send.assert_not_awaited()
    assert shown.answers == [[THINKING, False]]
    assert fake.texts(channel.id) == []
    assert_channel_told_nothing(shown)


def unknown_interaction() -> discord.NotFound:
    return discord.NotFound(mock.Mock(status=404, reason="Not Found"), {"code": 10062})


REFUSALS = {  # how Discord may refuse a defer: too late, or the connection lost on the way
    "unknown-interaction": unknown_interaction,
    "disconnected": aiohttp.ServerDisconnectedError,
}


@pytest.mark.parametrize("refusal", REFUSALS)
@pytest.mark.parametrize("slow", [True, False], ids=["deferred", "at-once"])
async def test_an_expand_whose_defer_discord_refuses_ends_quietly(gated, slow, refusal, caplog):  # noqa: F811
    """Discord refuses the defer (too late: Unknown interaction; or the connection drops),
    before a slow miss or a summary found at once: nothing can answer that interaction, so
    nothing is tried on it and no error is logged (the work did not fail)."""
    world, gate, fake, adapter = slow_world(gated)
    thread, user = await summarized_thread(world, fake, adapter)
    await adapter.tree.get_command("summarize").callback(fake.interaction(thread, user))
    [stored] = re.findall(r"\[Summary ID: (sum_\w+)\]", fake.texts(thread.id)[-1])
    before = fake.texts(thread.id)
    interaction = fake.interaction(thread, user)
    shown = Shown(interaction, fake)
    interaction.response.defer.side_effect = REFUSALS[refusal]()
    interaction.response.send_message.side_effect = unknown_interaction()
    interaction.followup.send.side_effect = unknown_interaction()
    caplog.clear()
    if slow:
        await expand_while_redis_holds(gate, adapter, interaction, "sum_nowhere", gate.release.set)
    else:
        await adapter.tree.get_command("expand").callback(interaction, stored)
    interaction.response.defer.assert_awaited_once()
    interaction.response.send_message.assert_not_awaited()
    interaction.followup.send.assert_not_awaited()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert fake.texts(thread.id) == before
    assert shown.seen_by_channel == []


async def test_an_empty_private_answer_still_says_something():
    """Nothing to say after a public "thinking…" still answers the person, never leaving
    them with only the neutral words (or nothing)."""
    fake = FakeDiscord()
    channel = fake.text_channel(fake.guild())
    interaction = fake.interaction(channel, fake.user())
    shown = Shown(interaction, fake)
    await interaction.response.defer(thinking=True)
    await tell_privately(interaction, "", "/expand")
    assert shown.answers == [["(nothing to show)", True]]
    assert_channel_told_nothing(shown)
