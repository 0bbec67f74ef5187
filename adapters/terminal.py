"""The terminal adapter: a REPL on a terminal, one message per line when input is piped."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from bot.agent import AgentEvent
from bot.turns import TurnHandler

HELP = """\
Commands:
  /summarize        summarize this thread into summary memory
  /expand ID        show a summary and the messages it covers
  /context [TEXT]   show the memory segments the agent would see for TEXT
  /help             this help
  /quit             leave (Ctrl-D works too)"""


class TerminalChat:
    def __init__(
        self, handler: TurnHandler, tenant: str, thread_id: str, out: TextIO = sys.stdout
    ) -> None:
        self.handler = handler
        self.tenant = tenant
        self.thread_id = thread_id
        self.out = out
        self.interactive = sys.stdin.isatty()
        self.last_question = ""

    def say(self, text: str = "", end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    async def show_event(self, event: AgentEvent) -> None:
        if event.kind == "tool_start":
            self.say(f"  → {event.name} {event.detail}")
        elif event.kind == "tool_end":
            self.say(f"  ← {event.name}: {event.detail}")
        elif event.kind == "compacted":
            self.say(
                f"  (context was {event.detail} full: older messages compacted into a summary)"
            )

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
                f"ArxivScout — tenant {self.tenant}, thread {self.thread_id}. /help for commands."
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
        streamed: list[str] = []

        def on_delta(piece: str) -> None:
            if not streamed and self.interactive:
                self.say("scout> ", end="")
            streamed.append(piece)
            if self.interactive:
                self.say(piece, end="")

        reply = await self.handler.handle(
            self.tenant, self.thread_id, "terminal", text, on_event=self.show_event,
            on_delta=on_delta if self.interactive else None,
        )  # fmt: skip
        if self.interactive and streamed:
            tail = (
                reply.text[len("".join(streamed)) :]
                if reply.text.startswith("".join(streamed))
                else ""
            )
            self.say(tail)
        else:
            self.say(f"scout> {reply.text}" if self.interactive else reply.text)
        if not self.interactive:
            self.say()

    async def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, arg = line.partition(" ")
        if name in ("/quit", "/exit"):
            return False
        if name == "/summarize":
            self.say(await self.handler.summarize(self.tenant, self.thread_id))
        elif name == "/expand":
            self.say(await self.handler.expand(self.tenant, arg))
        elif name == "/context":
            context = await self.handler.context(
                self.tenant, self.thread_id, arg or self.last_question or "?"
            )
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
