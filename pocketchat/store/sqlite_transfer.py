"""The statements of an import and a JSON export in SQLite: a part of `SqliteStore`, on its write queue
and its reads."""

import asyncio
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.store.transfer import (
    CONVERSATION_COLUMNS,
    KEEP_SECONDS,
    MESSAGE_COLUMNS,
    UNFINISHED_COLUMNS,
    ImportState,
    ImportStopped,
    StoredImport,
    conversation_rows,
    import_state,
    message_rows,
    rows_of,
    tree_from_rows,
)
from pocketchat.transfer.tree import ConversationTree, TreeMessage


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


INSERT_CONVERSATION = _insert("conversations", CONVERSATION_COLUMNS)
INSERT_MESSAGE = _insert("messages", MESSAGE_COLUMNS)
INSERT_UNFINISHED = _insert("unfinished_imports", UNFINISHED_COLUMNS)
# A batch landed: when, and how many more conversations are in whole.
TOLD = "UPDATE running_imports SET told_at = ?, imported = imported + ? WHERE id = ?"
UNDONE = "SELECT conversation_id FROM unfinished_imports WHERE import_id = ?"
UNDO = f"DELETE FROM conversations WHERE id IN ({UNDONE})"
FOUND = (
    "SELECT owner, 'importing' AS status, total, imported, dropped, NULL AS error, replica, told_at"
    " FROM running_imports WHERE id = ?1 AND owner IS NOT NULL UNION ALL"
    " SELECT owner, status, total, imported, dropped, error, NULL, ended_at FROM ended_imports WHERE id = ?1"
)


def _end(db: sqlite3.Connection, import_id: str, status: str, error: str | None = None) -> bool:
    """End a running import: no longer listed, kept in `ended_imports` as it ended (done, with its count;
    failed, nothing of it kept). Whether it was running."""
    query = "DELETE FROM running_imports WHERE id = ? RETURNING owner, total, imported, dropped"
    row = db.execute(query, (import_id,)).fetchone()
    if row is not None and row["owner"] is not None:  # (an import from before owners were kept is not)
        imported = row["imported"] if status == "done" else 0
        ended = (import_id, row["owner"], status, row["total"], imported, row["dropped"], error, time.time())
        db.execute("INSERT INTO ended_imports VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ended)
    return row is not None


class SqliteTransfer:
    """Conversations written whole for an import, deleted again if it fails, and read whole for an export."""

    # SqliteStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    def claim_import(self, import_id: str, owner: str, replica: str) -> asyncio.Future[bool]:
        """List an import of the owner's as running, on that replica, unless one of theirs is (then
        False): until it ends, what it writes is listed too. Imports that ended over KEEP_SECONDS ago
        are forgotten."""
        claim = "INSERT INTO running_imports (id, replica, told_at, owner) VALUES (?, ?, ?, ?)"
        claim += " ON CONFLICT (owner) DO NOTHING"

        def work(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM ended_imports WHERE ended_at < ?", (time.time() - KEEP_SECONDS,))
            return db.execute(claim, (import_id, replica, time.time(), owner)).rowcount > 0

        return self._write(work, None, retry=False)

    def import_read(self, import_id: str, total: int, dropped: dict[str, int]) -> asyncio.Future[None]:
        """The claimed import's file was read: how many conversations it holds, what was left out."""
        query = "UPDATE running_imports SET total = ?, dropped = ?, told_at = ? WHERE id = ?"

        def work(db: sqlite3.Connection) -> None:
            if db.execute(query, (total, json.dumps(dropped), time.time(), import_id)).rowcount == 0:
                raise ImportStopped(import_id)

        return self._write(work, None, retry=False)

    def release_import(self, import_id: str) -> asyncio.Future[None]:
        """The claimed import never began (its file could not be read): the owner may import again.
        Written again until the database takes it."""
        return self._write(lambda db: db.execute("DELETE FROM running_imports WHERE id = ?", (import_id,)), None)

    def import_conversations(
        self, owner: str, trees: list[ConversationTree], import_id: str, partial: bool = False
    ) -> asyncio.Future[None]:
        """Write these conversations (new ids: never over a stored one) as the owner's, in one transaction,
        listed as the import's (`partial`: hidden, more of it to come); ImportStopped if it is not running
        any more."""
        unfinished = [(tree.id, import_id, partial) for tree in trees]

        def work(db: sqlite3.Connection) -> None:
            if db.execute(TOLD, (time.time(), 0 if partial else len(trees), import_id)).rowcount == 0:
                raise ImportStopped(import_id)
            # The rows are made here, on the writer's thread: for a conversation of many messages, on the
            # event loop they would hold every chat up.
            db.executemany(INSERT_CONVERSATION, conversation_rows(owner, trees))
            db.executemany(INSERT_MESSAGE, message_rows(trees))
            db.executemany(INSERT_UNFINISHED, unfinished)

        # Not kept to write again: the import is told it failed, and deletes what it wrote.
        return self._write(work, None, retry=False)

    def import_messages(
        self, conversation_id: str, messages: list[TreeMessage], import_id: str, last: bool, leaf_id: str | None
    ) -> asyncio.Future[None]:
        """More messages of a partial conversation the import writes; with the `last`, the path it shows
        (`leaf_id`), and it is shown; ImportStopped if the import is not running any more."""

        def work(db: sqlite3.Connection) -> None:
            if db.execute(TOLD, (time.time(), 1 if last else 0, import_id)).rowcount == 0:
                raise ImportStopped(import_id)
            db.executemany(INSERT_MESSAGE, rows_of(conversation_id, messages))
            if last:
                db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf_id, conversation_id))
                db.execute("UPDATE unfinished_imports SET partial = 0 WHERE conversation_id = ?", (conversation_id,))

        return self._write(work, None, retry=False)

    def finish_import(self, import_id: str) -> asyncio.Future[None]:
        """The import ended whole: its conversations are no longer its to delete (ImportStopped if it was
        found stopped meanwhile, and undone)."""

        def work(db: sqlite3.Connection) -> None:
            if not _end(db, import_id, "done"):
                raise ImportStopped(import_id)
            db.execute("DELETE FROM unfinished_imports WHERE import_id = ?", (import_id,))

        return self._write(work, None, retry=False)

    def undo_import(self, import_id: str, error: str) -> asyncio.Future[list[str]]:
        """Delete the conversations the unfinished import wrote, and it, kept as failed with `error` (written
        again until the database takes it); a batch of it still queued writes nothing. The ids of the
        conversations deleted."""

        def work(db: sqlite3.Connection) -> list[str]:
            _end(db, import_id, "failed", error)
            undone = [row[0] for row in db.execute(UNDONE, (import_id,))]
            db.execute(UNDO, (import_id,))
            return undone

        return self._write(work, None)

    async def import_state(self, conversation_id: str) -> ImportState:
        query = (
            "SELECT EXISTS (SELECT 1 FROM unfinished_imports WHERE conversation_id = ?1),"
            " EXISTS (SELECT 1 FROM conversations WHERE id = ?1)"
        )
        importing, there = await self._read(lambda db: db.execute(query, (conversation_id,)).fetchone())
        return import_state(bool(importing), bool(there))

    async def running_imports(self) -> list[tuple[str, str, float]]:
        """The imports not ended: each with the replica writing it and when its last batch landed."""
        query = "SELECT id, replica, told_at FROM running_imports"
        return [tuple(row) for row in await self._read(lambda db: db.execute(query).fetchall())]

    async def find_import(self, import_id: str) -> StoredImport | None:
        """The import by that id as the database has it, running or ended."""
        row = await self._read(lambda db: db.execute(FOUND, (import_id,)).fetchone())
        return None if row is None else StoredImport.from_row(import_id, row)

    async def conversation_tree(self, conversation_id: str, owner: str) -> ConversationTree | None:
        """The owner's conversation with every message of every branch, in the order they were written."""

        def work(db: sqlite3.Connection) -> ConversationTree | None:
            query = "SELECT * FROM conversations WHERE id = ? AND owner = ?"
            if (row := db.execute(query, (conversation_id, owner)).fetchone()) is None:
                return None
            messages = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
            return tree_from_rows(row, messages.fetchall())

        return await self._read(work)
