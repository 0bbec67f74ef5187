"""Discord's side of topic watches (bot/watches.py): `/watch add|list|remove`, the digest
message, its Save buttons.

- `/watch add topic [period] [category] [author]` makes a watch that posts to the channel (or
  thread) it was used in; `/watch list`, `/watch remove|pause|resume id` (only from there, but
  for members with Manage Server or Administrator and those named in ARXIVSCOUT_ADMINS, the
  memory page's admins: from anywhere). A mention "watch … weekly" does the same, through the
  turn handler (only from the watch's place). From a public thread the bot opened for a
  mention, both act on that thread's channel (`home`, one rule for both paths: the watch
  posts there, "Watching … in <#channel>"), the thread's own older watches still listed and
  managed from it; Discord failing to show the thread then makes nothing ("try again").
- A digest is one message under 2,000 characters with a "Save" button per paper (custom id
  `digest:save:<arXiv id>`, a `DynamicItem` registered on the client, so buttons of digests
  posted by another process or before a restart work). It is sent with a nonce naming its
  watch and period: Discord enforces a nonce, so a digest task run again after a crash gets the
  first message back instead of a second one. Discord keeps nonces only for minutes, so the
  footer also carries the marker (`marker_tag`) and a task run again later (a long outage)
  finds the message in the channel's history (`find`) rather than posting it twice; where
  it finds none and the bot may not read that history (without Read Message History Discord
  answers an empty list, no error), a warning says what to grant (`warn_if_unreadable`).
- A pressed Save is answered at once, only to the person ("Saving …"), queued as a durable
  task, and answered again through the interaction's follow-up ("Saved … (N passages)").
- `/watch add` needs the bot to be able to send where it is used (the interaction's
  `app_permissions`), and `resume` (or a watch made by a mention) where the watch posts (the
  channel's permissions for the bot, `can_post`): elsewhere Discord would refuse every digest,
  so it answers "let me post here first" (`can_post`: "… in <#channel> …", as an admin may ask
  from another channel). A digest refused later pauses the watch and its creator is told in a
  DM. `/watch add` also needs View Channel (without it nothing can be posted); where the bot
  may not read the history (`app_permissions` without Read Message History), the watch is made
  and `/watch add`'s answer says what to grant (`history_note`): else a digest task run again
  after a long outage could post its digest twice (`find`). A watch made by a mention or
  resumed is told the same in its answer (`note`, for where it posts: bot/watch_places.py
  `PlaceNotes`). The `/watch` answers stay under Discord's 2,000 characters (else Discord
  refuses them and the person sees "The application did not respond", though the watch was
  made or removed): about one watch (add, pause, remove, resume), its description cut and the
  rest whole, its id and the note (`created_reply`; `fit`, bot/watch_places.py `FitsAnswers`);
  an id that names none is echoed cut; `/watch list` cuts the descriptions to keep every
  watch's id and state (a paused one's reason cut to one short line, its resume whole:
  bot/watch_commands.py `_state`), and only past some 40 active watches (some 17 paused)
  leaves some out (the paused kept), saying how many more (`listed_reply`). A mention's
  answer is split as any.
- A watch posts only in a channel of its tenant (`of_tenant`: of its server; for a DM tenant,
  its person's DM with the bot), checked when it is made or resumed (`can_post`)
  and before every digest or notice: an imported watch may name any channel, and is
  paused, never posted there. Only a member of the server (or the DM tenant's person) is told
  of a refused digest (`tell`), never whoever an imported file named as its creator.
- A digest names only the saved papers its channel may read now: a channel hidden from
  @everyone since the watch was made (or that Discord cannot show) reads as a walled place
  (`walled`). A watch made in a thread is noted under its parent channel, so it goes with it.
- A period `/watch add` cannot read is refused with the usage, never folded into the topic.
- A command whose work (Redis, Discord's channel lookup) takes over ANSWER_WITHIN_SECONDS
  defers its answer and says it by the follow-up (`respond`): never past Discord's 3 s, and
  a watch made late is said, not cut off and made again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import discord
from discord import app_commands

from adapters.discord_platform import defer, resolve_visibility, tell_privately
from adapters.memory_page.access import Admins
from adapters.platform_ids import TenantKind, discord_tenant, tenant_kind
from bot.watch_places import ListLine, PlaceUnknown
from bot.watches import (
    NOT_QUEUED,
    UNREACHABLE,
    ForeignPlace,
    Undeliverable,
    WatchPlace,
    WatchRequest,
    WatchService,
    created_text,
    describe,
    parse_period,
    saving_text,
)
from memory.digest import Digest, capped_note, short_authors, when
from memory.ingest.arxiv_source import check_arxiv_id
from memory.ingest.errors import IngestError
from memory.scope import Scope, Visibility
from memory.shorten import shortened
from memory.stores.watches import InvalidWatch, Watch

log = logging.getLogger(__name__)

TEMPLATE = r"digest:save:(?P<arxiv_id>[A-Za-z0-9.\-/]{4,60})"
LIMIT = 2000
SEPARATOR = "\n\n"  # between a digest's parts
NONCE_LIMIT = 25
WATCH_TEXT_LIMIT = 200  # a watch's topic or description in a digest's head and footer
PERIOD_SHOWN = 60  # of a period `/watch add` cannot read, what its answer echoes
PERIOD_TYPED = 100  # what Discord lets be typed as `/watch add`'s period ("every 3 days")
LISTED_AT_LEAST = 8  # of a description cut in `/watch list`, less than this is left out
FIND_SECONDS = 60.0  # `find` reads the history from this long before the digest's "posting"
FIND_LIMIT = 500  # messages `find` reads: the digest follows "posting" within seconds
# What a /watch command's work may take before its answer is deferred: a second of Discord's
# 3 s is left for the gateway's delivery and the defer's POST.
ANSWER_WITHIN_SECONDS = 2.0
Reply = tuple[str, bool]  # a command's answer, and whether only the person sees it


CANNOT_POST = (
    "I cannot send messages in this channel, so Discord would refuse my digests here: let me "
    "post here first (the channel's permissions: Send Messages), then ask again."
)
CANNOT_POST_IN = (  # `can_post`: asked for a watch's channel, perhaps from elsewhere
    "I cannot send messages in <#{channel}>, so Discord would refuse this watch's digests "
    "there: let me post there first (the channel's permissions: {permission}), then ask again."
)
NOT_OURS = (  # `can_post`: the watch's channel is another server's
    "<#{channel}> is not a channel of {where}, so I will not post this watch's digests there: "
    "make the watch again {instead} (and `/watch remove` this one)."
)
DISCORD_SILENT = (  # `home`: Discord failed in passing to show where a command was used
    "Discord did not answer just now, so nothing was changed: try again in a moment."
)
CANNOT_SEE = (
    "I cannot see the channel this watch posts to (deleted, or hidden from me), so Discord "
    "would refuse its digests: remove it, or let me see the channel again."
)
MORE_LISTED = (  # `listed_reply`: a chat answer is split over messages (up to 8)
    "… and {count} more, not shown: Discord shows 2,000 characters in one answer. Mention me "
    "with `watch list` to have the list over several messages."
)
HISTORY_UNREADABLE = (  # `history_note`: the watch is made, its reply says what to grant
    "I cannot read the message history of <#{channel}>, so after I have been offline for a "
    "while a digest may be posted there twice: give me Read Message History in <#{grant}>."
)


def bad_period(period: str) -> str:
    """`/watch add`'s answer to a period it cannot read, echoing it cut: Discord refuses an
    answer over 2,000 characters (the person sees "The application did not respond")."""
    return (
        f"I cannot read the period {shortened(period, PERIOD_SHOWN)!r}: say daily, weekly, or "
        "every N days (e.g. `every 3 days`). Usage: `/watch add topic:<topic> [period:weekly] "
        "[category:cs.CL] [author:Name]`."
    )


def of_tenant(channel: Any, tenant: str) -> bool:
    """The channel (or thread) is the tenant's: of its server, or for a DM tenant `dm-<user>`
    that person's DM with the bot. A channel of no server (a DM, a group DM) is no server's."""
    if tenant_kind(tenant) is TenantKind.DISCORD_DM:
        recipient = getattr(channel, "recipient", None)
        return (
            isinstance(channel, discord.DMChannel)
            and recipient is not None
            and tenant == f"dm-{recipient.id}"
        )
    guild = getattr(channel, "guild", None)
    return guild is not None and str(guild.id) == tenant


def foreign_message(channel: str, tenant: str) -> str:
    """The log line, and the watch's pause, for a digest not posted in a channel not of the
    tenant."""
    return f"Discord channel {channel} is not of {_tenant_words(tenant)}: not posted there"


def _tenant_words(tenant: str) -> str:
    return (
        "your direct messages with me"
        if tenant_kind(tenant) is TenantKind.DISCORD_DM
        else "this server"
    )


def not_ours(channel: str, tenant: str) -> str:
    """`can_post`'s answer for a channel not of the tenant: what to do instead."""
    instead = (
        "here, in our DM"
        if tenant_kind(tenant) is TenantKind.DISCORD_DM
        else "in one of this server's channels"
    )
    return NOT_OURS.format(channel=channel, where=_tenant_words(tenant), instead=instead)


def admin_of(
    interaction: discord.Interaction, admins: Admins | None = None
) -> Callable[[], Awaitable[bool]]:
    """Whether the person manages the whole server, and so every channel's watches, as on the
    memory page: named in ARXIVSCOUT_ADMINS (`admins`), or holding Manage Server or
    Administrator, from the interaction's resolved permissions (none in a DM). Channel
    overwrites cannot grant or deny these two, so the channel's resolution says what the
    server's would."""

    async def admin() -> bool:
        if admins is not None and admins.named(
            discord_tenant(interaction), str(interaction.user.id)
        ):
            return True
        permissions = interaction.permissions
        return bool(permissions.administrator or permissions.manage_guild)

    return admin


def can_send(interaction: discord.Interaction) -> bool:
    """The bot may see and send messages where the interaction was used (in a thread: in
    threads); without View Channel Discord refuses every message, whatever else is granted."""
    permissions = interaction.app_permissions
    if isinstance(interaction.channel, discord.Thread):
        sends = permissions.send_messages_in_threads
    else:
        sends = permissions.send_messages
    return permissions.view_channel and sends


def history_note(interaction: discord.Interaction, watch: Watch) -> str:
    """`/watch add`'s word on a place whose history the bot may not read (the interaction's
    `app_permissions`; in a thread Discord resolves them from its parent's, so that is where
    to grant it): without Read Message History Discord answers the history with an empty list,
    so `find` would not see a digest already posted and a task run again after a long outage
    would post it twice. Empty when it may read it, and in a DM (no permissions to grant)."""
    if interaction.guild_id is None:
        return ""
    channel = interaction.channel
    grant = channel.parent_id if isinstance(channel, discord.Thread) else watch.channel
    return unreadable_note(interaction.app_permissions, watch.channel, grant)


def unreadable_note(permissions: discord.Permissions, channel: str, grant: int | str) -> str:
    """The word on a watch's `channel` where the bot may not read the history (`permissions`
    there): what to grant, in `grant` (a thread's parent); empty when it may. Said by
    `/watch add` (`history_note`) and to a watch made by a mention or resumed (`note`)."""
    if permissions.read_message_history:
        return ""
    return HISTORY_UNREADABLE.format(channel=channel, grant=grant)


def created_reply(watch: Watch, elsewhere: bool, note: str) -> str:
    """`/watch add`'s answer, under Discord's 2,000 characters (else Discord refuses it, the
    person sees "The application did not respond" and asking again makes a second watch):
    the note whole, the watch's description cut (an author or category field may hold 6,000
    characters)."""
    tail = f" {note}" if note else ""
    return fitted(created_text(watch, elsewhere=elsewhere) + tail, watch)


def fitted(text: str, watch: Watch) -> str:
    """A command's answer about `watch` under Discord's 2,000 characters: the watch's
    description in it cut, the rest (its id, how to stop it, a note) kept whole."""
    over = len(text) - LIMIT
    if over <= 0:
        return text
    described = describe(watch)  # what the answer says of the watch
    return text.replace(described, shortened(described, len(described) - over), 1)


def listed_reply(watches: Sequence[Watch], line: ListLine) -> str:
    """`/watch list`'s answer under Discord's 2,000 characters (else Discord refuses it and the
    person sees no list), each watch's id and state (a paused one's `/watch resume id`) kept
    whole while they fit: the descriptions are cut first, to one equal share (`_shrunk`);
    only when even their ids and states do not fit are watches left out, the paused ones
    kept first, the answer saying how many more and how to see them (`MORE_LISTED`)."""
    if (shown := _shrunk(watches, line, LIMIT)) is not None:
        return "\n".join(shown)
    room = LIMIT - len(MORE_LISTED.format(count=len(watches))) - 1
    kept: set[str] = set()
    used = -1  # no newline before the first line
    for watch in sorted(watches, key=lambda w: not w.paused):  # stable: the paused first
        if used + len(line(watch, "")) + 1 <= room:
            kept.add(watch.id)
            used += len(line(watch, "")) + 1
    listed = [w for w in watches if w.id in kept]
    lines = _shrunk(listed, line, room) or []
    return "\n".join([*lines, MORE_LISTED.format(count=len(watches) - len(listed))])


def _shrunk(watches: Sequence[Watch], line: ListLine, room: int) -> list[str] | None:
    """The watches' lines within `room` characters, their descriptions cut inside the lines
    (the ids and states whole) to the longest share of all that fits, a shorter description
    whole; a share under LISTED_AT_LEAST leaves them out. None when even that does not fit."""
    described = [describe(watch) for watch in watches]

    def lines(most: int) -> list[str]:
        return [line(w, _cut(d, most)) for w, d in zip(watches, described, strict=True)]

    def size(shown: list[str]) -> int:
        return sum(len(each) + 1 for each in shown) - 1

    low, high = 0, max((len(d) for d in described), default=0)
    if size(lines(low)) > room:
        return None
    while low < high:  # the longest share that fits: the size grows with it
        middle = (low + high + 1) // 2
        low, high = (middle, high) if size(lines(middle)) <= room else (low, middle - 1)
    return lines(low)


def _cut(described: str, most: int) -> str:
    """A description in `/watch list` cut to `most` characters; "" under LISTED_AT_LEAST."""
    return "" if most < LISTED_AT_LEAST else shortened(described, most)


def cannot_read(permissions: discord.Permissions) -> list[str]:
    """The permissions the bot lacks to read a place's history, by their names in Discord."""
    needed = (
        ("View Channel", permissions.view_channel),
        ("Read Message History", permissions.read_message_history),
    )
    return [name for name, granted in needed if not granted]


def interaction_webhook(client: discord.Client, application_id: int, token: str) -> discord.Webhook:
    """The follow-up webhook of an interaction answered in another process (or before a
    restart), from its application id and token: the same object `Interaction.followup`
    builds. discord.py has no public constructor for an *application* webhook (the only kind
    that may send ephemeral messages: `Webhook.from_url` makes an incoming one), so this one
    function uses the client's connection state, as `Interaction.followup` does."""
    data = {"id": application_id, "type": 3, "token": token}
    return discord.Webhook.from_state(data=data, state=client._connection)


class DigestSaveButton(discord.ui.DynamicItem[discord.ui.Button], template=TEMPLATE):
    """A paper's Save button; rebuilt from its custom id whenever it is pressed."""

    def __init__(self, arxiv_id: str, number: int = 0) -> None:
        label = f"Save {number} to team knowledge base" if number else "Save to team knowledge base"
        super().__init__(
            discord.ui.Button(
                label=label, style=discord.ButtonStyle.success,
                custom_id=f"digest:save:{arxiv_id}",
            )
        )  # fmt: skip
        self.arxiv_id = arxiv_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Button, match: re.Match[str]
    ) -> DigestSaveButton:
        return cls(match["arxiv_id"])

    async def callback(self, interaction: discord.Interaction) -> None:
        watches: WatchService = interaction.client.adapter.handler.watches  # type: ignore[attr-defined]
        try:
            arxiv_id = check_arxiv_id(self.arxiv_id)
        except IngestError as exc:
            await interaction.response.send_message(str(exc), ephemeral=True)
            return
        await interaction.response.send_message(saving_text(arxiv_id), ephemeral=True)
        reply = {"application_id": str(interaction.application_id), "token": interaction.token}
        try:
            await watches.queue_save(
                "discord", discord_tenant(interaction), arxiv_id, str(interaction.user.id), reply
            )
        except Exception as exc:  # memory down: the person presses again later
            log.warning("could not queue a Save: %r", exc)
            await interaction.followup.send(NOT_QUEUED, ephemeral=True)


async def _said(answer: Callable[[], Awaitable[str]]) -> Reply:
    """A command's answer (only to the person), or what went wrong (Redis away, Discord not
    saying who sees the channel): an interaction is not sent again."""
    try:
        return await answer(), True
    except PlaceUnknown as exc:  # Discord did not say where: try again
        return str(exc), True
    except Exception as exc:
        log.warning("/watch failed: %r", exc)
        return UNREACHABLE, True


async def respond(
    interaction: discord.Interaction, reply: Awaitable[Reply], *, public: bool = False,
    within: float = ANSWER_WITHIN_SECONDS,
) -> None:  # fmt: skip
    """Answer with `reply` if it is ready `within` seconds; else defer ("thinking…", only to
    the person unless the answer is `public`) before Discord's 3 s are up and let the work
    finish: a hanging Redis then answers by the follow-up, never "The application did not
    respond", and work that succeeds late (a watch made) is said, never cut off and asked
    again (a second watch). A reply only for the person after a public "thinking…" (an
    invalid watch, Redis away) is not shown to the channel (`tell_privately`)."""
    work = asyncio.ensure_future(reply)
    done, _ = await asyncio.wait({work}, timeout=within)
    if work in done:
        text, ephemeral = work.result()
        await interaction.response.send_message(text, ephemeral=ephemeral)
        return
    if not await defer(interaction, "/watch", ephemeral=not public):
        await work  # too late already: the work still finishes
        return
    text, ephemeral = await work
    if public and ephemeral:  # a follow-up would fill the channel's "thinking…", shown there
        await tell_privately(interaction, text, "/watch")
        return
    try:
        await interaction.followup.send(text, ephemeral=ephemeral)
    except discord.HTTPException as exc:
        log.warning("/watch could not send its answer: %r", exc)


def marker_tag(marker: str) -> str:
    """The digest's marker (its watch and period) as its footer shows it: what `find` looks
    for in the channel's history, as Discord keeps no nonce there."""
    return f"(digest {marker})"


def digest_message(digest: Digest, marker: str = "") -> str:
    """The digest as one Discord message (Markdown, under 2,000 characters), its footer (with
    the `marker`, which keeps a digest from being posted twice: `find`) always whole: the
    watch's topic and description are capped (a watch of sixty authors), and each paper is
    cut to what the head, the footer and the blank lines between the parts leave, or left out
    when nothing is left."""
    watch = digest.watch
    topic = shortened(watch.query or ", ".join(watch.categories + watch.authors), WATCH_TEXT_LIMIT)
    head = (
        f"**New on “{topic}”**: {len(digest.items)} of {digest.found} papers submitted since "
        f"{when(digest.since)}" + (f". {capped_note(digest)}" if digest.capped else "")
    )
    described = shortened(describe(watch), WATCH_TEXT_LIMIT)
    foot = f"-# Watch `{watch.id}`: {described}. `/watch remove {watch.id}` stops it."
    if marker:
        foot += f" {marker_tag(marker)}"
    left = LIMIT - len(head) - len(foot) - len(SEPARATOR)  # for the papers, each with its own
    room = max(0, left // max(1, len(digest.items)) - len(SEPARATOR))
    parts = []
    for n, item in enumerate(digest.items, 1):
        paper = item.paper
        link = paper.url or f"https://arxiv.org/abs/{paper.arxiv_id}"
        part = (
            f"**{n}. [{paper.title[:150]}](<{link}>)**\n{short_authors(paper.authors)} · "
            f"arXiv:{paper.arxiv_id}\n{item.why}"
        )
        if room > 1:  # else nothing is left of it (a part is never one character)
            parts.append(shortened(part, room))
    return SEPARATOR.join([head, *parts, foot])


def digest_view(digest: Digest) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    for n, item in enumerate(digest.items, 1):
        view.add_item(DigestSaveButton(item.paper.arxiv_id, n))
    return view


ChannelOf = Callable[[int], Awaitable[Any]]
ById = Callable[[discord.Interaction, str], Awaitable[None]]  # a command on one watch's id
ScopeOf = Callable[[discord.Interaction], Awaitable[Scope]]


class DiscordWatches:
    """The Discord poster of digests, the `/watch` commands and the Save buttons."""

    def __init__(
        self, watches: WatchService | None, client: discord.Client, channel_of: ChannelOf,
        admins: Admins | None = None,
    ) -> None:  # fmt: skip
        """`admins`: ARXIVSCOUT_ADMINS, as the memory page reads it."""
        self.watches = watches
        self.client = client
        self.channel_of = channel_of
        self.admins = admins
        self.unreadable: set[int] = set()  # channels `find` warned of: once each, per process
        self.refused: set[int] = set()  # ... whose history read Discord refused: ditto

    def register(self, tree: app_commands.CommandTree, scope_of: ScopeOf) -> None:
        if self.watches is None:
            return
        self.watches.attach("discord", self)
        self.client.add_dynamic_items(DigestSaveButton)
        tree.add_command(self.commands(scope_of))

    def commands(self, scope_of: ScopeOf) -> app_commands.Group:
        group = app_commands.Group(name="watch", description="New arXiv papers on a topic, here")
        watches = self.watches

        async def here(interaction: discord.Interaction) -> tuple[Scope, WatchPlace]:
            """Where the command acts, as a mention there would (`WatchCommands.home`): a
            public thread the bot opened gives its channel (and its own watches too)."""
            asked = WatchPlace("discord", str(interaction.channel_id))
            scope, place = await watches.commands.home(await scope_of(interaction), asked)
            return scope, place or asked

        @group.command(name="add", description="Post a digest of new papers on a topic here")
        @app_commands.describe(
            topic="what to watch, e.g. state-space models",
            period="daily, weekly, or every N days (default daily)",
            category="arXiv categories, e.g. cs.CL or cs.LG cs.AI", author="an author's name",
        )  # fmt: skip
        async def add(
            interaction: discord.Interaction, topic: str,
            period: app_commands.Range[str, 1, PERIOD_TYPED] = "daily",
            category: str | None = None, author: str | None = None,
        ) -> None:  # fmt: skip
            seconds = parse_period(period)
            if seconds is None:  # else it would fold into the topic
                await interaction.response.send_message(bad_period(period), ephemeral=True)
                return
            # the fields as they are: the topic is never re-read for a period ("weekly
            # seasonality forecasting" stays the topic of a daily watch); the category field
            # may name several ("cs.LG cs.AI", "cs.LG, cs.AI": each its own `cat:`), an
            # author is one name whole
            request = WatchRequest(
                " ".join(topic.split()), seconds,
                [c for c in re.split(r"[\s,]+", category or "") if c],
                [a for a in [" ".join((author or "").split())] if a],
            )  # fmt: skip
            if not can_send(interaction):
                await interaction.response.send_message(CANNOT_POST, ephemeral=True)
                return

            async def made() -> Reply:
                try:
                    scope, place = await here(interaction)
                    if isinstance(interaction.channel, discord.Thread):  # found if its parent goes
                        await watches.memory.governance.places.note_thread(
                            scope.tenant, str(interaction.channel.parent_id),
                            str(interaction.channel.id),
                        )  # fmt: skip
                    watch = await watches.create(scope, request, place)
                except (InvalidWatch, PlaceUnknown) as exc:
                    return str(exc), True
                except Exception as exc:  # Redis away: say so
                    log.warning("/watch add failed: %r", exc)
                    return UNREACHABLE, True
                note = history_note(interaction, watch)  # made all the same: what to grant
                return created_reply(watch, bool(place.asked), note), False

            await respond(interaction, made(), public=True)

        @group.command(name="list", description="The topic watches of this channel")
        async def listing(interaction: discord.Interaction) -> None:
            async def listed() -> str:
                return await watches.list_text(*await here(interaction), fit=listed_reply)

            await respond(interaction, _said(listed))

        def by_id(text_of: Callable[..., Awaitable[str]]) -> ById:
            """remove, pause or resume (`resume` checked where the watch posts: `can_post`)."""

            async def command(interaction: discord.Interaction, watch_id: str) -> None:
                async def done() -> str:
                    scope, place = await here(interaction)
                    return await text_of(scope, watch_id, place, admin_of(interaction, self.admins))

                await respond(interaction, _said(done))

            return command

        @group.command(name="remove", description="Stop a topic watch")
        @app_commands.describe(watch_id="the watch's id, as /watch list shows it")
        async def remove(interaction: discord.Interaction, watch_id: str) -> None:
            await by_id(watches.remove_text)(interaction, watch_id)

        @group.command(name="pause", description="Pause a topic watch of this channel")
        @app_commands.describe(watch_id="the watch's id, as /watch list shows it")
        async def pause(interaction: discord.Interaction, watch_id: str) -> None:
            await by_id(watches.pause_text)(interaction, watch_id)

        @group.command(name="resume", description="Resume a paused topic watch of this channel")
        @app_commands.describe(watch_id="the watch's id, as /watch list shows it")
        async def resume(interaction: discord.Interaction, watch_id: str) -> None:
            await by_id(watches.resume_text)(interaction, watch_id)

        self.callbacks = {"add": add, "list": listing, "remove": remove, "pause": pause,
                          "resume": resume}  # fmt: skip
        return group

    # -- the Poster ------------------------------------------------------------------------

    async def post(self, watch: Watch, digest: Digest, marker: str) -> str:
        channel = await self.channel_of(int(watch.channel))
        if channel is None:
            raise Undeliverable(f"Discord channel {watch.channel} is gone or hidden")
        if not of_tenant(channel, watch.tenant):
            raise ForeignPlace(foreign_message(watch.channel, watch.tenant))
        try:
            message = await channel.send(
                digest_message(digest, marker), view=digest_view(digest),
                nonce=marker[:NONCE_LIMIT],
                allowed_mentions=discord.AllowedMentions.none(), suppress_embeds=True,
            )  # fmt: skip
        except (discord.Forbidden, discord.NotFound) as exc:
            raise Undeliverable(f"Discord refused the digest in {watch.channel}: {exc}") from exc
        return str(message.id)

    async def walled(self, watch: Watch) -> bool:
        """The watch's channel is private now (its permissions hide it from @everyone since the
        watch was made, a private thread), or Discord cannot say (fails closed): its digest is
        read as a walled place's, never naming a PDF shared in a public channel. A channel
        gone or hidden from the bot is refused here, before arXiv is asked (Undeliverable)."""
        try:
            channel = await self.channel_of(int(watch.channel))
        except (ValueError, discord.HTTPException) as exc:
            log.info("Discord could not show channel %s (%r): walled", watch.channel, exc)
            return True
        if channel is None:  # as `post` would say, without fetching it again first
            raise Undeliverable(f"Discord channel {watch.channel} is gone or hidden")
        found = await resolve_visibility(self.client, channel, int(watch.channel))
        return found is not Visibility.PUBLIC

    async def find(self, watch: Watch, marker: str, since: float) -> str | None:
        """The bot's digest message with this marker in its footer, posted since a minute
        before `since` (its "posting"), from the channel's history: a digest task run again
        after a crash or an outage longer than Discord keeps a nonce (minutes) finds it
        rather than posting it twice. A channel gone finds none (the post then says); so does
        one whose history the bot may not read: when none is found, `warn_if_unreadable` warns
        if that is why (the post then relies on the nonce); a read Discord refuses (Missing
        Access, Unknown Channel) finds none too, warned of once per channel while it lasts
        (`refused`: every digest task there would warn). The history is read whatever the
        cache says of the bot's permissions: a stale cache must not cost a double post.
        Discord failing in passing raises (the task is tried again)."""
        me = self.client.user
        if me is None:  # not logged in: cannot tell its own messages, tried again later
            raise RuntimeError("Discord client not ready: cannot look for a posted digest")
        channel = await self.channel_of(int(watch.channel))
        if channel is None or not of_tenant(channel, watch.tenant):
            return None
        after = datetime.fromtimestamp(since - FIND_SECONDS, tz=UTC)
        tag = marker_tag(marker)
        try:
            async for message in channel.history(limit=FIND_LIMIT, after=after):
                if message.author.id == me.id and tag in message.content:
                    self.refused.discard(channel.id)
                    return str(message.id)
        except (discord.Forbidden, discord.NotFound) as exc:
            again = channel.id in self.refused  # warned once per channel while it lasts
            self.refused.add(channel.id)
            log.log(logging.DEBUG if again else logging.WARNING,
                    "could not read %s's history for digest %s: %r", watch.channel, marker,
                    exc)  # fmt: skip
            return None
        self.refused.discard(channel.id)
        await self.warn_if_unreadable(channel)  # found none: say so if it could not see any
        return None

    async def warn_if_unreadable(self, channel: Any) -> None:
        """Warn when the bot may not read the history of a server's channel (or thread: its
        parent's permissions), from the cache. Without Read Message History Discord answers
        the history with an empty list, no error (without View Channel, a 403), so `find`
        would find nothing in silence and a digest task run again after a long outage would
        post twice: a warning names the channel and what to grant, once per channel (while
        it lasts) per process. A DM, or what the cache cannot settle (the bot's member or
        the server's roles unknown, a thread's parent Discord fails to show), warns of
        nothing."""
        permissions = await self._bot_permissions(channel)
        if permissions is None:
            return
        thread = isinstance(channel, discord.Thread)
        missing = cannot_read(permissions)
        if not missing:
            self.unreadable.discard(channel.id)
        elif channel.id not in self.unreadable:
            self.unreadable.add(channel.id)
            log.warning(
                "cannot read the history of Discord channel %s (missing %s): a digest task run "
                "again after an outage cannot find a digest already posted there and may post "
                "it twice; grant the bot %s in %s",
                channel.id, " and ".join(missing), " and ".join(missing),
                f"its parent channel {channel.parent_id}" if thread else "that channel",
            )  # fmt: skip

    async def _bot_permissions(self, channel: Any) -> discord.Permissions | None:
        """The bot's permissions in a server's channel (a thread: its parent's), from the
        cache, but for a thread whose parent the cache lacks: that parent is fetched over
        HTTP (`_in_thread`). None in a DM, or when they cannot be settled (the bot's member
        or the server's roles unknown, a thread's parent Discord fails to show)."""
        guild = getattr(channel, "guild", None)
        me = guild.me if guild is not None else None
        if me is None or guild.default_role is None:
            return None
        try:
            if isinstance(channel, discord.Thread):
                return await self._in_thread(channel, me)
            return channel.permissions_for(me)
        except discord.HTTPException:
            return None

    async def note(self, place: WatchPlace) -> str:
        """`PlaceNotes`: a watch made by a mention or resumed is told what to grant where it
        posts, as `/watch add` is (`history_note`), from the bot's permissions there
        (`_bot_permissions`: a thread's are its parent's, granted there). Nothing in a DM, nor
        when the cache or Discord cannot say now (the watch is made or resumed all the same;
        what else fails, e.g. a timeout, `WatchCommands._note` drops). Not from a resuming
        interaction's `app_permissions`, though fresher: bot/ asks for the note by the place
        alone."""
        try:
            channel = await self.channel_of(int(place.channel))
        except (ValueError, discord.HTTPException):
            return ""
        permissions = None if channel is None else await self._bot_permissions(channel)
        if permissions is None:
            return ""
        grant = channel.parent_id if isinstance(channel, discord.Thread) else place.channel
        return unreadable_note(permissions, place.channel, grant)

    def fit(self, text: str, watch: Watch) -> str:
        """`FitsAnswers`: pause, remove and resume answers under Discord's 2,000 characters."""
        return fitted(text, watch)

    async def home(self, place: WatchPlace) -> WatchPlace:
        """Where a watch made at `place` (by a mention or `/watch`) posts: a public thread the
        bot opened for a mention (it owns it) gives its channel, where the mention was (the
        thread is only the conversation and archives when quiet; `/watch list` in the channel
        finds the watch). A private thread stays itself: its watch must not reach the
        parent's wider audience. Any other place, or one gone or hidden from the bot, is
        itself; Discord failing in passing (a 5xx, a 429) raises PlaceUnknown, rather than
        making the watch in the thread."""
        me = self.client.user
        try:
            channel = await self.channel_of(int(place.channel))
        except (ValueError, discord.NotFound, discord.Forbidden) as exc:
            log.info("Discord could not show %s (%r): the watch posts there", place.channel, exc)
            return place
        except discord.HTTPException as exc:
            log.warning("Discord did not show %s: %r", place.channel, exc)
            raise PlaceUnknown(DISCORD_SILENT) from exc
        if (
            me is not None
            and isinstance(channel, discord.Thread)
            and channel.type is discord.ChannelType.public_thread
            and channel.owner_id == me.id
        ):
            return WatchPlace(place.platform, str(channel.parent_id))
        return place

    async def can_post(self, place: WatchPlace, tenant: str) -> str:
        """Whether the bot may send in the watch's channel now, from the channel as the client
        has it (fetched when not cached): a watch resumed or made from elsewhere (an admin's
        command, a mention) is checked where it posts, not where it was asked, so the answer
        names that channel. A channel not of `tenant` (another server's; for a DM tenant, any
        but its person's DM with the bot) is refused (`NOT_OURS`): an imported watch may name
        any channel. When Discord cannot say (no member object for the bot, an HTTP error), the
        post itself is the check (the tenant's too): a refused digest pauses the watch and
        tells its creator."""
        try:
            channel = await self.channel_of(int(place.channel))  # None: gone, or hidden
        except ValueError:
            channel = None
        except discord.HTTPException:  # Discord unsure now: the post will say
            return ""
        if channel is None:
            return CANNOT_SEE
        if not of_tenant(channel, tenant):
            log.warning("refused a watch of %s in channel %s: %s", tenant, place.channel,
                        foreign_message(place.channel, tenant))  # fmt: skip
            return not_ours(place.channel, tenant)
        guild = getattr(channel, "guild", None)
        me = guild.me if guild is not None else None
        if me is None:  # a DM, or a server whose member list lacks the bot
            return ""
        if not isinstance(channel, discord.Thread):
            allowed, permission = channel.permissions_for(me).send_messages, "Send Messages"
        else:
            try:
                permissions = await self._in_thread(channel, me)
            except discord.HTTPException:  # its parent could not be fetched: the post will say
                return ""
            allowed, permission = permissions.send_messages_in_threads, "Send Messages in Threads"
        return "" if allowed else CANNOT_POST_IN.format(channel=channel.id, permission=permission)

    async def _in_thread(self, thread: discord.Thread, me: discord.Member) -> discord.Permissions:
        """The bot's permissions in `thread`, which are its parent channel's. discord.py
        resolves them from the cached parent and raises ClientException when the parent is
        not cached: then the parent is fetched (a forum too, which `channel_of` leaves out as
        not messageable), as adapters/discord_platform.py `visibility` does, rather than
        letting the post decide: a real answer now beats a watch resumed only to be paused
        again."""
        try:
            return thread.permissions_for(me)
        except discord.ClientException:  # the parent is not cached
            parent = await self.client.fetch_channel(thread.parent_id)
        permissions = parent.permissions_for(me)
        return permissions if permissions.view_channel else discord.Permissions.none()

    async def tell(self, watch: Watch, text: str) -> None:
        """A DM to the watch's creator, only if they are of its tenant (a member of its server;
        for a DM tenant, its person): an imported watch's `created_by` is whatever its file
        said, and must not make the bot write to a stranger."""
        if not watch.created_by:
            return
        if not await self._member(watch.tenant, watch.created_by):
            log.warning("watch %s of %s: not telling %s, not of the tenant", watch.id,
                        watch.tenant, watch.created_by)  # fmt: skip
            return
        dm = await self.client.create_dm(discord.Object(int(watch.created_by)))
        await dm.send(text, allowed_mentions=discord.AllowedMentions.none())

    async def _member(self, tenant: str, user: str) -> bool:
        """`user` is of `tenant`: its DM tenant's person, or a member of its server (from the
        cache, else asked of Discord: not a member, or Discord cannot say, is no)."""
        if not user.isdigit():
            return False
        kind = tenant_kind(tenant)
        if kind is TenantKind.DISCORD_DM:
            return tenant == f"dm-{user}"
        if kind is not TenantKind.DISCORD_SERVER:
            return False
        try:
            guild = self.client.get_guild(int(tenant)) or await self.client.fetch_guild(
                int(tenant), with_counts=False
            )
            if guild.get_member(int(user)) is not None:
                return True
            await guild.fetch_member(int(user))
        except discord.NotFound:
            return False
        except discord.HTTPException as exc:
            log.warning("could not tell whether %s is of %s: %r", user, tenant, exc)
            return False
        return True

    async def notice(self, watch: Watch, text: str) -> None:
        channel = await self.channel_of(int(watch.channel))
        if channel is not None and of_tenant(channel, watch.tenant):
            await channel.send(text, allowed_mentions=discord.AllowedMentions.none())

    async def answer(self, reply: dict[str, Any], text: str) -> None:
        """The interaction's follow-up (valid 15 minutes), ephemeral, from any process."""
        webhook = interaction_webhook(self.client, int(reply["application_id"]), reply["token"])
        await webhook.send(text, ephemeral=True)
