"""The one error ingestion raises: its message is meant for the user as is."""

from __future__ import annotations


class IngestError(ValueError):
    """A source could not be ingested (bad id, unreadable file, arXiv error); says why."""
