"""Search in the SQLite file: FTS5 over messages and titles (the tables and triggers of its schema's step
8), ranked by BM25."""

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.records import MessageHit
from pocketchat.search import (
    CANDIDATES,
    MARK_END,
    MARK_START,
    SNIPPET_TOKENS,
    Candidates,
    SearchHit,
    SearchQuery,
    assemble,
    highlighted,
    keys,
)


def match(query: SearchQuery) -> str:
    """The query in FTS5's syntax: each word quoted (they hold letters and digits only), all of them."""
    words = [f'"{term}"' for term in query.terms]
    if query.prefix:
        words[-1] += "*"
    return " ".join(words)


def owned(owner: str, words: str) -> str:
    """`words` in the owner's messages only: with the owner's word, which only the owner's rows hold (the
    hex of the name, in a column of its own, as the schema's triggers write it)."""
    return f'"{owner.encode().hex()}" AND {words}'


class SqliteSearch:
    """`search` and `search_messages` for SqliteStore."""

    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]  # SqliteStore's

    async def search(self, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
        """The owner's conversations that hold every word of the query, best first (see pocketchat/search.py)."""
        if not query.terms:
            return []
        return await self._read(lambda db: _search(db, owner, match(query), limit))

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages holding every one of `terms`, leaving out those of the turn
        `leave_out_turn` (the model's search tool)."""
        if not terms:
            return []
        query = (
            "SELECT m.conversation_id, c.title, m.role, m.content, m.created_at FROM messages_text t"
            " JOIN messages m ON m.seq = t.rowid JOIN conversations c ON c.id = m.conversation_id"
            " WHERE messages_text MATCH ? AND m.turn_id IS NOT ? ORDER BY t.rowid DESC LIMIT ?"
        )
        args = (owned(owner, match(SearchQuery(tuple(terms)))), leave_out_turn, most)
        rows = await self._read(lambda db: db.execute(query, args).fetchall())
        return [MessageHit(*row) for row in rows]


def _search(db: sqlite3.Connection, owner: str, words: str, limit: int) -> list[SearchHit]:
    # One snapshot: the candidates, their scores, snippets and titles are read as of one moment.
    db.execute("BEGIN")
    try:
        candidates = Candidates()
        # The owner's newest matches: FTS5 intersects the words with the owner's word, no other user's
        # row is read. Not ranked here: BM25 of this query would count the owner's word's every row.
        query = "SELECT rowid FROM messages_text WHERE messages_text MATCH ? ORDER BY rowid DESC LIMIT ?"
        seqs = [seq for (seq,) in db.execute(query, (owned(owner, words), CANDIDATES))]
        scored = _over(db, "m.conversation_id, -bm25(messages_text, 1.0, 0.0)", words, seqs)  # FTS5's: lower is better
        candidates.messages = [(seq, conversation_id, score) for seq, conversation_id, score in scored]
        titles = db.execute(
            "SELECT c.id, -bm25(conversations_text) FROM conversations_text JOIN conversations c"
            " ON c.rowid = conversations_text.rowid WHERE conversations_text MATCH ? AND c.owner = ?"
            " ORDER BY conversations_text.rowid DESC LIMIT ?",
            (words, owner, CANDIDATES),
        )
        candidates.titles = dict(titles.fetchall())
        ranked = candidates.best(limit)
        snippet = f"snippet(messages_text, 0, '{MARK_START}', '{MARK_END}', '…', {SNIPPET_TOKENS})"
        snippet = f"m.id, m.role, {snippet}, m.content"
        snippets = {
            seq: (message_id, role, *highlighted(marked, content))
            for seq, message_id, role, marked, content in _over(db, snippet, words, keys(ranked))
        }
        ids = [conversation_id for conversation_id, _, _ in ranked]
        rows = db.execute(
            "SELECT c.id, c.title, (SELECT highlight(conversations_text, 0, ?, ?) FROM conversations_text"
            " WHERE conversations_text MATCH ? AND rowid = c.rowid) FROM conversations c"
            f" WHERE c.owner = ? AND c.id IN ({','.join('?' * len(ids))})",
            (MARK_START, MARK_END, words, owner, *ids),
        )
        shown = {
            conversation_id: (title, highlighted(marked, title)[1] if marked else [])
            for conversation_id, title, marked in rows
        }
    finally:
        db.rollback()
    return assemble(ranked, snippets, shown)


def _over(db: sqlite3.Connection, columns: str, words: str, seqs: list[int]) -> list[sqlite3.Row]:
    """(seq, *columns) of these messages, which match `words`: one pass over the matches between the
    first and the last of them (`+rowid`: not a lookup each, which would expand a prefix again for each)."""
    if not seqs:
        return []
    return db.execute(
        f"SELECT t.rowid, {columns} FROM messages_text t JOIN messages m ON m.seq = t.rowid"
        f" WHERE messages_text MATCH ? AND t.rowid BETWEEN ? AND ? AND +t.rowid IN ({','.join('?' * len(seqs))})",
        (words, min(seqs), max(seqs), *seqs),
    ).fetchall()
