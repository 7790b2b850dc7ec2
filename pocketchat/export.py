"""A conversation as a Markdown document."""

from datetime import UTC, datetime

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
        sources = [s for step in message.meta.get("steps", []) if step.get("kind") == "sources" for s in step["data"]]
        if sources:
            lines += ["Sources:", ""]
            lines += [f"- [{number}] {source.get('source', '')}" for number, source in enumerate(sources, 1)]
            lines += [""]
    return "\n".join(lines).rstrip() + "\n"


def _state(document: DocumentRecord) -> str:
    if document.status == "failed":
        return f"failed: {document.error}"
    return f"{document.size:,} bytes, {document.status}"
