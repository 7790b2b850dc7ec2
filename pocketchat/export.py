"""A conversation as a Markdown document."""

from datetime import UTC, datetime
from typing import Any

from pocketchat.records import ConversationRecord, DocumentRecord, Message

HEADINGS = {"user": "You", "assistant": "Assistant"}


def conversation_markdown(
    record: ConversationRecord, history: list[Message], documents: list[DocumentRecord] | None = None
) -> str:
    """The conversation as Markdown: its documents, then each message, with the sources a reply cited."""
    created = datetime.fromtimestamp(record.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {record.title or 'Untitled conversation'}", "", f"*{created} · model {record.model or 'default'}*", ""]
    if record.system_prompt:
        lines += ["> System prompt: " + record.system_prompt.replace("\n", "\n> "), ""]
    if documents:
        lines += ["Documents:", ""]
        lines += [f"- {document.name} ({_state(document)})" for document in documents]
        lines += [""]
    for message in history:
        note = "" if message.status == "complete" else f" *({message.status})*"
        lines += [f"## {HEADINGS[message.role]}{note}", "", message.content, ""]
        if message.images:
            lines += ["Images:", ""]
            lines += [f"- {image.name} ({image.width}×{image.height}, {image.type})" for image in message.images]
            lines += [""]
        if message.error:
            lines += [f"> Error: {message.error}", ""]
        sources = _sources(message)
        if sources:
            lines += ["Sources:", ""]
            lines += [f"- [{number}] {source.get('source', '')}" for number, source in enumerate(sources, 1)]
            lines += [""]
    return "\n".join(lines).rstrip() + "\n"


def _sources(message: Message) -> list[dict[str, Any]]:
    """The passages a reply cited (its `sources` steps), read as any stored meta may be: of any shape."""
    steps = message.meta.get("steps")
    return [
        source
        for step in (steps if isinstance(steps, list) else [])
        if isinstance(step, dict) and step.get("kind") == "sources" and isinstance(step.get("data"), list)
        for source in step["data"]
        if isinstance(source, dict)
    ]


def _state(document: DocumentRecord) -> str:
    if document.status == "failed":
        return f"failed: {document.error}"
    return f"{document.size:,} bytes, {document.status}"
