"""The Slack app manifest subscribes to every event the adapter listens for, and no other.

Slack delivers an event only to an app subscribed to it, so a handler without its subscription
never runs (the uninstall erasure did not, before `app_uninstalled` was added).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# Events Slack sends without a bot-event subscription, or only to apps this manifest is not.
UNSUBSCRIBED = {
    "team_access_revoked",  # org-wide apps only; the manifest has org_deploy_enabled: false
}
# Bot events whose handler is the adapter's one `message` listener.
MESSAGE_EVENTS = {"message.channels", "message.groups", "message.im", "message.mpim"}


def handled_events() -> set[str]:
    events: set[str] = set()
    for path in (ROOT / "adapters").glob("slack*.py"):
        events.update(re.findall(r"\.event\(\s*\"([a-z_.]+)\"", path.read_text()))
    return events


def subscribed_events() -> set[str]:
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    return set(manifest["settings"]["event_subscriptions"]["bot_events"])


def test_every_handled_event_is_subscribed() -> None:
    handled = handled_events()
    assert {"app_mention", "message", "app_uninstalled", "tokens_revoked"} <= handled
    wanted = (handled - {"message"} - UNSUBSCRIBED) | MESSAGE_EVENTS
    assert wanted - subscribed_events() == set()


def test_every_subscribed_event_is_handled() -> None:
    subscribed = subscribed_events()
    handled = handled_events()
    unhandled = {e for e in subscribed if e not in handled and e not in MESSAGE_EVENTS}
    assert unhandled == set()
