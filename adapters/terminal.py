"""The terminal adapter: a REPL on a terminal, one message per line when input is piped.

Turns run through the spine's `Pipeline.run` (no queue: one person, one thread), so a failure
ends in the same reply as on Slack or Discord.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from adapters.spine import Job, Pipeline, Platform, Status
from bot.agent import AgentEvent
from bot.turns import TurnHandler
from memory.scope import Scope

HELP = """\
Commands:
  /summarize        summarize this thread into summary memory
  /expand ID        show a summary and the messages it covers
  /context [TEXT]   show the memory segments the agent would see for TEXT
  /help             this help
  /quit             leave (Ctrl-D works too)"""


class TerminalStatus(Status):
    """Tool steps as they happen; with a person at the terminal, the answer as it is written."""

    def __init__(self, chat: TerminalChat) -> None:
        self.chat = chat
        self.streamed: list[str] = []

    async def event(self, event: AgentEvent) -> None:
        if event.kind == "tool_start":
            self.chat.say(f"  → {event.name} {event.detail}")
        elif event.kind == "tool_end":
            self.chat.say(f"  ← {event.name}: {event.detail}")
        elif event.kind == "compacted":
            self.chat.say(
                f"  (context was {event.detail} full: older messages compacted into a summary)"
            )

    async def delta(self, piece: str) -> None:
        if not self.streamed:
            self.chat.say("scout> ", end="")
        self.streamed.append(piece)
        self.chat.say(piece, end="")


class TerminalPlatform(Platform):
    name = "terminal"
    limit = 1_000_000  # a terminal takes an answer whole

    def __init__(self, chat: TerminalChat) -> None:
        self.chat = chat
        self.streams = chat.interactive

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        yield TerminalStatus(self.chat)

    async def send(self, job: Job, status: Status, parts: list[str]) -> None:
        assert isinstance(status, TerminalStatus)
        text, shown = "\n\n".join(parts), "".join(status.streamed)
        if not self.chat.interactive:
            self.chat.say(text + "\n")
        elif shown:
            self.chat.say(text[len(shown) :] if text.startswith(shown) else "\n" + text)
        else:
            self.chat.say(f"scout> {text}")


class TerminalChat:
    def __init__(self, handler: TurnHandler, scope: Scope, out: TextIO = sys.stdout) -> None:
        self.handler = handler
        self.scope = scope
        self.out = out
        self.interactive = sys.stdin.isatty()
        self.last_question = ""
        self.pipeline = Pipeline(TerminalPlatform(self), handler)

    def say(self, text: str = "", end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    async def read_line(self) -> str | None:
        if self.interactive:
            try:
                return await asyncio.to_thread(input, "you> ")
            except EOFError:
                return None
        line = await asyncio.to_thread(sys.stdin.readline)
        return line.rstrip("\n") if line else None

    async def run(self) -> int:
        if self.interactive:
            self.say(
                f"ArxivScout — tenant {self.scope.tenant}, thread {self.scope.thread}. "
                "/help for commands."
            )
        while (line := await self.read_line()) is not None:
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not await self.command(line):
                    break
                continue
            await self.turn(line)
        return 0

    async def turn(self, text: str) -> None:
        self.last_question = text
        await self.pipeline.run(Job("turn", self.scope, text))

    async def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, arg = line.partition(" ")
        if name in ("/quit", "/exit"):
            return False
        if name == "/summarize":
            self.say(await self.handler.summarize(self.scope))
        elif name == "/expand":
            self.say(await self.handler.expand(self.scope, arg))
        elif name == "/context":
            context = await self.handler.context(self.scope, arg or self.last_question or "?")
            for segment in context.segments:
                self.say(
                    f"<!-- {segment.name} Memory: {segment.tokens} tokens -->\n{segment.text}\n"
                )
            self.say(f"<!-- total: {context.total_tokens} tokens -->")
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"Unknown command {name}. {HELP}")
        return True
