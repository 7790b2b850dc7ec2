"""Search a user's own conversations, for the model's search tool: the newest messages holding every
word of the query (by its stem), found through the database's search index (pocketchat/search.py)."""

import datetime
from typing import Any, Protocol

from pocketchat.records import MessageHit
from utils.retrieval import search_terms

EXCERPT_CHARACTERS = 300
MOST = 8


class MessageSearch(Protocol):
    async def search_messages(
        self, owner: str, terms: list[str], most: int, leave_out_turn: str
    ) -> list[MessageHit]: ...


async def search_conversations(
    store: MessageSearch, owner: str, query: str, leave_out_turn: str, most: int = MOST
) -> list[dict[str, Any]]:
    """The `most` newest messages of `owner`'s conversations that hold every word of `query` (but the
    running turn's, which hold the question itself): each one's conversation title, role, date and an
    excerpt around the first word found."""
    terms = search_terms(query, most=8)
    if not terms:
        return []
    hits = await store.search_messages(owner, terms, most, leave_out_turn)
    return [
        {
            "conversation": hit.title or "Untitled",
            "role": hit.role,
            "date": datetime.datetime.fromtimestamp(hit.created_at, datetime.UTC).strftime("%Y-%m-%d"),
            "excerpt": excerpt(hit.content, terms),
        }
        for hit in hits
    ]


def excerpt(text: str, terms: list[str], size: int = EXCERPT_CHARACTERS) -> str:
    """About `size` characters of `text` around the first of `terms` in it, with … where it was cut."""
    lowered = text.lower()
    found = min((at for at in (lowered.find(term) for term in terms) if at >= 0), default=0)
    start = max(0, min(found - size // 3, len(text) - size))
    cut = text[start : start + size]
    return ("…" if start > 0 else "") + cut + ("…" if start + size < len(text) else "")
