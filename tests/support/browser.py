"""A real browser for the memory page's tests: Debian's Chromium driven by Playwright.

Playwright's own browser download does not work offline, so the tests drive the system
Chromium through `executable_path`, installing the Debian package first when it is missing
(the test setup installs what it needs). Started with the flags that keep it off the network:
without them Chromium keeps trying Google's hosts, and a closed network refuses each try.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]  # fmt: skip
ARTIFACTS = Path(os.environ.get("ARXIVSCOUT_TEST_ARTIFACTS", "test-artifacts"))


class BrowserMissing(RuntimeError):
    """No Chromium, and it could not be installed here."""


def ensure_chromium() -> str:
    """The Chromium binary, installed from Debian's packages when it is not there yet."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise BrowserMissing(
            f"{CHROMIUM} is missing and cannot be installed here (needs root and apt-get): "
            "install Debian's `chromium` package."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 and "install" in command:
            raise BrowserMissing(f"apt-get install chromium failed: {done.stderr[-2000:]}")
    if not Path(CHROMIUM).exists():
        raise BrowserMissing(f"apt-get installed chromium but {CHROMIUM} is not there")
    return CHROMIUM


def screenshot_path(name: str) -> Path:
    """Where a view's screenshot is saved (a test artifact, looked at by a person)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}.png"


class WebProcess:
    """`arxivscout web --port 0` as its own OS process, as someone on the server starts it:
    `start` waits for the address and the sign-in link it prints; its output goes to `log`."""

    def __init__(self, env: dict[str, str], tenant: str, log: Path) -> None:
        self.env, self.tenant, self.log = env, tenant, log
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""  # http://127.0.0.1:<port>
        self.link = ""  # the printed sign-in link (the tenant's local admin)

    async def start(self, timeout: float = 90.0) -> WebProcess:
        root = Path(__file__).resolve().parents[2]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "web", "--host", "127.0.0.1", "--port", "0",
                 "--tenant", self.tenant],
                cwd=root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            text = self.log.read_text(errors="replace")
            served = re.search(r"Memory page on (http://\S+)/memory", text)
            link = re.search(r"^(http://\S+/memory/login\?token=\S+)$", text, re.M)
            if served and link:
                self.base_url, self.link = served.group(1), link.group(1)
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"arxivscout web exited: {text[-3000:]}")
            await asyncio.sleep(0.1)
        self.stop()
        raise TimeoutError(f"arxivscout web printed no link: {self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (its Ctrl-C), then SIGKILL if it does not stop in time."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
