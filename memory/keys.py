"""Every Redis key and index name ArxivScout uses, built here and nowhere else, and the checks on
tenant and thread names that keep a name from escaping its place in a key."""

from __future__ import annotations

import re

ROOT = "arxivscout"
INDEX_META_KEY = f"{ROOT}:indexmeta"

# Vector-index families: `<name>:<tenant>` per tenant, over the keys `<prefix>:<tenant>:...`.
# These keys carry no hash tag on purpose: on a sharded Redis a tenant's documents spread over
# the shards, and so does the work of searching them. No script or MULTI spans two documents,
# and a DEL of several goes out as one DEL per slot (`memory/stores/base.py` `delete_keys`).
KB_INDEX, KB_PREFIX = f"{ROOT}_kb", f"{ROOT}:kb"
WORKFLOW_INDEX, WORKFLOW_PREFIX = f"{ROOT}_workflow", f"{ROOT}:workflow"
ENTITY_INDEX, ENTITY_PREFIX = f"{ROOT}_entity", f"{ROOT}:entity"
TOOLBOX_INDEX, TOOLBOX_PREFIX = f"{ROOT}_toolbox", f"{ROOT}:tool"
EPISODE_INDEX, EPISODE_PREFIX = f"{ROOT}_episode", f"{ROOT}:episode"

_TENANT = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_TENANT_KEY = re.compile(rf"^{ROOT}:t:\{{([A-Za-z0-9_.\-]{{1,64}})\}}:")
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
    """A key of the tenant's own. The tenant stands in braces, a Redis Cluster hash tag: all of
    a tenant's keys hash to one slot, so a script or MULTI over several of them (a message and
    its thread list, a summary and its thread's index) runs on a sharded Redis too."""
    return ":".join((ROOT, "t", f"{{{validate_tenant(tenant)}}}", *parts))


def tenant_of_key(key: str) -> str | None:
    """The tenant whose `tenant_key` this is, or None for any other key."""
    found = _TENANT_KEY.match(key)
    return found.group(1) if found else None


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


def paper_save_key(tenant: str, arxiv_id: str) -> str:
    """Held (SET NX PX, an owner's token) by one save of a paper while it removes, writes or
    takes back its chunks: two saves of one paper never interleave (knowledge_base.py)."""
    return tenant_key(tenant, "paper-save", arxiv_id)


def shared_pdf_key(tenant: str, share_id: str) -> str:
    """Hash of one PDF shared in chat being read (memory/ingest/shared_pdf.py): the progress
    message it posted and its outcome, so a redelivered task edits that message again."""
    return tenant_key(tenant, "shared-pdf", share_id)


def shared_pdf_lock_key(tenant: str, share: str) -> str:
    """Lock of one share's task while it runs: a second copy (a redelivery, Slack's retry)
    waits, so a long read is never run twice at once nor its message posted twice."""
    return tenant_key(tenant, "shared-pdf-lock", share)


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
    """The lease of the process draining a thread's queue: renewed while it runs; when it
    lapses (a dead process), any live process may take the thread over."""
    return thread_key(tenant, thread_id, "queue-lock")


def turn_running_key(tenant: str, thread_id: str) -> str:
    """The job a thread's lease holder is running (JSON, with its progress): put back first
    when the lease lapses."""
    return thread_key(tenant, thread_id, "queue-running")


def turn_done_key(tenant: str, job_id: str) -> str:
    """Present once a job's reply was delivered, so a re-run never answers twice."""
    return tenant_key(tenant, "job-done", job_id)


def appended_key(tenant: str, once: str) -> str:
    """The position of a message appended under the idempotency key `once` (a job's id and
    role), so a re-run job does not store its question or answer twice."""
    return tenant_key(tenant, "appended", once)


def appended_id_key(tenant: str, once: str) -> str:
    """The id of that message (beside its position, which stays a bare number for processes
    of the version before ids were kept); in the tenant's slot, like the position."""
    return tenant_key(tenant, "appended-id", once)


def busy_threads_key(tenant: str) -> str:
    """Sorted set of a tenant's threads with queued or running jobs, scored by when they were
    last pushed to; every process scans it for threads whose lease lapsed."""
    return tenant_key(tenant, "busy-threads")


def seen_event_key(tenant: str, event_id: str) -> str:
    """Present once a platform event was taken, so a redelivery is recognised."""
    return tenant_key(tenant, "seen", event_id)


def retention_key(tenant: str) -> str:
    """The tenant's own retention period for conversation memory, in seconds ("off": kept for
    ever); absent, the setting's default applies (memory/retention.py)."""
    return tenant_key(tenant, "retention")


def retention_swept_key(tenant: str) -> str:
    """Hash: when the tenant's conversation memory was last swept, and what went."""
    return tenant_key(tenant, "retention", "swept")


def sweep_claim_key(bucket: int) -> str:
    """Taken (SET NX, with a TTL) by the one process that queues the retention sweeps of a
    sweep interval (`bucket`: the interval's number since the epoch)."""
    return f"{ROOT}:retention:sweep:{bucket}"


def watches_key(tenant: str) -> str:
    """Set of the ids of the tenant's topic watches (memory/stores/watches.py)."""
    return tenant_key(tenant, "watches")


def watch_key(tenant: str, watch_id: str) -> str:
    """Hash of one topic watch: what it asks, where it posts, and its schedule."""
    return tenant_key(tenant, "watch", watch_id)


def watch_posted_key(tenant: str, watch_id: str) -> str:
    """Sorted set of the arXiv ids a watch's digests posted, scored by when: never twice."""
    return tenant_key(tenant, "watch", watch_id, "posted")


def watch_seen_key(tenant: str, watch_id: str) -> str:
    """Sorted set of the arXiv ids a watch's digests were given (posted or not), scored by the
    earliest digest's `until`: a paper announced late is asked again, and not shown twice."""
    return tenant_key(tenant, "watch", watch_id, "seen")


def digest_key(tenant: str, watch_id: str, due: str) -> str:
    """Hash of one digest of a watch, for the period due at `due`: its claim (taken once, by
    one process), whether it is being posted or was posted, and the posted message."""
    return tenant_key(tenant, "watch", watch_id, "digest", due)


def digest_lock_key(tenant: str, watch_id: str, due: str) -> str:
    """Held (with a TTL) by the process running a digest, so two never run it at once."""
    return tenant_key(tenant, "watch", watch_id, "digest", due, "lock")


def watch_answered_key(digest: str) -> str:
    """Set (with a TTL) once a Save button's answer was sent: a task run again says it once
    (`digest` hashes the task; process-wide, so even a task with a malformed tenant is)."""
    return f"{ROOT}:watch-answered:{digest}"


def watch_answer_pending_key(digest: str) -> str:
    """A Save answer the platform did not take, kept for the task's next run; braced around
    its claim's key (`watch_answered_key`), so both hash to one slot and change together."""
    return f"{{{watch_answered_key(digest)}}}:pending"


def arxiv_slot_key() -> str:
    """Held by one process at a time while its arXiv request runs, then for arXiv's 3 s
    between requests (memory/ingest/arxiv_pace.py)."""
    return f"{ROOT}:arxiv-slot"


def arxiv_blocked_key() -> str:
    """Set after arXiv answered 429 (or 503) with a long Retry-After, living that long, its
    status as value: every process fails fast until it lapses (memory/ingest/arxiv_pace.py)."""
    return f"{ROOT}:arxiv-blocked"


def import_partial_key(tenant: str) -> str:
    """The start time of an unfinished import into the tenant: after a crash, the next import
    clears what it left, unless the tenant was used since (memory/portability.py)."""
    return tenant_key(tenant, "importing")


def import_running_key(tenant: str) -> str:
    """Set (the import's lock's token and TTL, renewed with it) while an import into the tenant
    runs, from right after it takes its lock to its end: the append script refuses messages
    while it is there (memory/stores/conversation.py). In the tenant's slot, so that script
    reads it; a crashed import's lapses with its lock."""
    return tenant_key(tenant, "import-running")


def import_lock_key(tenant: str) -> str:
    """Held (with a TTL, renewed) while an import into the tenant runs: one at a time. Not a
    tenant key, so clearing a half-imported tenant does not drop it."""
    return f"{ROOT}:import-lock:{validate_tenant(tenant)}"


def turn_record_key(tenant: str, turn_id: str) -> str:
    """Hash of one answered turn (memory/stores/turn_records.py): who asked what, the answer,
    the memory and tools it used, its usage, and each person's feedback (`vote:<user>`)."""
    return tenant_key(tenant, "turn", turn_id)


def turn_records_key(tenant: str, thread_id: str | None = None) -> str:
    """Sorted set of the tenant's (or one thread's) turn records, scored by when answered."""
    if thread_id is None:
        return tenant_key(tenant, "turns")
    return thread_key(tenant, thread_id, "turns")


def turns_by_key(tenant: str, role: str, user: str) -> str:
    """Set of the turn ids a person asked (`role` "asker") or voted on ("voter"): what
    forgetting that person reads, instead of every record."""
    return tenant_key(tenant, "turns", role, user)


def turn_messages_key(tenant: str) -> str:
    """Hash stored message id (a turn's question or answer) -> its turn id, for forgetting a
    message."""
    return tenant_key(tenant, "turns", "messages")


def feedback_key(tenant: str) -> str:
    """Sorted set of the tenant's turns that got feedback, scored by the latest vote's time."""
    return tenant_key(tenant, "feedback")


def usage_key(tenant: str, thread_id: str | None = None, day: str | None = None) -> str:
    """Hash of model usage (tokens in and out, model and tool calls, turns): the tenant's, one
    thread's, or the tenant's on one day (YYYY-MM-DD, UTC)."""
    if thread_id is not None:
        return thread_key(tenant, thread_id, "usage")
    return tenant_key(tenant, "usage", *(("day", day) if day else ()))


def usage_threads_key(tenant: str) -> str:
    """Sorted set thread -> tokens (in + out) used there: the tenant's top threads."""
    return tenant_key(tenant, "usage-threads")


# -- process-wide ---------------------------------------------------------------------------


def watches_due_key() -> str:
    """Sorted set `<tenant>|<watch id>` scored by the watch's next due time: what the
    schedulers of every process look at each minute."""
    return f"{ROOT}:watches:due"


def busy_tenants_key() -> str:
    """Set of the tenants that ever queued a job: where to look for lapsed leases."""
    return f"{ROOT}:busy-tenants"


def discord_cursors_key(tenant: str) -> str:
    """Hash place -> the id of the last message seen there, for each Discord channel, thread
    or DM the bot answers in (forward only; expires a week after the last): where a new
    gateway session catches up on what was posted while none was up
    (adapters/discord_catchup.py)."""
    return tenant_key(tenant, "discord-cursors")


def discord_given_up_key(tenant: str) -> str:
    """Hash "<place>:<message id>" -> 1 of the Discord messages the adapter gave up before
    their work was queued (expires the catch-up's window after the last): the next gateway
    session fetches each and takes it again (adapters/discord_catchup.py)."""
    return tenant_key(tenant, "discord-given-up")


def discord_cursor_tenants_key() -> str:
    """Set of the tenants that have a `discord_cursors_key` (DMs' tenants cannot be listed
    from the gateway's servers)."""
    return f"{ROOT}:discord-cursor-tenants"


def uninstalled_key() -> str:
    """Sorted set tenant -> when its whole memory is erased: the workspaces and servers that
    removed the bot (memory/governance_tenants.py); every process's tick erases the due ones."""
    return f"{ROOT}:uninstalled"


def sharing_changed_key() -> str:
    """Hash channel -> a token new at each of Slack's `channel_shared`/`channel_unshared` for
    it: every process's cached walls of that channel go when the token is not the one it saw
    (adapters/slack_walls.py). Slack sends the event to one process only."""
    return f"{ROOT}:slack:sharing-changed"


def embedding_cache_key(model: str, digest: str) -> str:
    """A cached vector. The model is the hash tag: the cache's entries for a model share a slot,
    so one MGET reads a batch's vectors on a sharded Redis too."""
    return f"{ROOT}:embcache:{{{model}}}:{digest}"


def index_name(family: str, tenant: str | None) -> str:
    return family if tenant is None else f"{family}:{validate_tenant(tenant)}"


def index_prefix(prefix: str, tenant: str | None) -> str:
    return f"{prefix}:" if tenant is None else f"{prefix}:{validate_tenant(tenant)}:"


def upgrade_key(name: str) -> str:
    """Set once a one-time upgrade step (e.g. a back-fill) is done; held while it runs."""
    return f"{ROOT}:upgrade:{name}"


def tenants_pattern() -> str:
    """Matches each tenant's thread list (`threads_key`), to find every tenant."""
    return f"{ROOT}:t:{{*}}:threads"


def task_stream(name: str = "tasks") -> str:
    """The stream of background work (see memory/tasks.py); a run of `eval` has its own, so a
    bot sharing the Redis does not take its tasks. Its hash tag puts its dead letters
    (`<stream>:dead`) in its slot: a task is moved there and acknowledged at once."""
    return f"{ROOT}:{{{name}}}"


def task_runs_key(stream: str) -> str:
    """Hash of the delivery each unfinished task's last started run began on (memory/tasks.py):
    in its stream's slot (the stream's hash tag), cleared with its ack in one MULTI."""
    return f"{stream}:started"


def dead_letters_key(stream: str) -> str:
    """The stream of a task stream's dead letters (memory/dead_letters.py): in its slot (the
    stream's hash tag), written in one MULTI with the task's ack."""
    return f"{stream}:dead"


def dead_letter_streams_key() -> str:
    """Set of the task streams that ever had a dead letter: where erasures and `arxivscout
    tasks` look, instead of scanning every key (memory/dead_letters.py)."""
    return f"{ROOT}:dead-letter-streams"


def dead_letters_pattern() -> str:
    """Matches the dead letters (`<stream>:dead`) of every `task_stream`: where an operator
    finds what was given up (`arxivscout tasks dead`)."""
    return f"{ROOT}:{{*}}:dead"


def task_stream_name(stream: str) -> str:
    """The name a `task_stream` key was made from (`tasks`, `shared-files-slack`...)."""
    prefix = f"{ROOT}:{{"
    if stream.startswith(prefix) and stream.endswith("}"):
        return stream[len(prefix) : -1]
    return stream


def summarized_count_key(tenant: str, thread_id: str) -> str:
    """How many messages at the head of a thread's list are summarized (the summarized prefix's
    length), kept by the marking script so the unsummarized ones are read without a scan."""
    return thread_key(tenant, thread_id, "messages", "summarized")


def forgetting_key(tenant: str) -> str:
    """Held while something of a tenant's memory is forgotten (memory/governance.py): two
    erasures never rewrite the same summaries at once."""
    return tenant_key(tenant, "forgetting")


def erasing_key(tenant: str) -> str:
    """Hash message id -> number of parts, of forgotten messages whose episodic documents are
    still being deleted: every episodic read leaves them out meanwhile."""
    return tenant_key(tenant, "erasing")


def erasing_pattern() -> str:
    """Matches each tenant's erasing hash (`erasing_key`), to find purges left unfinished."""
    return f"{ROOT}:t:{{*}}:erasing"


def purging_key(tenant: str) -> str:
    """Set (expiring in a few minutes, renewed each batch) while a process purges the tenant's
    erasing hash: a leftover purge (memory/governance.py `purge_leftovers`) leaves it to it."""
    return tenant_key(tenant, "purging")


def deleted_message_key(tenant: str, source: str) -> str:
    """Set for a day when a person deleted their message on the platform (`source`: Slack's
    channel and ts, Discord's message id): a turn for it that is still queued is not run, and
    one that stored it meanwhile forgets it (memory/governance.py `forget_deleted`)."""
    return tenant_key(tenant, "deleted-message", source)


def erased_tenant_key(tenant: str) -> str:
    """Set for a day to when the whole tenant's erasure began (memory/governance_tenants.py),
    outside its keys (the erasure drops those): work queued before and run or given up after
    (a share, a dead letter) keeps nothing of it."""
    return f"{ROOT}:erased-tenant:{validate_tenant(tenant)}"


def erased_people_key(tenant: str) -> str:
    """Hash: a digest of each person erased from the tenant (memory/governance.py
    `forget_person`) -> when, kept for weeks (memory/erased_people.py): a share of theirs
    queued before and run after is not read."""
    return tenant_key(tenant, "erased-people")


def deleted_thread_key(tenant: str, thread_id: str) -> str:
    """Set for a day when a thread's channel (or the thread) was deleted on the platform: a turn
    that stores something there meanwhile ends by forgetting the whole thread again
    (memory/governance_places.py). A thread's erasure leaves it."""
    return thread_key(tenant, thread_id, "deleted")


def place_threads_key(tenant: str, channel: str) -> str:
    """Set of the Discord threads (their channel ids) the bot took part in under a channel: a
    Discord thread's id does not name its channel, so a deleted channel's are found here."""
    return tenant_key(tenant, "channel", channel, "threads")


def thread_channels_key(tenant: str) -> str:
    """Hash Discord thread id -> the channel whose `place_threads_key` lists it: a thread
    forgotten whole leaves its channel's record (memory/governance_places.py `unlist`)."""
    return tenant_key(tenant, "thread-channels")


def watch_removed_told_key(tenant: str, watch_id: str) -> str:
    """Set for a day once the creator of a watch removed with its deleted place was told
    (bot/watch_removals.py): a notice queued twice is said once."""
    return tenant_key(tenant, "watch", watch_id, "removed-told")


def edited_message_key(tenant: str, source: str) -> str:
    """Kept for a day when a person edited their message on the platform: its latest text (a
    turn for it still queued runs with it), and the old text of each stored message whose edit
    is under way (a run again after a crash finishes it): memory/governance_edits.py."""
    return tenant_key(tenant, "edited-message", source)


def learned_key(tenant: str, question_id: str) -> str:
    """Set of the entity and workflow keys that the stored question `question_id` taught
    (memory/governance_learned.py): forgetting or editing the question finds them here."""
    return tenant_key(tenant, "learned", question_id)


def dm_people_key(tenant: str) -> str:
    """Hash: each DM place's audience (`dm:<channel>`) -> the person whose DM it is, written
    when a message of a DM thread is stored (memory/stores/conversation.py): erasing the person
    takes every thread of their DMs whole, even where their own messages are tombstones (which
    keep no author) and only the bot's answers remain (memory/governance_sweeps.py)."""
    return tenant_key(tenant, "dm-people")


def shown_in_logs_key(tenant: str, message_id: str) -> str:
    """Set of the tool logs whose output showed the stored message `message_id`
    (memory/stores/tool_log.py): forgetting the message deletes them, so its text does not
    live on in another turn's log."""
    return tenant_key(tenant, "shown-in-logs", message_id)


def shown_in_logs_pattern() -> str:
    """Matches every tenant's shown-in-logs sets (`shown_in_logs_key`), for the one-time tidying
    of those that kept ids of logs gone (memory/migrate.py); `shown_in_logs_of_key` says which
    of the keys found really are such sets."""
    return f"{ROOT}:t:{{*}}:shown-in-logs:*"


def shown_in_logs_of_key(key: str) -> tuple[str, str] | None:
    """The tenant and message id of a `shown_in_logs_key`, or None for any other key (one the
    pattern matched through a brace or a thread id)."""
    tenant = tenant_of_key(key)
    if tenant is None:
        return None
    prefix = shown_in_logs_key(tenant, "")
    return (tenant, key[len(prefix) :]) if key.startswith(prefix) else None


def web_secret_key() -> str:
    """The memory page's link-signing secret, made once when ARXIVSCOUT_SECRET is unset, so
    every process signs and checks links alike."""
    return f"{ROOT}:web:secret"


def web_session_key(digest: str) -> str:
    """A memory-page session (JSON, with a TTL), under the SHA-256 of its cookie's value: the
    cookie itself is not stored."""
    return f"{ROOT}:web:session:{digest}"


def web_viewer_key(digest: str) -> str:
    """Who a person is on the memory page (admin, audiences), as Slack or Discord last said,
    cached for minutes; `digest` hashes platform, tenant and user."""
    return f"{ROOT}:web:viewer:{digest}"


def web_used_link_key(digest: str) -> str:
    """A memory-page sign-in link already turned into a session, kept until the link expires so
    it starts no second one; `digest` hashes the link's nonce, the value says which browser
    pressed it and which session that press started (memory/web_sessions.py `UsedLinks`)."""
    return f"{ROOT}:web:used-link:{digest}"


# -- the layout before hash tags (memory/migrate.py moves its keys) -----------------------------

LEGACY_PATTERNS = (f"{ROOT}:t:*", f"{ROOT}:embcache:*")  # where `tagged_key` finds old keys
_LEGACY_TENANT_KEY = re.compile(rf"^{ROOT}:t:([A-Za-z0-9_.\-]{{1,64}}):(.+)$", re.DOTALL)
_LEGACY_CACHE_KEY = re.compile(rf"^{ROOT}:embcache:([^{{}}]+):([0-9a-f]+)$")


def tagged_key(legacy: str) -> str | None:
    """The name a key from before hash tags has now (`arxivscout:t:<tenant>:...`, an embedding
    cache entry), or None when `legacy` is not such a key (already tagged, or another key)."""
    if found := _LEGACY_TENANT_KEY.match(legacy):
        return tenant_key(found.group(1), found.group(2))
    if found := _LEGACY_CACHE_KEY.match(legacy):
        return embedding_cache_key(found.group(1), found.group(2))
    return None


def legacy_renames() -> dict[str, str]:
    """The process-wide keys renamed for hash tags: old name -> new name."""
    return {f"{ROOT}:tasks": task_stream(), f"{ROOT}:tasks:dead": dead_letters_key(task_stream())}
