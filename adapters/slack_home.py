"""Slack's App Home and `/memory`: a person's way to the memory page from Slack.

The Home tab is rebuilt each time it is opened (`app_home_opened`) and when its button is
pressed: the workspace's recently saved papers, the person's latest thread with the bot in
each channel (what the adapters keep for `/summarize`) with its summaries, and a button that
opens their memory page. Links expire, so the button carries a link made for that opening.
Threads are shown only where the person may still see them (a private channel they left is
not), as the memory page decides it (`access.Directory`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import Directory, DirectoryError
from adapters.memory_page.auth import NOT_SERVED, Links
from adapters.memory_page.viewer import Viewer
from adapters.slack_delivery import DM
from adapters.slack_walls import SlackWalls
from memory.errors import memory_unavailable
from memory.manager import MemoryManager
from memory.scope import PUBLIC, Scope, Visibility
from memory.shorten import shortened
from memory.stores.knowledge_base import is_from_arxiv, paper_label

log = logging.getLogger(__name__)

BUTTON_ACTION = "memory_page_link"
PAPERS_SHOWN = 10
THREADS_SHOWN = 10
THREADS_LOOKED_AT = 500  # the tenant's most recently active threads whose channels are asked
SUMMARIES_SHOWN = 3
SUMMARIES_ELSEWHERE = "_its summaries are on the memory page, for those who may see them_"
SECTION_LIMIT = 3000  # characters of one section's text (Block Kit)
PAPERS_ELSEWHERE = "_The workspace's saved papers are listed on the memory page, for its members._"


def esc(text: str) -> str:
    """Text for Slack's mrkdwn: its three control characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _date(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def _paper_line(paper: dict[str, Any]) -> str:
    """A paper from arXiv links to arXiv with its id; a PDF shared in chat has no arXiv id:
    its title (or file name) links where it was shared, if anywhere."""
    arxiv_id = paper["arxiv_id"]
    if is_from_arxiv(arxiv_id):
        link = paper.get("url") or f"https://arxiv.org/abs/{arxiv_id}"
        return f"<{link}|{esc(paper.get('title') or arxiv_id)}> · arXiv:{esc(arxiv_id)}"
    name = esc(paper.get("title") or paper.get("file_name") or "Untitled PDF")
    kind, url = paper_label(arxiv_id), str(paper.get("url") or "")
    # a PDF ingested from a file has a path on the server for its url: no link
    return f"<{url}|{name}> · {kind}" if url.startswith("http") else f"{name} · {kind}"


def _section(text: str, **extra: Any) -> dict[str, Any]:
    text = shortened(text, SECTION_LIMIT)
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}, **extra}


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": text}}


class SlackHome:
    """Builds and publishes a person's Home tab; makes their `/memory` answer."""

    def __init__(
        self, memory: MemoryManager, client: AsyncWebClient, links: Links | None,
        directory: Directory | None, walls: SlackWalls | None = None,
    ) -> None:  # fmt: skip
        """`walls`: the adapter's answers on channels and people (is a person a guest or of
        another organisation, asked when the directory cannot say); without them, everyone is
        a member and every channel public (the adapter always gives them)."""
        self.memory = memory
        self.client = client
        self.links = links
        self.directory = directory
        self.walls = walls
        self.team_url = ""  # https://<workspace>.slack.com/, from auth.test: thread permalinks

    def link_message(self, team: str, user: str) -> dict[str, Any]:
        """The ephemeral answer to `/memory`: this person's link, for this workspace."""
        if self.links is None:
            return {"response_type": "ephemeral", "text": NOT_SERVED}
        url = self.links.login(team, user, "slack")
        minutes = self.links.ttl // 60
        return {"response_type": "ephemeral",
                "text": f"<{url}|Open your ArxivScout memory page>: what I remember that you may "
                        f"see. The link is yours alone and works for {minutes} minutes."}  # fmt: skip

    async def publish(self, team: str, user: str) -> None:
        try:
            await self.client.views_publish(user_id=user, view=await self.view(team, user))
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("App Home of %s in %s not published: %s", user, team, exc)

    async def view(self, team: str, user: str) -> dict[str, Any]:
        blocks = [_header("Your ArxivScout memory"), self._button(team, user), {"type": "divider"}]
        try:
            viewer, note = await self._viewer(team, user)
            blocks += await self._papers(team, user, viewer)
            blocks += [{"type": "divider"}, *await self._threads(team, user, viewer, note)]
        except Exception as exc:
            if not memory_unavailable(exc):
                raise
            blocks.append(_section("_My memory cannot be reached right now: open this tab "
                                   "again in a minute._"))  # fmt: skip
        return {"type": "home", "blocks": blocks}

    def _button(self, team: str, user: str) -> dict[str, Any]:
        if self.links is None:
            return _section(NOT_SERVED)
        minutes = self.links.ttl // 60
        return _section(
            "Everything I remember that you may see (threads, summaries, papers, people and "
            "procedures), where you can correct or erase it. The button's link is yours alone "
            f"and works for {minutes} minutes; this tab makes a new one each time you open it.",
            accessory={
                "type": "button", "action_id": BUTTON_ACTION, "style": "primary",
                "text": {"type": "plain_text", "text": "Open my memory page"},
                "url": self.links.login(team, user, "slack"),
            },
        )  # fmt: skip

    async def _papers(self, team: str, user: str, viewer: Viewer | None) -> list[dict[str, Any]]:
        """The workspace's latest saved papers: its public memory, not for a guest or someone
        of another organisation (as on the memory page)."""
        if not await self._sees_public(team, user, viewer):
            return [_header("Recently saved papers"), _section(PAPERS_ELSEWHERE)]
        papers = (await self.memory.knowledge_base.papers(Scope(team)))[-PAPERS_SHOWN:][::-1]
        lines = [f"• {_paper_line(p)} · saved {_date(p.get('ingested_at') or 0)}" for p in papers]
        text = "\n".join(lines) or "_No papers saved yet: ask me to find and save one._"
        return [_header("Recently saved papers"), _section(text)]

    async def _sees_public(self, team: str, user: str, viewer: Viewer | None) -> bool:
        if viewer is not None:
            return viewer.can_see(PUBLIC)
        return self.walls is None or not (await self.walls.person(team, user)).outsider

    async def _threads(
        self, team: str, user: str, viewer: Viewer | None, note: str
    ) -> list[dict[str, Any]]:
        """The person's latest thread with the bot in each channel, most recent first."""
        prefix = f"slack:{team}:"
        recent = [
            t for t, _ in await self.memory.conversation.threads(team) if t.startswith(prefix)
        ]
        recent = recent[:THREADS_LOOKED_AT]
        channels = list(dict.fromkeys(t.split(":")[2] for t in recent))
        refs = await asyncio.gather(*(
            self.memory.presence.last_thread(Scope(team, channel=c, user=user)) for c in channels
        ))  # fmt: skip
        mine = {f"{prefix}{c}:{r}": (c, r) for c, r in zip(channels, refs, strict=True) if r}
        sees_public = await self._sees_public(team, user, viewer)
        shown: list[dict[str, Any]] = []
        for thread in (t for t in recent if t in mine):
            channel, ref = mine[thread]
            visibility = Visibility.PUBLIC
            if self.walls is not None:
                visibility = (await self.walls.place(team, channel, None)).visibility
            place = Scope(team, channel=channel, visibility=visibility)
            if viewer is not None and not self._sees_place(viewer, place):
                continue  # e.g. a private channel they have left
            if viewer is None and place.visibility is Visibility.PRIVATE:
                continue
            shown.append(await self._thread(team, thread, channel, ref, viewer, sees_public))
            if len(shown) == THREADS_SHOWN:
                break
        if not shown:
            shown = [_section("_No threads with me yet: mention me in a channel, or write to me "
                              "here under Messages._")]  # fmt: skip
        context = "Your latest thread with me in each channel, with its summaries."
        return [_header("Your threads with me"), *shown,
                {"type": "context", "elements": [{"type": "mrkdwn", "text": note or context}]}]  # fmt: skip

    @staticmethod
    def _sees_place(viewer: Viewer, place: Scope) -> bool:
        """The viewer may see the channel's memory: the team's public one, or that channel's
        own (a private channel they are in; in a public one, what walled people, such as a
        guest viewing their own threads, said there: memory/scope.py `audiences`)."""
        own = Scope(place.tenant, channel=place.channel, visibility=Visibility.PRIVATE)
        return viewer.can_see(place.audience) or viewer.can_see(own.audience)

    async def _viewer(self, team: str, user: str) -> tuple[Viewer | None, str]:
        if self.directory is None:
            return None, "Threads of private channels are shown on the memory page only."
        try:
            return await self.directory.viewer(team, user, "slack"), ""
        except DirectoryError as exc:
            return None, f"Private channels are left out for now: {esc(exc.message)}"

    @staticmethod
    def _sees_summary(
        viewer: Viewer | None, audience: str, sees_public: bool, own_dm: str | None
    ) -> bool:
        """A summary is shown as on the memory page (`Viewer.can_see`): a thread the viewer may
        see can hold summaries they may not (a guest's words in a public channel are that
        channel's own memory). Without a viewer, the public ones to whom the page shows public
        memory (`sees_public`: no guest), and in the person's DM with the bot (`own_dm`, its
        audience) that DM's own: the last-thread record is the person's, and a DM has one."""
        if viewer is not None:
            return viewer.can_see(audience)
        return (audience == PUBLIC and sees_public) or audience == own_dm

    async def _thread(
        self, team: str, thread: str, channel: str, ref: str, viewer: Viewer | None,
        sees_public: bool,
    ) -> dict[str, Any]:  # fmt: skip
        own_dm = None
        if ref == DM:
            own_dm = Scope(team, channel=channel, visibility=Visibility.DM).audience
            where = "Our direct messages"
        else:
            when = f"thread of {_date(float(ref))}" if ref.replace(".", "").isdigit() else "thread"
            permalink = (
                f"{self.team_url}archives/{channel}/p{ref.replace('.', '')}" if self.team_url
                else ""
            )  # fmt: skip
            where = f"<#{channel}> · " + (f"<{permalink}|{when}>" if permalink else when)
        every = await self.memory.summaries.descriptions_with_audience(Scope(team, thread))
        summaries = [
            (sid, description)
            for sid, description, audience in every
            if self._sees_summary(viewer, audience, sees_public, own_dm)
        ][-SUMMARIES_SHOWN:]
        lines = [f"*{where}*"]
        lines += [f"• {esc(description)} (`{esc(sid)}`)" for sid, description in summaries]
        if not every:
            lines.append("_no summaries yet: `/summarize` writes one_")
        elif not summaries:  # there are some, not for this tab to show
            lines.append(SUMMARIES_ELSEWHERE)
        if self.links is not None:
            lines.append(f"<{self.links.page('/memory/threads/' + quote(thread, safe=''))}|"
                         "See it on the memory page>")  # fmt: skip
        return _section("\n".join(lines))
