"""The memory page: what a team's memory holds, shown to each person as far as they may see it,
with forget, edit, export and import (`/memory`, served beside `/slack/events`)."""
