"""A whole tenant erased (memory/governance_tenants.py): by `arxivscout memory forget tenant`, or
`ARXIVSCOUT_UNINSTALLED_KEEP_DAYS` after its team removed the bot (Slack `app_uninstalled`,
`tokens_revoked`; Discord `on_guild_remove`), by any process's tick; the bot coming back
cancels it. Against the real Redis, the local Slack API and the spec'd Discord fakes (the
gateway's `on_guild_remove`/`on_guild_join` are called on the adapter's client, as Discord's
dispatch calls them, with a spec'd `discord.Guild`)."""

from __future__ import annotations

import time
import uuid

import pytest

from bot.upkeep import Upkeep
from memory.dead_letters import dead_letters
from memory.governance_tenants import DAY, TenantErasures
from memory.keys import (
    busy_tenants_key,
    forgetting_key,
    tenant_key,
    uninstalled_key,
    watches_due_key,
)
from memory.scope import Scope
from memory.stores.turn_records import TurnUsage
from memory.stores.watches import WatchStore
from memory.tasks import TaskStream
from tests import test_dead_letters_erasure, test_discord
from tests.support.discord_fakes import FakeDiscord
from tests.support.redis_monitor import monitored
from tests.support.slack_api import BOT_USER, message
from tests.test_cli_memory import arxivscout, seeded
from tests.test_dead_letters_erasure import bury
from tests.test_discord import new_adapter
from tests.test_slack import slack_world, ts

world = test_discord.world  # its fixture: a bot process (real agent, scripted model)
stream = test_dead_letters_erasure.stream  # its fixture: a task stream of the deployment's naming


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        yield env


async def held(memory, tenant: str) -> list[str]:
    """Every key of the tenant (its own slot's, and its vector stores' documents)."""
    patterns = [tenant_key(tenant, "*")]
    patterns += [f"{store.key_prefix(tenant)}*" for store in memory.vector_stores
                 if store.TENANT_SCOPED]  # fmt: skip
    return [k for p in patterns async for k in memory.redis.scan_iter(match=p, count=1000)]


async def full_tenant(memory, stream: TaskStream, tenant: str) -> None:
    """Messages, an entity, a paper, usage, a watch, a dead letter, a busy mark: a team's."""
    scope = await seeded(memory, tenant)
    await memory.turn_records.add_usage(scope, TurnUsage(10, 5, 1))
    await WatchStore(memory.redis).create(
        scope, "state space models", 86_400, platform="slack", channel="C1",
        now=time.time() + 1000 * DAY,
    )  # fmt: skip
    await bury(stream, "episodes", {"scope": scope.to_dict(), "messages": [], "tag": tenant})
    # as TurnQueue.push marks it, once per platform it queued turns on
    await memory.redis.sadd(busy_tenants_key(), f"slack:{tenant}", f"discord:{tenant}")


async def busy_members(memory, tenant: str) -> set[str]:
    members = {m.decode() for m in await memory.redis.smembers(busy_tenants_key())}
    return {m for m in members if m.endswith(f":{tenant}")}


async def due_members(memory, tenant: str) -> list[str]:
    members = await memory.redis.zrange(watches_due_key(), 0, -1)
    return [m.decode() for m in members if m.decode().startswith(f"{tenant}|")]


async def test_cli_erases_a_whole_tenant_and_leaves_another(memory, stream, capsys):
    gone, kept = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(2))
    for tenant in (gone, kept):
        await full_tenant(memory, stream, tenant)
    await TenantErasures(memory).schedule(gone)
    assert await held(memory, gone) and await due_members(memory, gone)

    code, out, _ = await arxivscout(capsys, "memory", "forget", "tenant", gone, "--yes")
    assert code == 0 and f"Forgot tenant {gone!r}" in out
    for what in ("1 threads", "2 messages", "1 papers", "1 entities", "1 topic watches",
                 "1 dead letters"):  # fmt: skip
        assert what in out
    assert await held(memory, gone) == []
    assert await due_members(memory, gone) == []
    assert not await busy_members(memory, gone)
    assert await memory.redis.zscore(uninstalled_key(), gone) is None
    assert [d.payload["tag"] for d in await dead_letters(stream)] == [kept]

    # the other tenant keeps everything
    assert [m.content for m in await memory.conversation.all(Scope(kept, "t1"))] == [
        "Tell me about the quokka paper.", "It studies marsupial memory.",
    ]  # fmt: skip
    assert len(await memory.knowledge_base.papers(Scope(kept), everywhere=True)) == 1
    assert len(await memory.entities.all(Scope(kept), everywhere=True)) == 1
    assert len(await due_members(memory, kept)) == 1
    assert await busy_members(memory, kept) == {f"slack:{kept}", f"discord:{kept}"}


async def test_the_erasure_keeps_its_lock_to_the_end(memory, stream, redis_url):
    """The drop of every key of the tenant leaves its erasure lock: taken once, and freed only
    by the erasure's release at its end, it never lapses mid-erasure for another process's
    tick to take and erase the tenant alongside."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    await full_tenant(memory, stream, tenant)
    lock = forgetting_key(tenant)

    seen = await monitored(redis_url, memory.redis, lambda: TenantErasures(memory).erase(tenant))

    on_lock = [c.name for c in seen if not c.in_script and lock in c.args]
    assert on_lock.count("SET") == 1 and "DEL" not in on_lock
    assert await held(memory, tenant) == []  # released at the end


async def test_slack_removal_schedules_and_a_later_event_cancels(slack):
    team, other = f"T{time.time_ns()}", f"T{time.time_ns() + 1}"
    tenants = slack.world.runtime.harness.upkeep.tenants
    response = await slack.a.event({"type": "app_uninstalled"}, team=team)
    assert response.status == 200
    due = await tenants.scheduled(team)
    assert due is not None and 29.9 * DAY < due - time.time() <= 30 * DAY

    # a person's token revoked is not the app leaving; the bot's is
    person = {"type": "tokens_revoked", "tokens": {"oauth": ["U1"], "bot": []}}
    assert (await slack.b.event(person, team=other)).status == 200
    assert await tenants.scheduled(other) is None
    bot = {"type": "tokens_revoked", "tokens": {"oauth": ["U1"], "bot": [BOT_USER]}}
    assert (await slack.b.event(bot, team=other)).status == 200
    assert await tenants.scheduled(other) is not None
    # an org app's access to some of its workspaces revoked
    org = [f"T{time.time_ns() + 2}", f"T{time.time_ns() + 3}"]
    revoked = {"type": "team_access_revoked", "team_ids": org}
    assert (await slack.a.event(revoked, team=org[0])).status == 200
    assert None not in [await tenants.scheduled(t) for t in org]

    # any event from the team, on any process, even one the bot ignores: it is back
    response = await slack.b.event(message("just chatting", ts(1)), team=team)
    assert response.status == 200
    assert await tenants.scheduled(team) is None
    assert await tenants.scheduled(other) is not None  # another team's stays
    await tenants.cancel([other, *org])


async def test_discord_guild_removal_schedules_and_rejoin_cancels(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    guild = fake.guild()
    tenants = world.runtime.harness.upkeep.tenants
    await adapter.client.on_guild_remove(guild)
    assert await tenants.scheduled(str(guild.id)) is not None
    await adapter.client.on_guild_join(guild)
    assert await tenants.scheduled(str(guild.id)) is None

    # a person's DMs are theirs: never scheduled as a server's
    assert await world.runtime.harness.upkeep.bot_removed(f"dm-{fake.snowflake()}") is None
    dm = [m for m in await world.runtime.memory.redis.zrange(uninstalled_key(), 0, -1)
          if m.startswith(b"dm-")]  # fmt: skip
    assert dm == []


async def test_the_tick_erases_a_due_tenant_and_not_one_not_due(memory, stream):
    upkeep = Upkeep(memory, None, None, uninstalled_keep_days=0)  # type: ignore[arg-type]
    due, later = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(2))
    for tenant in (due, later):
        await full_tenant(memory, stream, tenant)
    await upkeep.bot_removed(due)  # 0 days: at the next tick
    await TenantErasures(memory, keep_days=30).schedule(later)

    # another erasure of the tenant runs: it waits for the next tick
    await memory.redis.set(forgetting_key(due), "another", px=60_000)
    assert due not in await upkeep.erase_uninstalled()
    assert await held(memory, due) and await upkeep.tenants.scheduled(due) is not None
    await memory.redis.delete(forgetting_key(due))

    erased = await upkeep.erase_uninstalled()
    assert due in erased and later not in erased
    assert await held(memory, due) == [] and await due_members(memory, due) == []
    assert await upkeep.tenants.scheduled(due) is None
    assert [d.payload["tag"] for d in await dead_letters(stream)] == [later]
    assert await held(memory, later) and await upkeep.tenants.scheduled(later) is not None
    assert len(await memory.conversation.all(Scope(later, "t1"))) == 2
    await TenantErasures(memory).erase(later)  # leave nothing scheduled for other tests
