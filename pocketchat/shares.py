"""Read-only links to a conversation: each shows a snapshot of it, taken when the link was made, to
anyone who has the link, and nothing else of the app. A link's token is 256 random bits; the database
keeps only its hash (as it does for sessions), so a copy of the database opens no link, and a link is
found by its hash alone: what a lookup's timing could tell is about a hash, never about a token."""

import re
import secrets
from typing import Any

from pocketchat.hashes import token_hash
from pocketchat.records import ConversationRecord, Message
from utils.clean import stored_json

MAX_SHARES_PER_CONVERSATION = 20  # live links of one conversation; revoking one makes room
TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # what secrets.token_urlsafe(32) makes


def new_token() -> str:
    return secrets.token_urlsafe(32)


def share_hash(token: str) -> str | None:
    """What the database keeps of a link's token, and finds the link by; None for text that cannot be a
    token (answered as a wrong one, without asking the database)."""
    return token_hash(token) if TOKEN.fullmatch(token) else None


def snapshot(record: ConversationRecord, history: list[Message], running_turn: str | None) -> dict[str, Any]:
    """What a link shows: the title and the messages (their role, text and status), as the conversation's
    history holds them now, less the turn still running (its reply is not written yet)."""
    messages = [
        {"role": message.role, "content": message.content, "status": message.status}
        for message in history
        if running_turn is None or message.turn_id != running_turn
    ]
    return {"title": record.title, "messages": messages}


def read_snapshot(text: str) -> dict[str, Any]:
    """A link's snapshot as stored (JSON text), read back safe whatever wrote it (utils/clean.py); a
    snapshot that cannot be read at all shows as an empty conversation rather than failing the link."""
    return stored_json(text, {"title": None, "messages": []})
