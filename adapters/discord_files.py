"""Discord attachments: a PDF attached where the bot answers is read into the knowledge base.

- The listener (`DiscordFiles.submit`, called by the adapter for a message it answers: a
  mention, a thread it takes part in, a DM): each attachment whose name ends in .pdf or whose
  content type is application/pdf goes into one `SHARED_FILES` task (adapters/shared_files.py)
  with its CDN address, never its bytes; the message's text is queued as a turn once they are
  read (with a note naming the PDFs saved: adapters/shared_files.py `shared_with`). Other
  attachments (images, mostly) get a reply when the bot is addressed (a mention, a DM), and
  are left alone otherwise. Reading attachments needs the Message Content intent,
  which the bot has already. The task runs on Discord's own stream, read only where the
  adapter (and so DISCORD_TOKEN) is.
- The task's Discord side (`DiscordFileEnd`) speaks REST with the bot token, so any process
  with DISCORD_TOKEN runs it: the download from the attachment's CDN address (no token sent
  there), the progress message (POST, then PATCH of the channel's message).
- Citations link the message the PDF was shared in (its jump URL): CDN addresses expire within
  a day, and a Discord message has no pages, so no `#page=` anchor is added.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from adapters.file_download import download
from adapters.platform_ids import discord_source
from adapters.shared_files import FileEnd, file_name
from adapters.spine import Job

DISCORD_API = "https://discord.com/api/v10"
DOWNLOAD_TIMEOUT_SECONDS = 120.0
POST_TRIES = 5


def is_pdf_attachment(attachment: Any) -> bool:
    name = str(attachment.filename or "").lower()
    kind = str(attachment.content_type or "").split(";")[0].strip().lower()
    return name.endswith(".pdf") or kind == "application/pdf"


def shared_attachments(message: Any, addressed: bool) -> list[Any]:
    """The attachments to queue: every one when the bot is addressed (those not PDFs get a
    reply saying so), else the PDFs only."""
    found = list(getattr(message, "attachments", None) or [])
    return found if addressed else [a for a in found if is_pdf_attachment(a)]


class DiscordFiles:
    """The listener's part: queueing a message's files (and its text, to run after them)."""

    def __init__(self, adapter: Any) -> None:
        self.service = getattr(adapter.handler, "files", None)
        if self.service is not None and "discord" in self.service.ends:
            self.service.attach("discord")  # this process holds Discord's token

    async def submit(self, message: Any, attachments: list[Any], scope: Any, channel_id: int,
                     text: str) -> bool:  # fmt: skip
        """Queue the files; False when this process reads no Discord files (no token)."""
        if self.service is None or "discord" not in self.service.ends:
            return False
        reply = {"channel_id": channel_id}
        source = discord_source(message.id)
        turn = Job("turn", scope, text, reply=reply, source=source) if text else None
        files = [
            {"id": str(a.id), "name": a.filename, "mimetype": a.content_type or "",
             "size": a.size, "url": a.url, "link": message.jump_url}
            for a in attachments
        ]  # fmt: skip
        await self.service.submit("discord", {
            "platform": "discord", "scope": scope.to_dict(), "reply": reply,
            "share": source, "files": files, "sharer": str(message.author.id),
            "turn": turn.to_json() if turn else None,
            "turn_event": f"discord-files:{message.id}:turn",
        })  # fmt: skip
        return True


class DiscordFileEnd(FileEnd):
    """The task's Discord side over REST (`DISCORD_API_URL`, default Discord's v10)."""

    def __init__(self, token: str, api_url: str | None = None) -> None:
        self.token = token
        self.base = (api_url or DISCORD_API).rstrip("/")

    async def describe(self, file: dict[str, Any]) -> dict[str, Any]:
        return file  # the gateway's attachment carries name, type and size

    async def fetch(self, file: dict[str, Any], max_bytes: int) -> bytes:
        name = file_name(file)
        gone = f"I could not download {name}: Discord no longer serves it (attach it again)."
        return await download(
            file["url"], name, "Discord", max_bytes, DOWNLOAD_TIMEOUT_SECONDS,
            refused={403: gone, 404: gone, 410: gone},
        )  # fmt: skip

    async def post(self, reply: dict[str, Any], text: str) -> str:
        url = f"{self.base}/channels/{reply['channel_id']}/messages"
        sent = await self._call("POST", url, text)
        return str(sent["id"])

    async def edit(self, reply: dict[str, Any], message: str, text: str) -> None:
        await self._call("PATCH", f"{self.base}/channels/{reply['channel_id']}/messages/{message}",
                         text)  # fmt: skip

    async def _call(self, method: str, url: str, text: str) -> dict[str, Any]:
        """One REST call; a 429 waits its `retry_after`, other errors raise (the task runs
        again later)."""
        body = {"content": text[:2000], "allowed_mentions": {"parse": []}}
        headers = {"Authorization": f"Bot {self.token}"}
        async with aiohttp.ClientSession() as session:
            for _ in range(POST_TRIES):
                async with session.request(method, url, json=body, headers=headers) as response:
                    answer = await response.json(content_type=None)
                    if response.status == 429:
                        await asyncio.sleep(min(float(answer.get("retry_after", 1)), 60.0))
                        continue
                    if response.status >= 400:
                        raise RuntimeError(f"Discord answered {response.status}: {answer}")
                    return answer
        raise RuntimeError("Discord kept rate-limiting the progress message")
