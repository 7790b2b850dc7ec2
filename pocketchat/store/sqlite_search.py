"""Search in the SQLite file: FTS5 over messages and titles (the tables and triggers of its schema's step
9), ranked by BM25 (titles by FTS5's; messages from their text, pocketchat/search.py)."""

import json
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.records import MessageHit
from pocketchat.search import (
    CANDIDATES,
    Candidates,
    SearchHit,
    SearchQuery,
    assemble,
    bm25_scores,
    excerpt,
    keys,
    matches,
    term_patterns,
)


def match(query: SearchQuery) -> str:
    """The query in FTS5's syntax: each word quoted (they hold letters and digits only), all of them."""
    words = [f'"{term}"' for term in query.terms]
    if query.prefix:
        words[-1] += "*"
    return " ".join(words)


def owned(owner: str, words: str) -> str:
    """`words` in the owner's messages only: the owner's word (the hex of the name) in the owner column,
    which only the owner's rows hold there, and the words in the text. Each is kept to its own column: a
    message whose text holds another user's hex must not pass for theirs."""
    return f'owner : "{owner.encode().hex()}" AND content : ({words})'


class SqliteSearch:
    """`search` and `search_messages` for SqliteStore."""

    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]  # SqliteStore's

    async def search(self, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
        """The owner's conversations that hold every word of the query, best first (see pocketchat/search.py)."""
        if not query.terms:
            return []
        return await self._read(lambda db: _search(db, owner, query, limit))

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages holding every one of `terms`, leaving out those of the turn
        `leave_out_turn` (the model's search tool)."""
        if not terms:
            return []
        query = (
            "SELECT m.conversation_id, c.title, m.role, m.content, m.created_at FROM messages_text t"
            " JOIN messages m ON m.seq = t.rowid JOIN conversations c ON c.id = m.conversation_id"
            " WHERE messages_text MATCH ? AND c.owner = ? AND m.turn_id IS NOT ? ORDER BY t.rowid DESC LIMIT ?"
        )
        args = (owned(owner, match(SearchQuery(tuple(terms)))), owner, leave_out_turn, most)
        rows = await self._read(lambda db: db.execute(query, args).fetchall())
        return [MessageHit(*row) for row in rows]


def _search(db: sqlite3.Connection, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
    words = match(query)
    # One snapshot: the candidates, their text and their conversations' titles are read as of one moment.
    db.execute("BEGIN")
    try:
        # The owner's newest matches: FTS5 intersects the words with the owner's word, and no other user's
        # row is read. Ranked below, from their text: FTS5's own BM25 would count every row of the
        # owner's word (its rarity), a read of all the owner's messages at each search.
        query_rows = "SELECT rowid FROM messages_text WHERE messages_text MATCH ? ORDER BY rowid DESC LIMIT ?"
        seqs = [seq for (seq,) in db.execute(query_rows, (owned(owner, words), CANDIDATES))]
        found = db.execute(
            "SELECT seq, id, conversation_id, role, content FROM messages"
            " WHERE seq IN (SELECT value FROM json_each(?))",
            (json.dumps(seqs),),
        ).fetchall()
        titles = db.execute(
            "SELECT c.id, -bm25(conversations_text) FROM conversations_text JOIN conversations c"
            " ON c.rowid = conversations_text.rowid WHERE conversations_text MATCH ? AND c.owner = ?"
            " ORDER BY conversations_text.rowid DESC LIMIT ?",  # FTS5's BM25: lower is better
            (words, owner, CANDIDATES),
        ).fetchall()
        ids = {row["conversation_id"] for row in found} | {conversation_id for conversation_id, _ in titles}
        named = db.execute(
            "SELECT id, title FROM conversations WHERE owner = ? AND id IN (SELECT value FROM json_each(?))",
            (owner, json.dumps(sorted(ids))),
        ).fetchall()
    finally:
        db.rollback()
    patterns = term_patterns(query)
    scores = bm25_scores([row["content"] for row in found], patterns)
    candidates = Candidates(
        [(row["seq"], row["conversation_id"], score) for row, score in zip(found, scores, strict=True)],
        dict(titles),
    )
    ranked = candidates.best(limit)
    chosen = set(keys(ranked))
    snippets = {
        row["seq"]: (row["id"], row["role"], *excerpt(row["content"], patterns))
        for row in found
        if row["seq"] in chosen
    }
    shown = {
        conversation_id: (title, matches(title or "", patterns) if conversation_id in candidates.titles else [])
        for conversation_id, title in named
    }
    return assemble(ranked, snippets, shown)
