"""Search in PostgreSQL: tsvector columns with GIN indexes over messages and titles (the trigger and
columns of its schema's steps 8, 12 and 13), ranked by ts_rank; snippets by ts_headline over the part of
a message the index holds."""

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from pocketchat.records import MessageHit
from pocketchat.search import (
    CANDIDATES,
    MARK_END,
    MARK_START,
    SEARCHABLE_CHARACTERS,
    SNIPPET_TOKENS,
    Candidates,
    Ranges,
    SearchHit,
    SearchQuery,
    assemble,
    clip,
    highlighted,
    keys,
)
from pocketchat.store.transfer import PARTIAL

HEADLINE = f"StartSel={MARK_START}, StopSel={MARK_END}, MaxWords={SNIPPET_TOKENS}, MinWords={SNIPPET_TOKENS // 2}"
TITLE_HEADLINE = f"StartSel={MARK_START}, StopSel={MARK_END}, HighlightAll=true"


def tsquery(query: SearchQuery) -> str:
    """The query in to_tsquery's syntax: each word quoted (they hold letters and digits only), all of them.
    Words the 'english' configuration drops (its stop words) drop out; `numnode` tells a query left empty."""
    words = [f"'{term}'" for term in query.terms]
    if query.prefix:
        words[-1] += ":*"
    return " & ".join(words)


def as_read(text: str) -> str:
    """The text as the index reads it: '<' a space (PostgreSQL's parser skips what looks like a tag)."""
    return text.replace("<", " ")


def shown(marked: str | None, source: str | None) -> tuple[str, Ranges]:
    """A headline of `as_read(source)` as plain text and highlights, its text taken back from the source
    itself (the same length: only '<' differs), so that a snippet shows what was written; `clip`ped, as
    a headline holds whole words, and a word may be thousands of characters."""
    text, ranges = highlighted(marked, source)
    if source is not None and text:
        source = source.replace(MARK_START, "").replace(MARK_END, "")  # as `highlighted` left the text
        at = as_read(source).find(text)
        text = source[at : at + len(text)] if at >= 0 else text
    return clip(text, 0, len(text), ranges)


def owner_lexeme(owner: str) -> str:
    """The owner's lexeme in every message's tsvector (the trigger's), as a tsquery."""
    return f"'~{hashlib.sha256(owner.encode()).hexdigest()}'"


class PostgresSearch:
    """`search` for PostgresStore."""

    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]  # PostgresStore's

    async def search(self, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
        """The owner's conversations that hold every word of the query, best first (see pocketchat/search.py)."""
        if not query.terms:
            return []

        async def work(db: asyncpg.Connection) -> list[SearchHit]:
            async with db.transaction(isolation="repeatable_read", readonly=True):
                return await _search(db, owner, tsquery(query), limit)

        return await self._read(work)

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages holding every one of `terms`, leaving out those of the turn
        `leave_out_turn` (the model's search tool)."""
        if not terms:
            return []
        query = (  # the part of each message the index holds, where its words are (the tool's excerpt)
            "SELECT m.conversation_id, c.title, m.role, left(m.content, $5), m.created_at"
            " FROM messages m JOIN conversations c ON c.id = m.conversation_id, to_tsquery('english', $1) q"
            " WHERE numnode(q) > 0 AND m.words @@ (q && $2::tsquery) AND m.turn_id IS DISTINCT FROM $3"
            f" AND m.conversation_id NOT IN {PARTIAL} ORDER BY m.seq DESC LIMIT $4"
        )
        args = (tsquery(SearchQuery(tuple(terms))), owner_lexeme(owner), leave_out_turn, most, SEARCHABLE_CHARACTERS)
        rows = await self._read(lambda db: db.fetch(query, *args))
        return [MessageHit(*row) for row in rows]


async def _search(db: asyncpg.Connection, owner: str, words: str, limit: int) -> list[SearchHit]:
    candidates = Candidates()
    # The owner's lexeme narrows the match inside the GIN index: another user's messages are never read.
    # The newest CANDIDATES of the matches are ranked, and only they: ranked in the same select as the
    # LIMIT, every match would be (each one's tsvector read whole, for a common word tens of thousands).
    found = await db.fetch(
        "WITH newest AS (SELECT m.seq, m.conversation_id, m.words FROM messages m, to_tsquery('english', $1) q"
        " WHERE numnode(q) > 0 AND m.words @@ (q && $2::tsquery) ORDER BY m.seq DESC LIMIT $3)"
        " SELECT seq, conversation_id, ts_rank(words, to_tsquery('english', $1)) FROM newest",
        words,
        owner_lexeme(owner),
        CANDIDATES,
    )
    candidates.messages = [(seq, conversation_id, score) for seq, conversation_id, score in found]
    titles = await db.fetch(
        "SELECT c.id, ts_rank(c.title_words, q) FROM conversations c, to_tsquery('english', $1) q"
        " WHERE numnode(q) > 0 AND c.owner = $2 AND c.title_words @@ q ORDER BY c.updated_at DESC LIMIT $3",
        words,
        owner,
        CANDIDATES,
    )
    candidates.titles = {conversation_id: score for conversation_id, score in titles}
    ranked = candidates.best(limit)
    # Headlines of the part of each message the index holds (where its words are): ts_headline's time
    # grows with the text it reads (about 25 ms for 65,536 characters; 7 MB took seconds).
    rows = await db.fetch(
        "SELECT m.seq, m.id, m.role, ts_headline('english', translate(m.text, '<', ' '), q, $3), m.text"
        " FROM (SELECT seq, id, role, left(content, $4) AS text FROM messages WHERE seq = ANY($2::bigint[])) m,"
        " to_tsquery('english', $1) q",
        words,
        keys(ranked),
        HEADLINE,
        SEARCHABLE_CHARACTERS,
    )
    snippets = {seq: (message_id, role, *shown(marked, content)) for seq, message_id, role, marked, content in rows}
    rows = await db.fetch(
        "SELECT c.id, c.title, CASE WHEN c.title_words @@ q"
        " THEN ts_headline('english', translate(c.title, '<', ' '), q, $4) END"
        " FROM conversations c, to_tsquery('english', $1) q WHERE c.owner = $2 AND c.id = ANY($3::text[])"
        f" AND c.id NOT IN {PARTIAL}",
        words,
        owner,
        [conversation_id for conversation_id, _, _ in ranked],
        TITLE_HEADLINE,
    )
    titled = {
        conversation_id: (title, shown(marked, title)[1] if marked else []) for conversation_id, title, marked in rows
    }
    return assemble(ranked, snippets, titled)
