"""👍 / 👎 under Slack answers, and the "What was wrong?" form.

- The last part of an answer gets an `actions` block with two buttons whose value is the
  turn's id (`with_feedback`, used by adapters/slack_delivery.py).
- 👍 records the vote and tells the person, ephemerally, thanks.
- 👎 records the vote and opens a modal (`views.open` with the action's `trigger_id`): a
  multiline "What was wrong?" and optional reasons; its submission stores the comment and
  turns the modal into a thank-you.
- Anyone who sees the message may vote (Slack shows it only to those who see the thread); each
  vote is theirs, by their user id, and a later vote replaces it (bot/feedback.py). A vote
  counts only in the channel the turn was answered in (`container.channel_id`).
- The tenant is the installation's workspace (adapters/platform_ids.py `slack_team`, as bolt's
  `context.team_id`): a button's `team.id`; the form's `view.app_installed_team_id` (submitted
  from another workspace of a Slack Connect channel, its `team` is that workspace). Not
  `user.team_id`: that is the person's home team, which in a Slack Connect channel may be
  another organisation's, and on Enterprise Grid an `E…` organisation id (Slack's
  block_actions / block_suggestion payload reference). It is a fallback only for a payload
  without `team`.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.platform_ids import slack_team
from bot.feedback import MAX_COMMENT, REASONS, THANKS, FeedbackService

log = logging.getLogger(__name__)

UP, DOWN, FORM = "feedback_up", "feedback_down", "feedback_form"
BLOCK = "feedback"
COMMENT, CHOICES = "comment", "reasons"


def feedback_block(turn_id: str) -> dict[str, Any]:
    """The two buttons; each carries the turn's id."""
    return {
        "type": "actions",
        "block_id": BLOCK,
        "elements": [
            {"type": "button", "action_id": UP, "value": turn_id,
             "text": {"type": "plain_text", "text": "👍", "emoji": True}},
            {"type": "button", "action_id": DOWN, "value": turn_id,
             "text": {"type": "plain_text", "text": "👎", "emoji": True}},
        ],
    }  # fmt: skip


def with_feedback(body: dict[str, Any], turn_id: str) -> dict[str, Any]:
    """A message body with the feedback buttons after its blocks (none without a turn id)."""
    if not turn_id:
        return body
    return {**body, "blocks": [*body.get("blocks", []), feedback_block(turn_id)]}


def feedback_form(turn_id: str) -> dict[str, Any]:
    """The 👎 modal: what was wrong, and reasons to tick."""
    options = [
        {"text": {"type": "plain_text", "text": label}, "value": value}
        for value, label in REASONS.items()
    ]
    return {
        "type": "modal", "callback_id": FORM, "private_metadata": turn_id,
        "title": {"type": "plain_text", "text": "What was wrong?"},
        "submit": {"type": "plain_text", "text": "Send"},
        "close": {"type": "plain_text", "text": "Skip"},
        "blocks": [
            {"type": "input", "block_id": COMMENT, "optional": True,
             "label": {"type": "plain_text", "text": "What was wrong?"},
             "element": {"type": "plain_text_input", "action_id": COMMENT, "multiline": True,
                         "max_length": MAX_COMMENT}},
            {"type": "input", "block_id": CHOICES, "optional": True,
             "label": {"type": "plain_text", "text": "Any of these?"},
             "element": {"type": "checkboxes", "action_id": CHOICES, "options": options}},
        ],
    }  # fmt: skip


def thanks_view(text: str) -> dict[str, Any]:
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Feedback"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }


def _channel(body: dict[str, Any]) -> str:
    """The channel of the message whose button was pressed."""
    return (body.get("container") or {}).get("channel_id") or (body.get("channel") or {}).get(
        "id", ""
    )


def _who(body: dict[str, Any]) -> tuple[str, str]:
    user = body.get("user") or {}
    return user.get("id", ""), user.get("name") or user.get("username") or ""


class SlackFeedback:
    """The listeners: thin, each one vote or one comment."""

    def __init__(self, service: FeedbackService, client: AsyncWebClient) -> None:
        self.service = service
        self.client = client

    def register(self, app: AsyncApp) -> None:
        app.action(UP)(self.on_up)
        app.action(DOWN)(self.on_down)
        app.view(FORM)(self.on_form)

    async def on_up(self, ack, body: dict, action: dict) -> None:
        await ack()
        user, name = _who(body)
        said = await self.service.vote(
            slack_team(body), action.get("value", ""), user, 1, name, channel=_channel(body)
        )
        await self._tell(body, said)

    async def on_down(self, ack, body: dict, action: dict) -> None:
        await ack()
        turn = action.get("value", "")
        user, name = _who(body)
        said = await self.service.vote(
            slack_team(body), turn, user, -1, name, channel=_channel(body)
        )
        if said != THANKS:  # not kept (forgotten, memory down): no form to fill in
            await self._tell(body, said)
            return
        try:
            await self.client.views_open(trigger_id=body["trigger_id"], view=feedback_form(turn))
        except (SlackApiError, KeyError) as exc:  # the 👎 is kept; only the form is missing
            log.info("could not open the feedback form: %s", exc)
            await self._tell(body, said)

    async def on_form(self, ack, body: dict, view: dict) -> None:
        values = (view.get("state") or {}).get("values") or {}
        comment = ((values.get(COMMENT) or {}).get(COMMENT) or {}).get("value") or ""
        ticked = ((values.get(CHOICES) or {}).get(CHOICES) or {}).get("selected_options") or []
        user, name = _who(body)
        said = await self.service.comment(
            slack_team(body), view.get("private_metadata", ""), user, comment,
            [o.get("value", "") for o in ticked], name,
        )  # fmt: skip
        await ack(response_action="update", view=thanks_view(said))

    async def _tell(self, body: dict, text: str) -> None:
        """An ephemeral answer in the message's thread, to the person who pressed."""
        channel = _channel(body)
        message = body.get("message") or {}
        thread_ts = message.get("thread_ts") or (body.get("container") or {}).get("thread_ts")
        if not channel:
            return
        try:
            await self.client.chat_postEphemeral(
                channel=channel, user=_who(body)[0], text=text,
                **({"thread_ts": thread_ts} if thread_ts else {}),
            )  # fmt: skip
        except SlackApiError as exc:
            log.info("could not thank %s: %s", _who(body)[0], exc)
