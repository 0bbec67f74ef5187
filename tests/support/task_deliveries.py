"""The stream's own count of a running task's deliveries (XPENDING), for a test's handler,
which is given payloads only: found by its payload among the stream's pending entries."""

from __future__ import annotations

import json

from memory.tasks import TaskStream


async def payload_deliveries(stream: TaskStream, payload: dict) -> int:
    """How many times the pending task queued with `payload` was delivered (a requeued one's
    `requeued` mark, added when it is read, aside); 0 if it is not pending."""
    queued = {key: value for key, value in payload.items() if key != "requeued"}
    for entry_id, fields in await stream.redis.xrange(stream.stream):
        text = fields.get(b"payload", fields.get("payload"))
        if text is not None and json.loads(text) == queued:
            entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            return await stream.deliveries(entry)
    return 0
