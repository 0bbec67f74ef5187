"""Deployed on Heroku or Fly: which Redis a process uses, and where memory-page links point.

An unset REDIS_URL would start the embedded Redis on a disk that is lost at the next restart,
one for each process: refused there (on Fly, ARXIVSCOUT_DATA_DIR naming a volume allows it for
one machine; Heroku has no volumes, so nothing does: tests/test_deploy_audit_s28.py). Heroku's Redis
Cloud add-on sets REDISCLOUD_URL. Links default to the Fly app's address; a Heroku web dyno
without ARXIVSCOUT_PUBLIC_URL refuses to start (its own address is localhost)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app import runtime
from app.commands.web_cmd import page_wiring
from app.settings import Settings
from bot.errors import ConfigError
from tests.conftest import free_port

PLATFORM_VARIABLES = ("REDIS_URL", "REDISCLOUD_URL", "ARXIVSCOUT_DATA_DIR", "DYNO",
                      "FLY_APP_NAME", "ARXIVSCOUT_PUBLIC_URL")  # fmt: skip


@pytest.fixture
def deployed(monkeypatch, tmp_path):
    """A clean environment whose default data directory is the test's own."""
    for name in PLATFORM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return monkeypatch


def test_heroku_redis_cloud_add_on_url_is_used_when_redis_url_is_unset(deployed):
    deployed.setenv("DYNO", "web.1")
    deployed.setenv("REDISCLOUD_URL", "redis://default:pw@redis-1.cloud.example:12345")
    assert (
        runtime.redis_url(Settings.from_env()) == "redis://default:pw@redis-1.cloud.example:12345"
    )
    deployed.setenv("REDIS_URL", "redis://chosen.example:6379")  # REDIS_URL comes first
    assert runtime.redis_url(Settings.from_env()) == "redis://chosen.example:6379"


@pytest.mark.parametrize("platform", [("DYNO", "worker.1"), ("FLY_APP_NAME", "scout")])
def test_the_embedded_redis_is_refused_on_a_dyno_or_fly_machine(deployed, platform):
    deployed.setenv(*platform)
    settings = Settings.from_env()
    try:
        with pytest.raises(ConfigError, match=r"^REDIS_URL is not set: on (Heroku|Fly) .*"):
            runtime.redis_url(settings)
    finally:  # without the refusal, a server was started in the test's directory
        runtime.embedded_redis(settings).stop()


def test_a_volume_allows_the_embedded_redis_on_a_fly_machine(deployed, data_dir, redis_server):
    deployed.setenv("FLY_APP_NAME", "scout")
    deployed.setenv("ARXIVSCOUT_DATA_DIR", str(data_dir))  # a mounted volume: allowed
    assert runtime.redis_url(Settings.from_env()) == redis_server.running_url()


async def test_links_point_to_the_fly_app_by_default(deployed, memory):
    deployed.setenv("FLY_APP_NAME", "scout")
    wiring = await page_wiring(Settings.from_env(), memory, own_url="http://localhost:3000")
    assert wiring.links.page("/memory") == "https://scout.fly.dev/memory"
    deployed.setenv("ARXIVSCOUT_PUBLIC_URL", "https://scout.example.org")
    wiring = await page_wiring(Settings.from_env(), memory, own_url="http://localhost:3000")
    assert wiring.links.page("/memory") == "https://scout.example.org/memory"


async def test_a_heroku_web_dyno_without_a_public_url_refuses_to_serve_links(deployed, memory):
    deployed.setenv("DYNO", "web.1")
    with pytest.raises(ConfigError, match=r"^ARXIVSCOUT_PUBLIC_URL is not set: on Heroku"):
        await page_wiring(Settings.from_env(), memory, own_url="http://localhost:3000")


def test_the_slack_web_process_on_heroku_says_so_in_one_line_before_anything_slow(cli_env):
    env = {
        **cli_env,
        "DYNO": "web.1",
        "SLACK_BOT_TOKEN": "xoxb-test",
        "OPENAI_API_KEY": "k",
        "SLACK_SIGNING_SECRET": "s",
        "SLACK_API_URL": f"http://127.0.0.1:{free_port()}/api/",
    }
    env.pop("ARXIVSCOUT_PUBLIC_URL", None)
    result = subprocess.run([sys.executable, "-m", "app.cli", "slack", "--port", "0"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ARXIVSCOUT_PUBLIC_URL is not set" in lines[0], result.stderr


def test_the_worker_as_heroku_web_process_says_so_before_opening_the_memory(cli_env):
    """The Discord-only setup (`web: arxivscout worker`): refused before Redis is reached (an
    unreachable one would otherwise be what it says)."""
    env = {**cli_env, "DYNO": "web.1", "DISCORD_TOKEN": "discord-test", "OPENAI_API_KEY": "k",
           "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "PORT": str(free_port())}  # fmt: skip
    env.pop("ARXIVSCOUT_PUBLIC_URL", None)
    result = subprocess.run([sys.executable, "-m", "app.cli", "worker"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "ARXIVSCOUT_PUBLIC_URL is not set" in result.stderr, result.stderr
    assert "Redis" not in result.stderr


async def test_the_redis_connections_of_a_process_are_capped_by_a_setting(deployed, redis_url):
    deployed.setenv("REDIS_URL", redis_url)
    deployed.setenv("ARXIVSCOUT_REDIS_MAX_CONNECTIONS", "7")
    memory = await runtime.open_memory(Settings.from_env(), check_indexes=False)
    try:
        assert memory.redis.connection_pool.max_connections == 7
    finally:
        await memory.close()
