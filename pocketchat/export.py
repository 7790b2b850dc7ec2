"""A conversation as a Markdown document."""

from datetime import UTC, datetime

from pocketchat.records import ConversationRecord, Message

HEADINGS = {"user": "You", "assistant": "Assistant"}


def conversation_markdown(record: ConversationRecord, history: list[Message]) -> str:
    created = datetime.fromtimestamp(record.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {record.title or 'Untitled conversation'}", "", f"*{created} · model {record.model or 'default'}*", ""]
    if record.system_prompt:
        lines += ["> System prompt: " + record.system_prompt.replace("\n", "\n> "), ""]
    for message in history:
        note = "" if message.status == "complete" else f" *({message.status})*"
        lines += [f"## {HEADINGS[message.role]}{note}", "", message.content, ""]
        if message.error:
            lines += [f"> Error: {message.error}", ""]
    return "\n".join(lines).rstrip() + "\n"
