"""Long text typed into a Discord slash command's option (Discord lets a string option hold
6,000 characters) is echoed cut: a `/watch add` period it cannot read gets one refusal
Discord takes (under 2,000 characters), and an `/expand` id naming no summary one short
answer only to the person, not the channel flooded with the id over several messages."""

from __future__ import annotations

from tests.test_discord import adapter, fake, world  # noqa: F401 (fixtures)
from tests.test_discord_feedback import answered
from tests.test_watches_discord import api, env, watch_command  # noqa: F401 (fixtures)


async def test_watch_add_refuses_a_long_period_in_one_answer_discord_takes(env):  # noqa: F811
    world_, fake_, adapter_, api_ = env
    guild = fake_.guild()
    channel, user = fake_.text_channel(guild), fake_.snowflake()
    period = "every fortnight or so " * 140  # 3,080 characters
    adapter_.client._connection.parse_interaction_create(
        watch_command(guild.id, channel.id, user, "add", topic="state space models", period=period)
    )
    [refused] = await answered(api_, 1)  # the stand-in, as Discord, refuses over 2,000
    content = refused["data"]["content"]
    assert content.startswith("I cannot read the period 'every fortnight or so every")
    assert len(content) < 2000 and "…" in content and "every N days" in content
    assert refused["data"]["flags"] & 64  # only to the person
    assert await world_.runtime.watches.store.all(str(guild.id)) == []


async def test_watch_add_period_option_is_capped_for_discord(env):  # noqa: F811
    _, _, adapter_, _ = env
    add = adapter_.tree.get_command("watch").get_command("add")
    [period] = [p for p in add.to_dict(adapter_.tree)["options"] if p["name"] == "period"]
    assert 20 <= period.get("max_length", 6000) <= 100  # "every 3 days", not 6,000 characters


async def test_expand_of_a_long_unknown_id_answers_once_only_to_the_person(
    world,  # noqa: F811
    fake,  # noqa: F811
    adapter,  # noqa: F811
):
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    interaction = fake.interaction(channel, user)
    await adapter.tree.get_command("expand").callback(interaction, "s" * 5000)

    interaction.response.defer.assert_not_awaited()
    interaction.followup.send.assert_not_awaited()
    assert fake.texts(channel.id) == []  # nothing for the channel to see
    (answer,), kwargs = interaction.response.send_message.await_args
    assert kwargs == {"ephemeral": True}
    assert answer.startswith("No summary with id 'sssss") and len(answer) < 100
    assert "…" in answer and "workspace" not in answer  # Slack's word, not Discord's
