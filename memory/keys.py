"""Every Redis key and index name ArxivScout uses, built here and nowhere else, and the checks on
tenant and thread names that keep a name from escaping its place in a key."""

from __future__ import annotations

import re

ROOT = "arxivscout"
INDEX_META_KEY = f"{ROOT}:indexmeta"

# Vector-index families: `<name>:<tenant>` per tenant, over the keys `<prefix>:<tenant>:...`.
KB_INDEX, KB_PREFIX = f"{ROOT}_kb", f"{ROOT}:kb"
WORKFLOW_INDEX, WORKFLOW_PREFIX = f"{ROOT}_workflow", f"{ROOT}:workflow"
ENTITY_INDEX, ENTITY_PREFIX = f"{ROOT}_entity", f"{ROOT}:entity"
TOOLBOX_INDEX, TOOLBOX_PREFIX = f"{ROOT}_toolbox", f"{ROOT}:tool"
EPISODE_INDEX, EPISODE_PREFIX = f"{ROOT}_episode", f"{ROOT}:episode"

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


# -- per tenant and per thread ----------------------------------------------------------------


def tenant_key(tenant: str, *parts: str) -> str:
    return ":".join((ROOT, "t", validate_tenant(tenant), *parts))


def thread_key(tenant: str, thread_id: str, *parts: str) -> str:
    return tenant_key(tenant, "thread", validate_thread(thread_id), *parts)


def threads_key(tenant: str) -> str:
    """Sorted set of a tenant's threads, scored by last activity."""
    return tenant_key(tenant, "threads")


def messages_key(tenant: str, thread_id: str) -> str:
    """List of a thread's messages, oldest first."""
    return thread_key(tenant, thread_id, "messages")


def summarizing_key(tenant: str, thread_id: str) -> str:
    """Held while a summary of the thread is written, so two are never written at once."""
    return thread_key(tenant, thread_id, "messages", "summarizing")


def record_key(tenant: str, kind: str, record_id: str) -> str:
    """Hash of one per-thread record (a summary, a tool log)."""
    return tenant_key(tenant, kind, record_id)


def thread_records_key(tenant: str, thread_id: str, plural: str) -> str:
    """Sorted set of a thread's records of one kind, in creation order."""
    return thread_key(tenant, thread_id, plural)


def papers_key(tenant: str) -> str:
    """Hash arxiv_id -> JSON record of the papers in a tenant's knowledge base."""
    return tenant_key(tenant, "papers")


def joined_key(tenant: str, thread_id: str) -> str:
    """Present while the bot takes part in a thread (it answers there without a mention)."""
    return thread_key(tenant, thread_id, "joined")


def last_thread_key(tenant: str, channel: str) -> str:
    """Hash user -> the platform's reference of their latest thread with the bot in a channel."""
    return tenant_key(tenant, "channel", channel, "last-thread")


def turn_queue_key(tenant: str, thread_id: str) -> str:
    """List of a thread's queued jobs, run one at a time in arrival order."""
    return thread_key(tenant, thread_id, "queue")


def turn_lock_key(tenant: str, thread_id: str) -> str:
    """Held by the process draining a thread's queue."""
    return thread_key(tenant, thread_id, "queue-lock")


# -- process-wide ---------------------------------------------------------------------------


def seen_event_key(event_id: str) -> str:
    """Present once a platform event was taken, so a redelivery is recognised."""
    return f"{ROOT}:seen:{event_id}"


def embedding_cache_key(model: str, digest: str) -> str:
    return f"{ROOT}:embcache:{model}:{digest}"


def index_name(family: str, tenant: str | None) -> str:
    return family if tenant is None else f"{family}:{validate_tenant(tenant)}"


def index_prefix(prefix: str, tenant: str | None) -> str:
    return f"{prefix}:" if tenant is None else f"{prefix}:{validate_tenant(tenant)}:"


def upgrade_key(name: str) -> str:
    """Set once a one-time upgrade step (e.g. a back-fill) is done; held while it runs."""
    return f"{ROOT}:upgrade:{name}"


def tenants_pattern() -> str:
    """Matches each tenant's thread list (`threads_key`), to find every tenant."""
    return f"{ROOT}:t:*:threads"


def task_stream() -> str:
    """The stream of background work (see memory/tasks.py)."""
    return f"{ROOT}:tasks"


def summarized_count_key(tenant: str, thread_id: str) -> str:
    """How many messages at the head of a thread's list are summarized (the summarized prefix's
    length), kept by the marking script so the unsummarized ones are read without a scan."""
    return thread_key(tenant, thread_id, "messages", "summarized")
