"""Offline stand-ins for discord.py objects, spec'd on the real classes.

`create_autospec(..., spec_set=True)` makes a wrong attribute, method name or call signature
fail the test, and turns coroutine methods into AsyncMocks. `FakeDiscord` is one "server side":
it hands out snowflakes, keeps the channels a client can look up, and records every message the
bot posts, in order, so tests read what a user would see.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import discord


class FakeTyping:
    """`async with channel.typing():` that counts how often the indicator was shown."""

    def __init__(self, log: list[int], channel_id: int) -> None:
        self.log = log
        self.channel_id = channel_id

    async def __aenter__(self) -> None:
        self.log.append(self.channel_id)

    async def __aexit__(self, *exc: object) -> None:
        return None


def spec(cls: type, **attrs: Any) -> Any:
    fake = mock.create_autospec(cls, instance=True, spec_set=True)
    for name, value in attrs.items():
        setattr(fake, name, value)
    return fake


@dataclass
class Sent:
    channel_id: int
    text: str
    edits: list[str] = field(default_factory=list)


@dataclass
class FakeDiscord:
    """The Discord side of the tests: ids, channels, and what the bot sent where."""

    bot: Any = None
    channels: dict[int, Any] = field(default_factory=dict)
    guilds: dict[int, Any] = field(default_factory=dict)  # `client.get_guild` finds them
    sent: list[Sent] = field(default_factory=list)
    typing: list[int] = field(default_factory=list)
    _ids: itertools.count = field(
        default_factory=lambda: itertools.count(random.randrange(10**17, 10**18, 10**6))
    )

    def __post_init__(self) -> None:
        self.bot = spec(discord.ClientUser, id=self.snowflake(), bot=True, name="ArxivScout")

    def snowflake(self) -> int:
        return next(self._ids)

    # -- the bot's client --------------------------------------------------------------------

    def attach(self, client: discord.Client) -> None:
        """Log `client` in as the bot and let it look channels up here (spec'd patches)."""
        client._connection.user = self.bot
        client.get_channel = mock.create_autospec(client.get_channel, side_effect=self.channels.get)
        client.get_guild = mock.create_autospec(client.get_guild, side_effect=self.guilds.get)
        client.fetch_channel = mock.create_autospec(client.fetch_channel, side_effect=self._fetch)

    async def _fetch(self, channel_id: int) -> Any:
        if channel_id not in self.channels:
            raise discord.NotFound(mock.Mock(status=404, reason="Not Found"), "Unknown Channel")
        return self.channels[channel_id]

    # -- people and places ---------------------------------------------------------------------

    def user(self, bot: bool = False, name: str = "someone") -> Any:
        return spec(
            discord.User, id=self.snowflake(), bot=bot, name=name, global_name=None,
            display_name=name,
        )  # fmt: skip

    def guild(self) -> Any:
        """A server; its @everyone role has the server's id, as on Discord. Anyone is its
        member (`get_member`) unless a test says otherwise."""
        guild_id = self.snowflake()
        everyone = spec(discord.Role, id=guild_id, name="@everyone")
        me = spec(discord.Member, id=self.bot.id, bot=True, name=self.bot.name)
        guild = spec(discord.Guild, id=guild_id, default_role=everyone, me=me)
        self.guilds[guild_id] = guild
        return guild

    def _messageable(self, cls: type, channel_id: int | None = None, **attrs: Any) -> Any:
        channel = spec(cls, id=channel_id or self.snowflake(), **attrs)
        channel.send.side_effect = lambda content=None, **kw: self._post(channel.id, content)
        channel.typing.side_effect = lambda: FakeTyping(self.typing, channel.id)
        self.channels[channel.id] = channel
        return channel

    def text_channel(self, guild: Any, private: bool = False, muted: bool = False) -> Any:
        """A server text channel; a private one is hidden from @everyone, a muted one lets the
        bot read but not send (nor in its threads)."""
        channel = self._messageable(discord.TextChannel, guild=guild)

        def permissions_for(target: Any, /) -> discord.Permissions:
            if target is guild.me:
                return discord.Permissions(
                    view_channel=True, read_message_history=True, send_messages=not muted,
                    send_messages_in_threads=not muted,
                )  # fmt: skip
            hidden = private and target is guild.default_role
            return discord.Permissions(view_channel=not hidden)

        channel.permissions_for.side_effect = permissions_for
        return channel

    def thread(
        self, guild: Any, owner_id: int, parent_id: int | None = None, thread_id: int | None = None
    ) -> Any:
        """A thread in `parent_id`'s channel (a new public text channel if not given);
        `thread_id`: a thread started from a message has that message's id."""
        parent = self.channels.get(parent_id) if parent_id else self.text_channel(guild)
        thread = self._messageable(
            discord.Thread, thread_id, guild=guild, owner_id=owner_id, parent_id=parent.id,
            parent=parent,
        )  # fmt: skip
        thread.permissions_for.side_effect = parent.permissions_for  # as Discord resolves them
        return thread

    def dm_channel(self, recipient: Any) -> Any:
        return self._messageable(discord.DMChannel, recipient=recipient)

    def _post(self, channel_id: int, content: str | None) -> Any:
        record = Sent(channel_id, content or "")
        self.sent.append(record)
        posted = spec(discord.Message, id=self.snowflake(), content=record.text)
        posted.edit.side_effect = lambda content=None, **kw: record.edits.append(content)
        return posted

    def texts(self, channel_id: int) -> list[str]:
        return [s.text for s in self.sent if s.channel_id == channel_id]

    # -- what users do -------------------------------------------------------------------------

    def message(
        self,
        channel: Any,
        author: Any,
        content: str,
        *,
        mentions: list[Any] = (),
        message_id: int | None = None,
    ) -> Any:
        """A message as the gateway delivers it; `create_thread` opens a thread owned by the bot."""
        guild = None if isinstance(channel, discord.DMChannel) else channel.guild
        message = spec(
            discord.Message, id=message_id or self.snowflake(), channel=channel, guild=guild,
            author=author, content=content, mentions=list(mentions), role_mentions=[],
            type=discord.MessageType.default,
        )  # fmt: skip

        async def create_thread(*, name: str, **kw: Any) -> Any:
            return self.thread(guild, self.bot.id, parent_id=channel.id, thread_id=message.id)

        message.create_thread.side_effect = create_thread
        message.reply.side_effect = lambda content=None, **kw: self._post(channel.id, content)
        return message

    def mention(self, channel: Any, author: Any, question: str, **kw: Any) -> Any:
        return self.message(
            channel, author, f"<@{self.bot.id}> {question}", mentions=[self.bot], **kw
        )

    def interaction(self, channel: Any, user: Any) -> Any:
        """A slash-command interaction in `channel`; its replies are recorded in order."""
        guild = None if isinstance(channel, discord.DMChannel) else channel.guild
        interaction = spec(
            discord.Interaction, guild_id=guild.id if guild else None, channel_id=channel.id,
            channel=channel, user=user,
            response=spec(discord.InteractionResponse), followup=spec(discord.Webhook),
        )  # fmt: skip
        interaction.followup.send.side_effect = lambda content=None, **kw: self._post(
            channel.id, content
        )
        return interaction
