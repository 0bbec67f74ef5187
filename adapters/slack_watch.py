"""Slack's side of topic watches (bot/watches.py and its parts): `/watch`, the digest message, its buttons.

- `/watch <topic> [daily|weekly|every N days] [cat:cs.CL] [author:Name]` makes a watch that
  posts to the channel it was used in; `/watch list`, `/watch remove|pause|resume <id>` (only
  from that channel, but for the workspace's admins and owners, or ARXIVSCOUT_ADMINS: from
  anywhere, as the memory page decides who is an admin). A mention "watch … weekly" does the
  same, through the turn handler (bot/watch_texts.py `chat_command`; there, only from the
  watch's channel).
- A digest is one message (Block Kit): per paper its title linked, authors, why it matters,
  and a "Save to team knowledge base" button (action `digest_save`, value the arXiv id). The
  message carries metadata naming its watch and period, so a digest task run again after a
  crash finds it in the channel's history instead of posting it twice.
- A pressed Save is queued as a durable task and answered where it was pressed, only to the
  person (response_url): "Saving …", then "Saved … (N passages)".
- A watch is made only where the bot is a member (`conversations.info`): elsewhere its digests
  would be refused (`not_in_channel`), so `/watch` answers "invite me first". A digest refused
  later (the bot removed) pauses the watch, and its creator is told in a direct message
  (`conversations.open`; an ephemeral message needs the bot in the channel too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.memory_page.access import Admins
from adapters.platform_ids import slack_team
from adapters.slack_home import esc
from bot.watch_commands import AdminUnknown
from bot.watches import (
    NOT_QUEUED,
    UNREACHABLE,
    Undeliverable,
    WatchPlace,
    WatchService,
    describe,
    saving_text,
)
from memory.digest import Digest, short_authors, when
from memory.ingest.arxiv_source import check_arxiv_id
from memory.ingest.errors import IngestError
from memory.scope import Scope
from memory.stores.watches import Watch

log = logging.getLogger(__name__)

SAVE_ACTION = "digest_save"
SAVE_LABEL = "Save to team knowledge base"
METADATA_EVENT = "arxivscout_digest"
ADMIN_CHECK_SECONDS = 2.0  # of Slack's 3 s to answer a slash command
ADMIN_UNKNOWN = "Slack did not say in time whether you are an admin here: try again in a minute."
UNDELIVERABLE = {"channel_not_found", "not_in_channel", "is_archived", "account_inactive"}


def digest_blocks(digest: Digest) -> list[dict[str, Any]]:
    watch = digest.watch
    topic = esc(watch.query or ", ".join(watch.categories + watch.authors))
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": (
        f"*New on “{topic}”*: {len(digest.items)} of {digest.found} papers submitted since "
        f"{when(digest.since)}"
    )}}]  # fmt: skip
    for item in digest.items:
        paper = item.paper
        link = paper.url or f"https://arxiv.org/abs/{paper.arxiv_id}"
        text = (
            f"*<{link}|{esc(paper.title)}>*\n{esc(short_authors(paper.authors))} · "
            f"arXiv:{paper.arxiv_id}\n{esc(item.why)}"
        )[:3000]
        blocks.append({
            "type": "section", "block_id": f"paper-{paper.arxiv_id}",
            "text": {"type": "mrkdwn", "text": text},
            "accessory": {"type": "button", "action_id": SAVE_ACTION, "value": paper.arxiv_id,
                          "text": {"type": "plain_text", "text": SAVE_LABEL}},
        })  # fmt: skip
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
        f"Watch `{watch.id}`: {esc(describe(watch))}. `/watch remove {watch.id}` stops it."
    )}]})  # fmt: skip
    return blocks


def digest_fallback(digest: Digest) -> str:
    titles = "; ".join(item.paper.title for item in digest.items)
    return f"New papers on “{digest.watch.query}”: {titles}"[:3000]


class SlackWatches:
    """The Slack poster of digests, and the listeners of `/watch` and the Save button."""

    def __init__(
        self, watches: WatchService | None, client: AsyncWebClient,
        admins: Admins | None = None,
    ) -> None:  # fmt: skip
        """`admins`: ARXIVSCOUT_ADMINS, as the memory page reads it."""
        self.watches = watches
        self.client = client
        self.admins = admins or Admins()
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
        scope = await self.scope_of(command)
        text = command.get("text", "")

        async def admin() -> bool:  # asked only for a watch of another channel
            return await self.is_admin(scope.tenant, scope.user)

        try:
            place = WatchPlace("slack", scope.channel)
            answer = await self.watches.command(scope, text, place, admin=admin)
        except Exception as exc:  # a command is not sent again: say what happened
            log.warning("/watch failed: %r", exc)
            answer = UNREACHABLE
        made = answer.startswith("Watching ")
        await ack(response_type="in_channel" if made else "ephemeral", text=answer)

    async def is_admin(self, team: str, user: str) -> bool:
        """A workspace admin or owner, or named in ARXIVSCOUT_ADMINS (as on the memory page):
        manages every channel's watches. One users.info, within ADMIN_CHECK_SECONDS (the
        command is answered within Slack's 3 s); AdminUnknown when Slack cannot say."""
        if self.admins.named(team, user):
            return True
        try:
            async with asyncio.timeout(ADMIN_CHECK_SECONDS):
                found = (await self.client.users_info(user=user)).get("user") or {}
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("could not tell whether %s is an admin: %r", user, exc)
            raise AdminUnknown(ADMIN_UNKNOWN) from None
        if found.get("deleted"):
            return False
        return any(found.get(k) for k in ("is_admin", "is_owner", "is_primary_owner"))

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
        try:
            response = await self.client.chat_postMessage(
                channel=watch.channel, thread_ts=watch.thread or None,
                text=digest_fallback(digest), blocks=digest_blocks(digest),
                metadata={"event_type": METADATA_EVENT, "event_payload": {"digest": marker}},
                unfurl_links=False, unfurl_media=False,
            )  # fmt: skip
        except SlackApiError as exc:
            error = exc.response.get("error", "")
            if error in UNDELIVERABLE:
                raise Undeliverable(
                    f"Slack refused the digest in {watch.channel}: {error}"
                ) from exc
            raise
        return str(response["ts"])

    async def can_post(self, place: WatchPlace) -> str:
        try:
            info = (await self.client.conversations_info(channel=place.channel))["channel"]
        except SlackApiError as exc:
            error = exc.response.get("error", "")
            return f"I cannot see this conversation ({error}), so I could not post digests here."
        if info.get("is_im") or info.get("is_mpim") or info.get("is_member"):
            return ""
        return (
            "I am not in this channel, so Slack would refuse my digests here: invite me first "
            "(`/invite @ArxivScout`), then ask again."
        )

    async def tell(self, watch: Watch, text: str) -> None:
        if not watch.created_by:
            return
        opened = await self.client.conversations_open(users=watch.created_by)
        await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text)

    async def notice(self, watch: Watch, text: str) -> None:
        await self.client.chat_postMessage(
            channel=watch.channel, thread_ts=watch.thread or None, text=text
        )

    async def find(self, watch: Watch, marker: str, since: float) -> str | None:
        """A digest message with this marker posted since then (the channel's history, or the
        thread's replies), with its metadata."""
        options = {"channel": watch.channel, "oldest": f"{since - 60:.6f}",
                   "include_all_metadata": True, "limit": 200}  # fmt: skip
        if watch.thread:
            response = await self.client.conversations_replies(ts=watch.thread, **options)
        else:
            response = await self.client.conversations_history(**options)
        for message in response.get("messages") or []:
            payload = (message.get("metadata") or {}).get("event_payload") or {}
            if payload.get("digest") == marker:
                return str(message["ts"])
        return None

    async def answer(self, reply: dict[str, Any], text: str) -> None:
        if reply.get("response_url"):
            await AsyncWebhookClient(reply["response_url"]).send(
                text=text, response_type="ephemeral", replace_original=False
            )
        elif reply.get("channel") and reply.get("user"):
            await self.client.chat_postEphemeral(
                channel=reply["channel"], user=reply["user"], text=text
            )
