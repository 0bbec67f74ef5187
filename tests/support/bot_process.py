"""The bot as its own OS process (`arxivscout slack --port P`), to kill and restart in tests
and benchmarks, as a platform's process manager would."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]


def bot_env(
    redis_url: str, model_url: str, slack_api_url: str, data_dir: Path, secret: str
) -> dict[str, str]:
    """What a deployment sets, pointed at local stand-ins for Redis, the model and Slack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "DISCORD_"))}
    env.update(
        REDIS_URL=redis_url, OPENAI_API_KEY="test-key", OPENAI_BASE_URL=model_url,
        SLACK_API_URL=slack_api_url, SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET=secret,
        ARXIVSCOUT_DATA_DIR=str(data_dir), ARXIVSCOUT_EMBEDDINGS="local",
        ARXIVSCOUT_LLM_TIMEOUT="10", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    return env


@dataclass
class BotProcess:
    env: dict[str, str]
    port: int
    log: Path
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    async def start(self, timeout: float = 90.0) -> BotProcess:
        """Start it and wait until /healthz answers."""
        with self.log.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "app.cli", "slack", "--port", str(self.port),
                cwd=ROOT, env=self.env, stdout=out, stderr=out,
            )  # fmt: skip
        deadline = asyncio.get_running_loop().time() + timeout
        async with aiohttp.ClientSession() as session:
            while asyncio.get_running_loop().time() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"the bot exited: {self.log.read_text()[-2000:]}")
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/healthz") as reply:
                        if reply.status == 200:
                            return self
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise TimeoutError(f"the bot did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean-up, no hand-back, as a crash or an OOM kill."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    async def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM, as a platform's restart or scale-down; the exit code."""
        if self.process is None or self.process.returncode is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.kill()
            return await self.process.wait()
