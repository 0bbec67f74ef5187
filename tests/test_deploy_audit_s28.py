"""Deployment findings of audit s28: Socket Mode's app token checked at start-up (a refused one
would leave the worker retrying for ever, deaf to SIGTERM); no embedded Redis on Heroku even
with ARXIVSCOUT_DATA_DIR; settings read from documented variable names only (a bare PUBLIC_URL
or ADMINS is another program's); a server that is no Redis, or lacks FT._LIST in its own words
(Upstash, an ACL's NOPERM), refused in one line instead of a trace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from app import runtime
from app.settings import Settings
from bot.errors import ConfigError
from memory.connection import RedisCapabilityError, connect
from tests.conftest import free_port
from tests.support.discord_api import BOT_TOKEN as DISCORD_TOKEN
from tests.support.discord_api import MockDiscordApi
from tests.support.slack_api import MockSlackApi

ROOT = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 120.0  # generous: a cold interpreter imports the whole app, the model loads
GENERIC_NAMES = ("PUBLIC_URL", "ADMINS", "SECRET", "DATA_DIR", "LINK_TTL_SECONDS")


@pytest.fixture
def slack_api():
    api = MockSlackApi()
    api.start_in_thread()
    yield api
    api.stop()


def socket_mode_env(env: dict[str, str], api: MockSlackApi) -> dict[str, str]:
    env = {k: v for k, v in env.items() if not k.startswith(("SLACK_", "DISCORD_"))}
    env.update(
        SLACK_BOT_TOKEN="xoxb-test", SLACK_APP_TOKEN="xapp-1-test", SLACK_API_URL=api.base_url,
        OPENAI_API_KEY="k", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
    )  # fmt: skip
    env.pop("PORT", None)
    return env


# -- 1. SLACK_APP_TOKEN ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (["worker"], "invalid_auth"),  # revoked
        (["slack", "--socket", "--port", "0"], "missing_scope"),  # no connections:write
        (["worker"], "not_allowed_token_type"),
    ],
)
def test_a_refused_app_token_stops_socket_mode_in_one_line_before_redis(slack_api, command, error):
    """Before the check, the worker opened Redis (here a port where nothing listens, so it
    said that instead) and, with a Redis, retried connecting every 10 s for ever."""
    slack_api.fail("apps.connections.open", error, times=10)
    env = socket_mode_env(dict(os.environ), slack_api)
    env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=WAIT_SECONDS)  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "SLACK_APP_TOKEN" in lines[0] and error in lines[0]
    assert "Redis" not in result.stderr


def test_sigterm_stops_a_worker_whose_socket_mode_never_connects(slack_api, cli_env):
    """Slack accepts the token at the check, then hands out no socket address (as when it is
    unreachable, or the token is revoked just after): slack_sdk retries for ever, and SIGTERM
    must still stop the process, as the platform expects, before its SIGKILL."""
    env = socket_mode_env(cli_env, slack_api)
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while len(slack_api.of("apps.connections.open")) < 2:  # the check, then the connect
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "Socket Mode never tried to connect"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAIT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "Slack Socket Mode connected" not in out


def test_discord_starts_while_socket_mode_is_still_connecting(slack_api, cli_env):
    """One worker, both platforms: Slack's endless connect no longer keeps Discord from
    logging in."""
    discord_api = MockDiscordApi()
    discord_api.start_in_thread()
    env = socket_mode_env(cli_env, slack_api)
    env.update(DISCORD_TOKEN=DISCORD_TOKEN, DISCORD_API_URL=discord_api.base_url)
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not discord_api.of("me"):  # discord.py's login
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "Discord never logged in"
            time.sleep(0.1)
        assert len(slack_api.of("apps.connections.open")) >= 1  # the check, at least
        assert process.poll() is None  # still connecting to Slack, Discord up
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAIT_SECONDS)
        assert process.returncode == 0, err
        assert "Slack Socket Mode connected" not in out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        discord_api.stop()


# -- 2. no embedded Redis on Heroku ----------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No platform, Redis or data-directory variable, and no `.env` (the test's own cwd)."""
    for name in ("REDIS_URL", "REDISCLOUD_URL", "ARXIVSCOUT_DATA_DIR", "DYNO", "FLY_APP_NAME",
                 "ARXIVSCOUT_PUBLIC_URL", "ARXIVSCOUT_ADMINS", "ARXIVSCOUT_SECRET"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_a_data_dir_does_not_allow_the_embedded_redis_on_heroku(clean_env, tmp_path):
    clean_env.setenv("DYNO", "worker.1")
    clean_env.setenv("ARXIVSCOUT_DATA_DIR", str(tmp_path / "not-a-volume"))
    settings = Settings.from_env()
    try:
        with pytest.raises(ConfigError) as refused:
            runtime.redis_url(settings)
    finally:  # without the refusal, a server was started in the test's directory
        runtime.embedded_redis(settings).stop()
    message = str(refused.value)
    assert message.startswith("REDIS_URL is not set: on Heroku")
    assert "Redis Cloud" in message and "volume" not in message.replace("no volumes", "")


def test_the_fly_refusal_says_a_volume_is_for_one_machine(clean_env):
    clean_env.setenv("FLY_APP_NAME", "scout")
    with pytest.raises(ConfigError, match=r"single machine.*share one Redis"):
        runtime.redis_url(Settings.from_env())


# -- 3. documented variable names only -------------------------------------------------------


def test_generic_variable_names_set_nothing(clean_env, tmp_path):
    for name in GENERIC_NAMES:
        clean_env.setenv(name, "https://elsewhere.example" if name == "PUBLIC_URL" else "60")
    clean_env.setenv("admins", "U1")  # any case
    (tmp_path / ".env").write_text("public_url=https://elsewhere.example\nSECRET=s\n")
    settings = Settings.from_env()
    assert settings.public_url is None and settings.admins is None and settings.secret is None
    assert settings.data_dir == Settings().data_dir != Path("60")
    assert settings.link_ttl_seconds == 3600


def test_documented_names_and_field_names_in_code_still_work(clean_env, tmp_path):
    clean_env.setenv("ARXIVSCOUT_PUBLIC_URL", "https://scout.example")
    (tmp_path / ".env").write_text("ARXIVSCOUT_ADMINS=U1\nredis_url=redis://h:6379\n")
    settings = Settings.from_env()
    assert settings.public_url == "https://scout.example" and settings.admins == "U1"
    assert settings.redis_url == "redis://h:6379"  # REDIS_URL, in another case
    assert Settings(public_url="https://x.example", data_dir=tmp_path).data_dir == tmp_path


# -- 4. servers that are no Redis, or lack FT._LIST in their own words -------------------------


async def serve_once(answer) -> tuple[asyncio.Server, str]:
    """A local TCP server that answers every request with `answer(request)`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while request := await reader.read(65536):
                writer.write(answer(request))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"


def http_answer(request: bytes) -> bytes:
    return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def upstash_answer(request: bytes) -> bytes:
    """RESP replies, one per command in `request` (redis-py may send several at once)."""
    replies = []
    for command in request.split(b"*")[1:]:
        name = command.split(b"\r\n")[2].upper() if command.count(b"\r\n") > 2 else b""
        if name == b"PING":
            replies.append(b"+PONG\r\n")
        elif name == b"HELLO":  # redis-py 8 opens with HELLO 3 (8.2 reads its answer's map)
            replies.append(b"%1\r\n$5\r\nproto\r\n:3\r\n")
        elif name == b"FT._LIST":
            replies.append(b"-ERR Command is not available: 'FT._LIST'\r\n")
        elif name == b"MODULE":
            replies.append(b"-ERR Command is not available: 'MODULE'\r\n")
        else:
            replies.append(b"+OK\r\n")
    return b"".join(replies)


async def test_a_port_that_speaks_http_is_refused_with_a_hint():
    server, url = await serve_once(http_answer)
    try:
        with pytest.raises(RedisCapabilityError, match=r"is this a Redis port\?"):
            await connect(url, warm=0)
    finally:
        server.close()


async def test_ft_list_not_available_counts_as_no_query_engine():
    server, url = await serve_once(upstash_answer)
    try:
        with pytest.raises(RedisCapabilityError, match=r"lacks the Query Engine.*not available"):
            await connect(url, warm=0)
    finally:
        server.close()


async def test_an_acl_user_without_search_gets_the_refusal_not_a_trace(client, redis_url):
    """A real Redis whose user may not run FT.* (NOPERM)."""
    user, password = f"s28-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await client.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all", "-FT._LIST"
    )
    try:
        address = redis_url.rsplit("@", 1)[-1].split("://")[-1]
        with pytest.raises(RedisCapabilityError, match=r"may not run FT._LIST.*@search"):
            await connect(f"redis://{user}:{password}@{address}", warm=0)
    finally:
        await client.execute_command("ACL", "DELUSER", user)
