"""Search in the SQLite file: FTS5 over messages and titles (the tables and triggers of its schema's steps
9, 12, 14 and 15), ranked by BM25 (titles by FTS5's; messages from the start of their text, and their
snippets from the part the index holds: pocketchat/search.py)."""

import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.records import MessageHit
from pocketchat.search import (
    CANDIDATES,
    RANKED_CHARACTERS,
    SEARCHABLE_CHARACTERS,
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
from pocketchat.store.transfer import PARTIAL

TOKENIZER = "porter unicode61 remove_diacritics 2"  # the message index's (the schema's step 12)
# Letters to Python (a later Unicode) that FTS5's tokenizer (Unicode 6.1's categories) takes for separators:
# a query word holding one is several words to the index, and several in one quoted string would be a
# phrase, which the message index (detail=column, without positions) refuses.
SEPARATORS = re.compile("[\u19b0-\u19c0\u19c8\u19c9\u1cf2\u1cf3]+")


def match(query: SearchQuery) -> str:
    """The query in FTS5's syntax: each word quoted (they hold letters and digits only), all of them;
    empty if no word holds anything the index keeps."""
    words = [f'"{part}"' for term in query.terms for part in SEPARATORS.split(term) if part]
    if query.prefix and words:
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
        if not match(query):
            return []
        return await self._read(lambda db: _search(db, owner, query, limit))

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages holding every one of `terms`, leaving out those of the turn
        `leave_out_turn` (the model's search tool)."""
        query = SearchQuery(tuple(terms))
        if not match(query):
            return []

        def work(db: sqlite3.Connection) -> list[MessageHit]:
            db.execute("BEGIN")  # the index and the messages waiting to go in it, as of one moment
            try:
                seqs = _newest(db, owner, query, most, leave_out_turn)
                rows = db.execute(
                    "SELECT m.seq, m.conversation_id, c.title, m.role, m.created_at"
                    " FROM messages m JOIN conversations c ON c.id = m.conversation_id"
                    " WHERE m.seq IN (SELECT value FROM json_each(?))"
                    f" AND m.conversation_id NOT IN {PARTIAL} ORDER BY m.seq DESC",
                    (json.dumps(seqs),),
                ).fetchall()
                # The part of each message the index holds, where its words are (the tool's excerpt).
                texts = starts(db, [row["seq"] for row in rows], SEARCHABLE_CHARACTERS)
            finally:
                db.rollback()
            return [MessageHit(c, title, role, texts[seq], created) for seq, c, title, role, created in rows]

        return await self._read(work)


def starts(db: sqlite3.Connection, seqs: list[int], characters: int) -> dict[int, str]:
    """The first `characters` of each message's text, by its seq, in that order. Read as a blob (SQLite's
    incremental I/O), the bytes needed and no more (UTF-8: at most 4 a character): a SELECT of the text,
    substr() or not, loads all of it first, 2 ms for a 7 MB message, at each search that finds it."""
    texts = {}
    for seq in seqs:
        with db.blobopen("messages", "content", seq, readonly=True) as blob:
            texts[seq] = blob.read(4 * characters).decode("utf-8", "ignore")[:characters]
    return texts


def _newest(db: sqlite3.Connection, owner: str, query: SearchQuery, most: int, leave_out_turn: str | None) -> list[int]:
    """The keys (seq) of the owner's newest `most` messages holding the query's words, but those of the
    turn `leave_out_turn`: found in the index, and among the messages waiting to go in it together
    (those after the index's mark, fewer than 64, and those listed in `messages_unindexed`: see the
    schema's steps 12 and 14).

    In the index, FTS5 intersects the words with the owner's word: no other user's row is read. The
    waiting messages are matched by an FTS5 table of this connection's own, made for this search with the
    index's tokenizer, so that the same words match them as will once they are in the index."""
    words = match(query)
    if leave_out_turn is None:  # the index alone (FTS5 reads its matches newest first, `most` of them)
        indexed = db.execute(
            "SELECT rowid FROM messages_text WHERE messages_text MATCH ? ORDER BY rowid DESC LIMIT ?",
            (owned(owner, words), most),
        )
    else:  # and each match's row, for its turn
        indexed = db.execute(
            "SELECT t.rowid FROM messages_text t JOIN messages m ON m.seq = t.rowid"
            " WHERE messages_text MATCH ? AND m.turn_id IS NOT ? ORDER BY t.rowid DESC LIMIT ?",
            (owned(owner, words), leave_out_turn, most),
        )
    seqs = [seq for (seq,) in indexed]
    # CROSS JOIN: the few waiting messages first (the planner, knowing no sizes, would start from the
    # owner's conversations and read all their messages). Their status, after the text in a row, costs
    # SQLite a walk along a long text's pages (a few milliseconds for 7 MB), for as long as it waits.
    waiting = db.execute(
        "SELECT m.seq FROM ("
        "  SELECT seq FROM messages WHERE seq > (SELECT seq FROM messages_index_mark) AND status != 'streaming'"
        "  UNION ALL SELECT seq FROM messages_unindexed"
        ") u CROSS JOIN messages m ON m.seq = u.seq CROSS JOIN conversations c ON c.id = m.conversation_id"
        " WHERE c.owner = ? AND (? IS NULL OR m.turn_id IS NOT ?)",
        (owner, leave_out_turn, leave_out_turn),
    ).fetchall()
    if waiting:
        db.execute(f"CREATE VIRTUAL TABLE temp.waiting USING fts5(content, tokenize='{TOKENIZER}', detail=column)")
        texts = starts(db, [seq for (seq,) in waiting], SEARCHABLE_CHARACTERS)  # as the index will hold them
        db.executemany("INSERT INTO temp.waiting(rowid, content) VALUES (?, ?)", texts.items())
        seqs += [seq for (seq,) in db.execute("SELECT rowid FROM temp.waiting WHERE waiting MATCH ?", (words,))]
    return sorted(seqs, reverse=True)[:most]


def _search(db: sqlite3.Connection, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
    words = match(query)
    patterns = term_patterns(query)
    # One snapshot: the candidates, their text and their conversations' titles are read as of one moment.
    db.execute("BEGIN")
    try:
        # The owner's newest matches, ranked below from the start of their text: FTS5's own BM25 would
        # count every row of the owner's word (its rarity), a read of all the owner's messages at each search.
        seqs = _newest(db, owner, query, CANDIDATES, None)
        found = db.execute(
            "SELECT seq, conversation_id FROM messages WHERE seq IN (SELECT value FROM json_each(?))",
            (json.dumps(seqs),),
        ).fetchall()
        ranked_texts = starts(db, [seq for seq, _ in found], RANKED_CHARACTERS)
        titles = db.execute(
            "SELECT c.id, -bm25(conversations_text) FROM conversations_text JOIN conversations c"
            " ON c.rowid = conversations_text.rowid WHERE conversations_text MATCH ? AND c.owner = ?"
            " ORDER BY conversations_text.rowid DESC LIMIT ?",  # FTS5's BM25: lower is better
            (words, owner, CANDIDATES),
        ).fetchall()
        scores = bm25_scores(list(ranked_texts.values()), patterns)
        candidates = Candidates(
            [(seq, conversation_id, score) for (seq, conversation_id), score in zip(found, scores, strict=True)],
            dict(titles),
        )
        ranked = candidates.best(limit)
        # The hits' text, as much of it as the index holds (where their words are), for their snippets.
        shown = db.execute(
            "SELECT seq, id, role FROM messages WHERE seq IN (SELECT value FROM json_each(?))",
            (json.dumps(keys(ranked)),),
        ).fetchall()
        texts = starts(db, [seq for seq, _, _ in shown], SEARCHABLE_CHARACTERS)
        named = db.execute(
            f"SELECT id, title FROM conversations WHERE owner = ? AND id IN (SELECT value FROM json_each(?))"
            f" AND id NOT IN {PARTIAL}",
            (owner, json.dumps(sorted({conversation_id for conversation_id, _, _ in ranked}))),
        ).fetchall()
    finally:
        db.rollback()
    snippets = {seq: (message_id, role, *excerpt(texts[seq], patterns)) for seq, message_id, role in shown}
    titled = {
        conversation_id: (title, matches(title or "", patterns) if conversation_id in candidates.titles else [])
        for conversation_id, title in named
    }
    return assemble(ranked, snippets, titled)
