"""`arxivscout worker` with nothing to serve (a Slack deployment over HTTP): it idles, says why,
answers /healthz, and exits 0 when the platform stops it, instead of crash-looping."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from app.commands.worker_cmd import IDLE_REASON
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 60.0  # generous: a cold interpreter imports the whole app first


def worker_env(port: int | None) -> dict[str, str]:
    """No Slack or Discord tokens; a Redis address where nothing listens, so the test fails if
    the idle worker tried to open Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "DISCORD_"))}
    env.pop("PORT", None)
    env.update(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT)
    if port is not None:
        env["PORT"] = str(port)
    return env


async def start_worker(tmp_path: Path, port: int | None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "worker",
        cwd=tmp_path, env=worker_env(port),  # no .env in tmp_path
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def first_line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), WAIT_SECONDS)
    return line.decode().strip()


async def stop(process: asyncio.subprocess.Process, sig: signal.Signals) -> tuple[int, str]:
    process.send_signal(sig)
    _, err = await asyncio.wait_for(process.communicate(), WAIT_SECONDS)
    assert process.returncode is not None
    return process.returncode, err.decode()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_worker_without_tokens_idles_serves_healthz_and_exits_0(tmp_path, sig):
    port = free_port()
    process = await start_worker(tmp_path, port)
    try:
        assert await first_line(process) == IDLE_REASON
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            assert response.status == 200
            assert (await response.json())["ok"] is True
        await asyncio.sleep(0.5)  # a moment later it is still there: idling, not exiting
        assert process.returncode is None
        code, err = await stop(process, sig)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, err
    assert "error" not in err.lower() and "Traceback" not in err


async def test_worker_without_tokens_or_port_still_idles(tmp_path):
    process = await start_worker(tmp_path, None)
    try:
        assert await first_line(process) == IDLE_REASON
        await asyncio.sleep(0.5)
        assert process.returncode is None
        code, err = await stop(process, signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, err
