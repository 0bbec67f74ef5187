"""A tenant's kind is read from its shape in one place (memory/scope.py `tenant_kind`), by the
Slack and Discord watches and by imports alike; and a Discord DM's viewer record stored before
DM owners stopped being admins makes no admin (adapters/memory_page/access.py `viewer_of`),
while ARXIVSCOUT_ADMINS still does. The viewer cache is a real Redis."""

from __future__ import annotations

import uuid

from adapters.discord_watch import of_tenant
from adapters.memory_page.access import (
    Admins,
    Directories,
    DiscordDirectory,
    viewer_of,
    viewer_record,
)
from adapters.memory_page.viewer import Viewer
from adapters.slack_watch import not_a_workspace
from memory.portability_write import impossible_place
from memory.scope import TenantKind, tenant_kind
from memory.web_sessions import ViewerCache


def test_a_tenant_s_kind_is_read_from_its_shape():
    assert tenant_kind("123456789012345678") is TenantKind.DISCORD_SERVER
    assert tenant_kind("dm-123456789012345678") is TenantKind.DISCORD_DM
    assert tenant_kind("T0123ABC") is TenantKind.SLACK
    assert tenant_kind("dm-someone") is TenantKind.UNKNOWN
    for tenant in ("123", "dm-123", "dm-someone"):
        assert not_a_workspace(tenant), tenant
        assert impossible_place(tenant, "slack", "C1"), tenant
    assert not not_a_workspace("T0123ABC") and not impossible_place("T0123ABC", "slack", "C1")
    assert impossible_place("dm-someone", "discord", "42")
    assert not impossible_place("dm-7", "discord", "42") and not impossible_place(
        "7", "discord", "42"
    )
    assert not of_tenant(object(), "dm-7")  # no DM channel of that person's


def old_dm_record(user: str) -> dict:
    """What the viewer cache (or a session) kept of a Discord DM's owner before: an admin."""
    record = viewer_record(Viewer(f"dm-{user}", user, "discord", admin=True, name=user))
    record.pop("version")
    return record


def test_a_dm_owner_s_record_from_before_makes_no_admin():
    user = "4242"
    viewer = viewer_of(old_dm_record(user))
    assert viewer.owner and not viewer.admin and viewer.manages
    someone_else = viewer_of({**old_dm_record(user), "user": "999"})
    assert not someone_else.owner and not someone_else.admin
    named = Viewer(f"dm-{user}", user, "discord", admin=True, owner=True)  # ARXIVSCOUT_ADMINS
    assert viewer_of(viewer_record(named)).admin  # a record of today's version is read as is
    slack_admin = viewer_of({**old_dm_record(user), "tenant": "T1", "platform": "slack"})
    assert slack_admin.admin  # only Discord DM tenants are derived again


async def test_a_cached_dm_owner_is_no_admin_unless_arxivscout_admins_names_them(memory):
    user = str(uuid.uuid4().int % 10**18)
    cache = ViewerCache(memory.redis)
    await cache.put("discord", f"dm-{user}", user, old_dm_record(user))
    discord = DiscordDirectory(token=None)
    viewer = await Directories(cache, discord=discord).viewer(f"dm-{user}", user, "discord")
    assert viewer.owner and not viewer.admin
    named = Directories(cache, Admins(f"dm-{user}:{user}"), discord=discord)
    assert (await named.viewer(f"dm-{user}", user, "discord")).admin
