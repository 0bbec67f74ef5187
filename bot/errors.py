"""Errors of the agent layer that adapters and the CLI show as they are."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it and says how to fix it."""
