"""Every Redis key ArxivScout writes, in one place, and the checks on tenant and thread names."""

from __future__ import annotations

import re

ROOT = "arxivscout"
INDEX_META_KEY = f"{ROOT}:indexmeta"

_TENANT = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_THREAD_ID = 256


class InvalidName(ValueError):
    """A tenant or thread id that cannot be used as a memory key."""


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        raise InvalidName(
            f"Invalid tenant {tenant!r}: use 1 to 64 letters, digits, '_', '.' or '-'."
        )
    return tenant


def validate_thread(thread_id: str) -> str:
    if not isinstance(thread_id, str) or not thread_id.strip():
        raise InvalidName("The thread id must not be empty.")
    if len(thread_id) > MAX_THREAD_ID or any(ord(c) < 32 for c in thread_id):
        raise InvalidName(
            f"Invalid thread id {thread_id[:40]!r}: at most {MAX_THREAD_ID} printable characters."
        )
    return thread_id


def tenant_key(tenant: str, *parts: str) -> str:
    return ":".join((ROOT, "t", validate_tenant(tenant), *parts))


def thread_key(tenant: str, thread_id: str, *parts: str) -> str:
    return tenant_key(tenant, "thread", validate_thread(thread_id), *parts)


def threads_key(tenant: str) -> str:
    """Sorted set of a tenant's threads, scored by last activity."""
    return tenant_key(tenant, "threads")


def papers_key(tenant: str) -> str:
    """Hash arxiv_id -> JSON record of the papers in a tenant's knowledge base."""
    return tenant_key(tenant, "papers")
