"""The terminal adapter: a REPL on a terminal (one line, one message; a pasted block of lines
is one message where the terminal supports bracketed paste), one message per line when input is
piped.

Turns run through the spine's `Pipeline.run` (no queue: one person, one thread), so a failure
ends in the same reply as on Slack or Discord. Stdout's reader gone (`| head -1`) is no such
failure: the chat reads no more input and ends as any command whose reader went away.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import select
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO, TypeVar

from adapters.spine import MEMORY_DOWN, Job, Pipeline, Platform, Status
from bot.agent import AgentEvent
from bot.turns import TurnHandler, command_failure
from memory.errors import memory_unavailable
from memory.scope import Scope

HELP = """\
Commands:
  /summarize        summarize this thread into summary memory
  /expand ID        show a summary and the messages it covers
  /context [TEXT]   show the memory segments the agent would see for TEXT
  /help             this help
  /quit             leave (Ctrl-D works too)"""

# Bracketed paste (xterm's, most terminals'): once turned on, a terminal sends a paste between
# these markers, so its lines are told from lines typed one by one (or typed ahead).
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
# A tty keeps at most 4095 bytes of a line while it is typed (Linux's canonical mode, which
# input() reads in): the rest is dropped as it arrives, a paste's end marker with it. A line
# that long is taken as cut. A paste goes on past a cut line only through the lines already
# there (a paste's lines arrive together) up to the one holding its end marker; if none holds
# it, the paste ended at the cut and those lines were typed ahead: messages of their own.
LINE_LIMIT = 4095
LINE_CUT = (
    "warning: line cut at the terminal's 4095-byte limit (anything past it was lost); to send "
    'longer text as one message: `arxivscout ask --tenant T --thread ID "$(cat file.txt)"` '
    "(this chat's tenant and thread are shown at its start)"
)
PASTE_FOLLOWS_SECONDS = 0.1  # how long a paste's next line may take to be there
_EOF = object()  # Ctrl-D read ahead: the end, once the lines before it are messages
Ahead = collections.deque  # a chat's lines read past a cut paste, not part of it (and _EOF)


def _markers_unseen() -> Callable[[], None] | None:
    """Stop the tty echoing control characters as text (ECHOCTL shows a paste's markers as
    `^[[200~`); echoed raw, the terminal reads them as a sequence it ignores. Returns what puts
    the setting back; None where there is no termios (Windows) or stdin is no tty."""
    try:
        import termios

        fd = sys.stdin.fileno()
        before = termios.tcgetattr(fd)
        quiet = list(before)
        quiet[3] &= ~termios.ECHOCTL
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    except ImportError:
        return None
    except (termios.error, AttributeError, OSError, ValueError):  # no tty: nothing to change
        return None
    return lambda: termios.tcsetattr(fd, termios.TCSANOW, before)


# The terminal keeps no queue and nothing runs a message again: the person sends it again, and
# the same text sent next runs the same job again (`TerminalChat.turn`), so it is stored once.
MEMORY_DOWN_HERE = (
    "My memory (Redis) is unreachable right now, so I cannot answer this. Please send it again "
    "once Redis is back."
)


T = TypeVar("T")


async def in_daemon_thread(read: Callable[..., T], *args: object) -> T:
    """`read(*args)` in a daemon thread. asyncio's executor (asyncio.to_thread) is joined when
    asyncio.run ends, so Ctrl-C at the prompt would wait for Enter; a daemon thread is not."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, failed: bool) -> None:
        if future.done():  # cancelled: Ctrl-C
            return
        if failed:
            future.set_exception(value)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, failed = read(*args), False
        except BaseException as exc:  # EOFError at the end of input, said to the reader
            value, failed = exc, True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value, failed)

    threading.Thread(target=work, name="terminal-input", daemon=True).start()
    return await future


def read_pasted(prompt: str, ahead: Ahead | None = None) -> list[str | None]:
    """The next message's lines (None for a line that is not valid UTF-8, skipped alone): one
    line, or all the lines of a bracketed paste, from the one holding its start marker (the
    text typed before it begins the message) to the one holding its end marker, markers taken
    out. EOFError at the end. Read with input(): unlike sys.stdin.buffer it holds no lock while
    it waits, so Ctrl-C at the prompt leaves no daemon thread that aborts interpreter exit."""
    ahead = Ahead() if ahead is None else ahead
    first, cut = _line(prompt, ahead)
    if first is None or PASTE_START not in first:
        return [_unmarked(first)]
    before, _, rest = first.partition(PASTE_START)
    lines: list[str | None] = [before + rest]
    last: str | None = rest
    while not cut and (last is None or PASTE_END not in last):
        try:
            last, cut = _line("", ahead)
        except EOFError:  # Ctrl-D: the end of this message
            break
        lines.append(last)
    if cut:  # its end marker may be what the tty dropped
        lines += _rest_of_cut_paste(ahead)
    return [_unmarked(line) for line in lines]


def _rest_of_cut_paste(ahead: Ahead) -> list[str | None]:
    """After a paste's line the tty cut: the lines already there, up to the one holding the
    paste's end marker (a cut inside the paste). If none holds it, the paste ended at the cut:
    they were typed ahead, and are kept (`ahead`) to be the next messages, not joined to it."""
    waiting: list[str | None] = []
    while _more_waiting():
        try:
            line, _ = _line("")
        except EOFError:
            ahead.extend([*waiting, _EOF])
            return []
        if line is not None and PASTE_START in line:  # a paste typed ahead: its own message
            ahead.extend([*waiting, line])
            return []
        waiting.append(line)
        if line is not None and PASTE_END in line:
            return waiting
    ahead.extend(waiting)
    return []


def _more_waiting() -> bool:
    """Whether a line is there already (a paste's next line), without waiting for a person to
    type one. False where stdin cannot be waited on."""
    try:
        ready, _, _ = select.select([sys.stdin], [], [], PASTE_FOLLOWS_SECONDS)
    except (OSError, ValueError, TypeError):  # no fileno (Windows' console, a test's stream)
        return False
    return bool(ready)


def _line(prompt: str, ahead: Ahead | None = None) -> tuple[str | None, bool]:
    """input(prompt) (None when the line is not valid UTF-8), and whether the tty cut it:
    said on stderr, as the cut is silent. A line read `ahead` comes first."""
    if ahead:
        line = ahead.popleft()
        if line is _EOF:
            raise EOFError
        return line, False
    try:
        line = input(prompt)
    except UnicodeDecodeError as exc:  # not UTF-8, or a character cut in two by the tty
        line, raw = None, exc.object
    else:
        raw = line.encode("utf-8", "surrogateescape")
    if len(raw.rstrip(b"\n")) < LINE_LIMIT:
        return line, False
    print(LINE_CUT, file=sys.stderr)
    return _whole_characters(raw.rstrip(b"\n")), True


def _whole_characters(raw: bytes) -> str | None:
    """A cut line's text without the first bytes of a character cut in two (up to 3 of its
    4); None when what is left is still not UTF-8."""
    for end in range(len(raw), max(len(raw) - 4, -1), -1):
        with contextlib.suppress(UnicodeDecodeError):
            return raw[:end].decode("utf-8")
    return None


def _unmarked(line: str | None) -> str | None:
    """`line` without any paste marker (a stray one would reach the model as raw ESC)."""
    if line is None:
        return None
    return line.replace(PASTE_START, "").replace(PASTE_END, "")


def decode_line(raw: bytes | str) -> str:
    """`raw` as text; UnicodeError when it is not valid UTF-8: bytes that do not decode, or the
    lone surrogates Python's surrogateescape makes of them when it reads text in a C locale."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    text.encode("utf-8")
    return text


class TerminalStatus(Status):
    """Tool steps as they happen; with a person at the terminal, the answer as it is written.
    `streamed` is the current model reply's text only: the answer delivered is the last
    reply's, so words before a tool step ("Let me search.") are not part of it."""

    def __init__(self, chat: TerminalChat) -> None:
        self.chat = chat
        self.streamed: list[str] = []

    async def event(self, event: AgentEvent) -> None:
        if event.kind == "tool_start":
            if self.streamed:  # the reply before the tool step: its line ends, the next starts
                self.chat.say()
                self.streamed = []
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

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        assert isinstance(status, TerminalStatus)
        self.chat.replied = True
        if part == MEMORY_DOWN:  # the platforms' wording promises a re-run this chat has not
            part = MEMORY_DOWN_HERE
        shown = "".join(status.streamed).strip() if index == 0 else ""  # the answer is stripped
        if not self.chat.interactive:
            self.chat.say(part + "\n")
        elif shown:
            self.chat.say(part[len(shown) :] if part.startswith(shown) else "\n" + part)
        else:
            self.chat.say(part if index else f"scout> {part}")

    async def notice(self, job: Job, text: str) -> None:
        self.chat.say(text)


class TerminalChat:
    def __init__(self, handler: TurnHandler, scope: Scope, out: TextIO = sys.stdout) -> None:
        self.handler = handler
        self.scope = scope
        self.out = out
        self.interactive = sys.stdin.isatty()
        self._ahead = Ahead()  # lines typed ahead of a cut paste (`read_pasted`)
        self.last_question = ""
        self.lines_read = 0
        self.replied = False  # whether the running message's reply was shown
        self.reader_gone = False  # stdout's reader went away (`| head`): nothing more is read
        # the last message, when the memory stopped its turn: (its text, its job)
        self.unanswered: tuple[str, Job] | None = None
        self.pipeline = Pipeline(TerminalPlatform(self), handler)

    def say(self, text: str = "", end: str = "\n") -> None:
        """Write to stdout. Its reader gone is kept, not raised: raised inside a turn, the
        spine would take it for the platform failing and the chat would go on; the turn ends
        as if shown (its message stored), then the chat stops (`_unless_reader_gone`)."""
        if self.reader_gone:  # a write would fail again
            return
        try:
            self.out.write(text + end)
            self.out.flush()
        except BrokenPipeError:
            self.reader_gone = True

    def _unless_reader_gone(self) -> None:
        """BrokenPipeError out of `run` once stdout's reader is gone, before another line is
        read: the command exits quietly with status 1 (app/cli.py `reader_gone`)."""
        if self.reader_gone:
            raise BrokenPipeError(errno.EPIPE, "stdout's reader went away")

    async def read_line(self) -> str | None:
        """The next message (None at the end): a line, or the lines of a paste, each valid
        UTF-8; a line that is not is skipped with a warning on stderr, so one garbled line
        neither ends the chat nor loses the rest of its paste."""
        while True:
            raw = await self._read_raw()
            if raw is None:
                return None
            lines = [line for line in map(self._decoded, raw) if line is not None]
            if lines:
                return "\n".join(lines)

    def _decoded(self, raw: bytes | str | None) -> str | None:
        try:
            if raw is None:  # read_pasted found it not UTF-8
                raise UnicodeError
            text = decode_line(raw).rstrip("\n")
        except UnicodeError:
            self._skip()
            return None
        self.lines_read += 1
        return text

    def _skip(self) -> None:
        self.lines_read += 1
        print(f"warning: skipped input line {self.lines_read}: not valid UTF-8", file=sys.stderr)

    async def _read_raw(self) -> list[bytes | str | None] | None:
        """The next line's (or paste's) lines as read (None: a line found not UTF-8);
        None at the end."""
        if self.interactive:
            try:
                return list(await in_daemon_thread(read_pasted, "you> ", self._ahead))
            except EOFError:
                return None
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes: we decide what is valid
        line = await in_daemon_thread(stdin.readline)
        return [line] if line else None

    async def run(self) -> int:
        if self.interactive:
            self.say(
                f"ArxivScout — tenant {self.scope.tenant}, thread {self.scope.thread}. "
                "/help for commands."
            )
        # Bracketed paste only where termios is (Windows' console would print the sequences).
        echo = _markers_unseen() if self.interactive and self.out.isatty() else None
        try:
            if echo is not None:  # a paste comes marked: its lines are one message
                self.say(PASTE_ON, end="")
            return await self._chat()
        finally:  # the end of input, /quit, Ctrl-C (cancelled): the terminal as it was
            if echo is not None:
                try:
                    echo()  # first: a failing write below cannot skip it
                finally:
                    self.say(PASTE_OFF, end="")

    async def _chat(self) -> int:
        while (line := await self._next_line()) is not None:
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not await self.command(line):
                    break
                continue
            await self.turn(line)
        return 0

    async def _next_line(self) -> str | None:
        """The next message, once the last turn's or command's output was written; none is
        read for a reader gone (`_unless_reader_gone`)."""
        self._unless_reader_gone()
        return await self.read_line()

    async def turn(self, text: str) -> None:
        self.last_question = text
        self.replied = False
        job = self._job_for(text)
        try:
            await self.pipeline.run(job)
        except Exception as exc:  # the chat goes on
            if not memory_unavailable(exc):
                raise
            self.unanswered = (text, job)
            if not self.replied:  # unreachable before the turn could say so
                self.say(MEMORY_DOWN_HERE)

    def _job_for(self, text: str) -> Job:
        """The job of a message: the one the memory stopped, when this is its text sent again.
        Its turn may have stored the question already; run again under the same id, it is
        stored once (the turn's writes are keyed by the job's id), not once per sending."""
        unanswered, self.unanswered = self.unanswered, None
        if unanswered is not None and unanswered[0] == text:
            return unanswered[1]
        return Job("turn", self.scope, text)

    async def command(self, line: str) -> bool:
        """Run a slash command; False means leave. A failure (Redis unreachable, or another)
        is said, and the chat goes on."""
        name, _, arg = line.partition(" ")
        if name in ("/quit", "/exit"):
            return False
        try:
            await self._command(name, arg)
        except Exception as exc:
            self.say(command_failure(name, exc))
        return True

    async def _command(self, name: str, arg: str) -> None:
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
