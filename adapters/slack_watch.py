"""Slack's side of topic watches (bot/watches.py and its parts): `/watch`, the digest message, its buttons.

- `/watch <topic> [daily|weekly|every N days] [cat:cs.CL] [author:Name]` makes a watch that
  posts to the channel it was used in; `/watch list`, `/watch remove|pause|resume <id>` (only
  from that channel, but for the workspace's admins and owners, or ARXIVSCOUT_ADMINS: from
  anywhere, as the memory page decides who is an admin). A mention "watch … weekly" does the
  same, through the turn handler (bot/watch_texts.py `chat_command`; there, only from the
  watch's channel).
- A digest is one message (Block Kit, adapters/slack_digest.py) with a Save button per paper;
  if Slack refuses its blocks (UNSHOWABLE, our bug: logged as an error), it is posted once
  more as its plain text, saying its buttons could not be shown.
  The message carries metadata naming its watch and period, so a digest task run again after a
  crash finds it in the channel's history instead of posting it twice.
- A pressed Save is queued as a durable task and answered where it was pressed, only to the
  person (response_url): "Saving …", then "Saved … (N passages)".
- A watch is made only where the bot is a member (`conversations.info`): elsewhere its digests
  would be refused (`not_in_channel`), so `/watch` answers "invite me first". A digest refused
  later for good by its place (the bot removed, posting restricted: `UNDELIVERABLE`) pauses
  the watch, and its creator is told in a direct message what to do (`conversations.open`; an
  ephemeral message needs the bot in the channel too). An app-wide error (the token revoked, a
  scope missing) or the digest's own shape refused pauses nothing: retried, then dead-lettered.
- A watch posts only in a channel of its tenant's workspace (`foreign_reason`: conversations.info
  names the workspaces a channel is of; a Slack Connect channel shared with ours is ours too),
  checked when it is made or resumed (`can_post` with the tenant) and before every digest or
  notice (an imported watch may name any channel: it is paused, never posted there). Only a
  person of the workspace is told of a refused digest (`tell`: users.info), never whoever an
  imported file named as its creator.
- A digest names only the saved papers its channel may read now: one shared with another
  organisation or made private since the watch was made (or that Slack cannot describe) reads
  as a walled place (`walled`: conversations.info asked afresh at every digest, not the cache,
  which another process's `channel_shared` did not empty; bot/watch_digest.py `PlaceWalls`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.memory_page.access import Admins
from adapters.platform_ids import TenantKind, slack_team, tenant_kind
from adapters.slack_delivery import UNSHOWABLE, marked_post, slack_error
from adapters.slack_digest import SAVE_ACTION, digest_blocks, digest_fallback
from adapters.slack_org import (
    OrganisationUnknown,
    enterprise_of,
    outsider,
    same_organisation,
    workspace_admin,
)
from adapters.slack_walls import SlackWalls
from bot.watch_commands import AdminUnknown
from bot.watch_digest import ChannelArchived, PostingRestricted
from bot.watches import (
    NOT_QUEUED,
    UNREACHABLE,
    ForeignPlace,
    Undeliverable,
    WatchPlace,
    WatchService,
    saving_text,
)
from memory.digest import Digest
from memory.ingest.arxiv_source import check_arxiv_id
from memory.ingest.errors import IngestError
from memory.scope import Scope, Visibility
from memory.stores.watches import Watch

log = logging.getLogger(__name__)

METADATA_EVENT = "arxivscout_digest"
ADMIN_CHECK_SECONDS = 2.0  # of Slack's 3 s to answer a slash command
ADMIN_UNKNOWN = "Slack did not say in time whether you are an admin here: try again in a minute."
ANSWER_SECONDS = 2.5  # all `/watch` asks Slack before its answer (Slack waits 3 s for it)
TOO_SLOW = (
    "Slack is answering me too slowly right now, so I did nothing: try `/watch` again in a minute."
)
CANNOT_TELL = (
    "Slack did not say in time whether I am in this channel, so I did nothing: try again in a "
    "minute."
)
# when the running `/watch` must be answered (loop time): Slack is asked nothing past it
_ANSWER_BY: ContextVar[float | None] = ContextVar("answer_by", default=None)
# Slack's refusals of the watch's place that no retry changes: the channel is gone or closed to
# the bot (and `restricted_action…`: posting there is restricted, `PostingRestricted`); the
# watch is paused and its creator told (bot/watch_digest.py `_refused`; `is_archived`:
# `ChannelArchived`, unarchived rather than invited). An app-wide error (a
# revoked token, a missing scope) pauses nothing: retried, then dead-lettered, as it is fixed
# once for every watch (and `tell` would need the same token).
UNDELIVERABLE = {"channel_not_found", "not_in_channel", "is_archived", "account_inactive"}
# Slack refuses the digest's own shape: the bot's bug, not the place's; logged and retried (a
# digest whose blocks are refused, UNSHOWABLE, is posted once more as its plain text)
SHAPE_ERRORS = {
    "invalid_blocks", "invalid_blocks_format", "invalid_metadata_format",
    "invalid_metadata_schema", "metadata_too_large", "msg_too_long",
}  # fmt: skip
# said in a digest posted as plain text (Slack refused its blocks)
BUTTONS_UNSHOWN = "(Slack would not show this digest's links and Save buttons: its titles only.)"
NOT_OURS = (  # `can_post`: the watch's channel is another workspace's
    "<#{channel}> is not a channel of this workspace, so I will not post this watch's digests "
    "there: make the watch again in one of this workspace's channels (and `/watch remove` this "
    "one)."
)


NOT_IN = (  # `can_post`: named, as it may be asked from another channel (an admin's resume)
    "I am not in <#{channel}>, so Slack would refuse this watch's digests there: invite me "
    "first (`/invite @ArxivScout` there), then ask again."
)
ARCHIVED = (
    "<#{channel}> is archived, so Slack would refuse this watch's digests there: unarchive it "
    "first, then ask again."
)


def _asked_by(seconds: float) -> float:
    """When a question to Slack must be answered: in `seconds`, and by `/watch`'s answer."""
    by = asyncio.get_running_loop().time() + seconds
    answer_by = _ANSWER_BY.get()
    return by if answer_by is None else min(by, answer_by)


def not_a_workspace(tenant: str) -> bool:
    """A tenant no Slack workspace can be: a Discord server's (digits) or a Discord person's
    DMs (`dm-<id>`); a Slack team id is neither."""
    return tenant_kind(tenant) is not TenantKind.SLACK


def foreign_reason(info: dict[str, Any], tenant: str) -> str:
    """Why a conversation (conversations.info) is not of the workspace `tenant`, or "". Slack
    names the workspace it answers for (`context_team_id`), the host of a shared channel
    (`conversation_host_id`) and the workspaces it is shared with (`shared_team_ids`, and in
    an Enterprise Grid org `internal_team_ids`, with Slack Connect `connected_team_ids`): the
    tenant must be one of them. A channel hosted by another organisation and shared with the
    tenant's workspace is the tenant's too (its people are in it; bot/watch_digest.py
    `PlaceWalls` keeps its digest to what a shared place may read). An answer that names no
    workspace at all (older Slack answers) leaves only the tenant's own shape to check."""
    named = [info.get("context_team_id"), info.get("conversation_host_id")]
    for field in ("shared_team_ids", "internal_team_ids", "connected_team_ids"):
        named += info.get(field) or []
    teams = {team for team in named if isinstance(team, str) and team}
    if not_a_workspace(tenant):
        return "is not of a Slack workspace's memory"
    if teams and tenant not in teams:
        return "is of another workspace"
    return ""


class SlackWatches:
    """The Slack poster of digests, and the listeners of `/watch` and the Save button."""

    def __init__(
        self, watches: WatchService | None, client: AsyncWebClient,
        admins: Admins | None = None, walls: SlackWalls | None = None,
    ) -> None:  # fmt: skip
        """`admins`: ARXIVSCOUT_ADMINS, as the memory page reads it; `walls`: the adapter's
        (its cache of people and of the workspace's organisation; a digest's channel is asked
        afresh: `walled`)."""
        self.watches = watches
        self.client = client
        self.admins = admins or Admins()
        self.walls = walls or SlackWalls(client)
        self.scope_of: Callable[[dict], Awaitable[Scope]] | None = None

    def register(self, app: AsyncApp, scope_of: Callable[[dict], Awaitable[Scope]]) -> None:
        """Post this process's Slack digests; listen to `/watch` and the Save buttons.
        `scope_of`: the scope of a slash command (the adapter's)."""
        if self.watches is None:
            return
        self.scope_of = scope_of
        self.watches.attach("slack", self)
        app.command("/watch")(self.on_command)
        app.action(SAVE_ACTION)(self.on_save)

    # -- listeners -------------------------------------------------------------------------

    async def on_command(self, ack, command: dict) -> None:
        """Answered within ANSWER_SECONDS: Slack is asked (the scope, may the bot post there,
        is the person an admin) up to then; what it has not said by then is "try again", said
        before any watch is made or changed. Memory is not cut short: a write is never half
        done."""
        answer_by = asyncio.get_running_loop().time() + ANSWER_SECONDS
        try:
            async with asyncio.timeout_at(answer_by):  # its questions go on, cached for later
                scope = await self.scope_of(command)
        except TimeoutError:
            log.warning("/watch not answered in time: Slack was slow to say who and where")
            await ack(response_type="ephemeral", text=TOO_SLOW)
            return
        text = command.get("text", "")

        async def admin() -> bool:  # asked only for a watch of another channel
            return await self.is_admin(scope.tenant, scope.user)

        bound = _ANSWER_BY.set(answer_by)
        try:
            place = WatchPlace("slack", scope.channel)
            answer = await self.watches.command(scope, text, place, admin=admin)
        except Exception as exc:  # a command is not sent again: say what happened
            log.warning("/watch failed: %r", exc)
            answer = UNREACHABLE
        finally:
            _ANSWER_BY.reset(bound)
        made = answer.startswith("Watching ")
        await ack(response_type="in_channel" if made else "ephemeral", text=answer)

    async def is_admin(self, team: str, user: str) -> bool:
        """A workspace admin or owner, or named in ARXIVSCOUT_ADMINS, by the memory page's rule
        (adapters/slack_org.py `workspace_admin`: never a guest or someone of another
        organisation, whatever Slack flags them): manages every channel's watches. users.info
        (and, for a flagged person of another workspace, the workspace's organisation), within
        ADMIN_CHECK_SECONDS and the command's answer time (Slack's 3 s); AdminUnknown when
        Slack cannot say."""
        if self.admins.named(team, user):
            return True
        try:
            async with asyncio.timeout_at(_asked_by(ADMIN_CHECK_SECONDS)):
                found = (await self.client.users_info(user=user)).get("user") or {}
                return await workspace_admin(found, lambda: self.walls.organisation(team))
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError,
                OrganisationUnknown) as exc:  # fmt: skip
            log.warning("could not tell whether %s is an admin: %r", user, exc)
            raise AdminUnknown(ADMIN_UNKNOWN) from None

    async def on_save(self, ack, body: dict, respond) -> None:
        await ack()
        action = (body.get("actions") or [{}])[0]
        team = slack_team(body)
        user = (body.get("user") or {}).get("id", "")
        reply = {"response_url": body.get("response_url", ""),
                 "channel": (body.get("channel") or {}).get("id", ""), "user": user}  # fmt: skip
        try:
            arxiv_id = check_arxiv_id(action.get("value", ""))
        except IngestError as exc:
            await respond(text=str(exc), response_type="ephemeral", replace_original=False)
            return
        await respond(text=saving_text(arxiv_id), response_type="ephemeral", replace_original=False)
        try:
            await self.watches.queue_save("slack", team, arxiv_id, user, reply)
        except Exception as exc:  # memory down: the person presses again later
            log.warning("could not queue a Save: %r", exc)
            await respond(text=NOT_QUEUED, response_type="ephemeral", replace_original=False)

    # -- the Poster ------------------------------------------------------------------------

    async def post(self, watch: Watch, digest: Digest, marker: str) -> str:
        await self._ours_or_refused(watch)
        where = {
            "channel": watch.channel, "thread_ts": watch.thread or None,
            "metadata": {"event_type": METADATA_EVENT, "event_payload": {"digest": marker}},
            "unfurl_links": False, "unfurl_media": False,
        }  # fmt: skip
        try:
            try:
                response = await self.client.chat_postMessage(
                    **where, text=digest_fallback(digest), blocks=digest_blocks(digest)
                )
            except SlackApiError as exc:
                if slack_error(exc) not in UNSHOWABLE:
                    raise
                # the same blocks would be refused every period: the titles at least, once
                log.error("watch %s of %s: Slack refused the digest's blocks (a bug of the "
                          "bot): %s; posted as plain text", watch.id, watch.tenant,
                          slack_error(exc))  # fmt: skip
                response = await self.client.chat_postMessage(
                    **where, text=digest_fallback(digest, BUTTONS_UNSHOWN)
                )
        except SlackApiError as exc:
            _raise_if_undeliverable(exc, watch)
            raise
        return str(response["ts"])

    async def walled(self, watch: Watch) -> bool:
        """The watch's channel is shared with another organisation now, or private (converted
        since the watch was made), or Slack cannot say (fails closed): its digest is read as a
        walled place's, never naming a PDF shared in a public channel. Asked of Slack afresh,
        not of the cache: a digest is posted for the whole channel, and is rare enough to ask
        (the cache follows `channel_shared` only if Slack's event reached some process).
        Undeliverable when Slack says the channel is gone (refused before arXiv is asked)."""
        place = await self.walls.fresh_place(watch.tenant, watch.channel, gone=UNDELIVERABLE)
        return place.shared or place.visibility is not Visibility.PUBLIC

    async def _channel_info(self, channel: str) -> dict[str, Any]:
        """conversations.info's channel: what `can_post` and `_ours_or_refused` read. Slack's
        errors are the caller's (by `/watch`'s answer time, if one asks)."""
        async with asyncio.timeout_at(_ANSWER_BY.get()):
            return (await self.client.conversations_info(channel=channel))["channel"]

    async def can_post(self, place: WatchPlace, tenant: str) -> str:
        """ "" if digests may be posted in the channel: the bot is in it, and it is of the
        tenant's workspace (`foreign_reason`: an imported watch may name any channel)."""
        try:
            info = await self._channel_info(place.channel)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("could not tell whether I may post in %s: %r", place.channel, exc)
            return CANNOT_TELL
        except SlackApiError as exc:
            error = exc.response.get("error", "")
            return f"I cannot see this conversation ({error}), so I could not post digests here."
        if why := foreign_reason(info, tenant):
            log.warning("refused a watch of %s in %s: %s", tenant, place.channel, why)
            return NOT_OURS.format(channel=place.channel)
        if info.get("is_archived"):  # Slack refuses every post there, the bot's too
            return ARCHIVED.format(channel=place.channel)
        if info.get("is_im") or info.get("is_mpim") or info.get("is_member"):
            return ""
        return NOT_IN.format(channel=place.channel)

    async def _ours_or_refused(self, watch: Watch) -> None:
        """Before any message in the watch's channel: Undeliverable if Slack will not have it
        there, ForeignPlace if it is not of the watch's workspace (never posted there)."""
        try:
            info = await self._channel_info(watch.channel)
        except SlackApiError as exc:
            _raise_if_undeliverable(exc, watch)
            raise
        if why := foreign_reason(info, watch.tenant):
            raise ForeignPlace(f"Slack channel {watch.channel} {why}: not posted there")

    async def tell(self, watch: Watch, text: str) -> None:
        """A DM to the watch's creator, only if they are of its workspace (`_member`): an
        imported watch's `created_by` is whatever its file said, and must not make the bot
        write to a stranger."""
        if not watch.created_by:
            return
        if not await self._member(watch.tenant, watch.created_by):
            log.warning("watch %s of %s: not telling %s, not of the workspace", watch.id,
                        watch.tenant, watch.created_by)  # fmt: skip
            return
        opened = await self.client.conversations_open(users=watch.created_by)
        await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text)

    async def _member(self, tenant: str, user: str) -> bool:
        """`user` is a person of the workspace `tenant` (users.info: their workspace, or one of
        their Enterprise Grid workspaces), not deleted, not a bot, not walled by the bot's own
        rule (adapters/slack_org.py `outsider`: a sister workspace's member of the same
        Grid org is of it); when Slack cannot say, no."""
        if not_a_workspace(tenant):
            return False
        try:
            found = (await self.client.users_info(user=user)).get("user") or {}
            if found.get("deleted") or found.get("is_bot"):
                return False
            if await outsider(found, lambda: self.walls.organisation(tenant)):
                return False
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError,
                OrganisationUnknown) as exc:  # fmt: skip
            log.warning("could not tell whether %s is of %s: %r", user, tenant, exc)
            return False
        teams = {found.get("team_id"), *((found.get("enterprise_user") or {}).get("teams") or [])}
        if tenant in teams:
            return True
        organisation = await self.walls.organisation(tenant)  # a sister workspace's member
        return same_organisation(enterprise_of(found), organisation)

    async def notice(self, watch: Watch, text: str) -> None:
        try:
            await self._ours_or_refused(watch)
        except Undeliverable as exc:  # not said there; the digest's own post will pause it
            log.warning("watch %s of %s: no notice: %s", watch.id, watch.tenant, exc)
            return
        await self.client.chat_postMessage(
            channel=watch.channel, thread_ts=watch.thread or None, text=text
        )

    async def find(self, watch: Watch, marker: str, since: float) -> str | None:
        """A digest message with this marker posted since then (the channel's history, or the
        thread's replies), with its metadata."""
        return await marked_post(
            self.client, watch.channel, watch.thread or None, "digest", marker, since
        )

    async def answer(self, reply: dict[str, Any], text: str) -> None:
        if reply.get("response_url"):
            response = await AsyncWebhookClient(reply["response_url"]).send(
                text=text, response_type="ephemeral", replace_original=False
            )
            status = response.status_code
            if status >= 500 or status == 429:  # the Save task tries again (bot/watch_saves.py)
                raise RuntimeError(f"response_url answered {status}: {response.body}")
            if status >= 400:  # expired or used up (5 posts): every retry would be refused too
                log.warning("response_url refused the answer (%s): %s", status, response.body)
        elif reply.get("channel") and reply.get("user"):
            await self.client.chat_postEphemeral(
                channel=reply["channel"], user=reply["user"], text=text
            )


def _raise_if_undeliverable(exc: SlackApiError, watch: Watch) -> None:
    """Raise Undeliverable when Slack's error says it will never take the watch's digests in
    its channel (the watch is paused; `PostingRestricted` when an admin must allow the bot);
    any other error is the caller's to raise (retried), a refused shape logged as our bug."""
    error = exc.response.get("error", "")
    said = f"Slack refused the digest in {watch.channel}: {error}"
    if error.startswith("restricted_action"):
        raise PostingRestricted(said) from exc
    if error == "is_archived":  # unarchived, not invited, is what lets it post again
        raise ChannelArchived(said) from exc
    if error in UNDELIVERABLE:
        raise Undeliverable(said) from exc
    if error in SHAPE_ERRORS:  # the same digest fails everywhere: a bug to fix here
        log.error("watch %s of %s: Slack refused the digest's shape (a bug of the bot): %s",
                  watch.id, watch.tenant, error)  # fmt: skip
