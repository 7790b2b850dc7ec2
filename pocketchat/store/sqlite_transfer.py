"""The statements of an import and a JSON export in SQLite: a part of `SqliteStore`, on its write queue
and its reads."""

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.store.transfer import (
    CONVERSATION_COLUMNS,
    MESSAGE_COLUMNS,
    UNFINISHED_COLUMNS,
    ImportState,
    ImportStopped,
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
BEGIN = "INSERT INTO running_imports (id, replica, told_at) VALUES (?, ?, ?)"
TOLD = "UPDATE running_imports SET told_at = ? WHERE id = ?"
UNDONE = "SELECT conversation_id FROM unfinished_imports WHERE import_id = ?"
UNDO = f"DELETE FROM conversations WHERE id IN ({UNDONE})"


class SqliteTransfer:
    """Conversations written whole for an import, deleted again if it fails, and read whole for an export."""

    # SqliteStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    def begin_import(self, import_id: str, replica: str) -> asyncio.Future[None]:
        """List an import as running, on that replica: until it ends, what it writes is listed too."""
        row = (import_id, replica, time.time())
        return self._write(
            lambda db: db.execute("INSERT INTO running_imports VALUES (?, ?, ?)", row), None, retry=False
        )

    def import_conversations(
        self, owner: str, trees: list[ConversationTree], import_id: str, partial: bool = False
    ) -> asyncio.Future[None]:
        """Write these conversations (new ids: never over a stored one) as the owner's, in one transaction,
        listed as the import's (`partial`: hidden, more of it to come); ImportStopped if it is not running
        any more."""
        unfinished = [(tree.id, import_id, partial) for tree in trees]

        def work(db: sqlite3.Connection) -> None:
            if db.execute(TOLD, (time.time(), import_id)).rowcount == 0:
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
            if db.execute(TOLD, (time.time(), import_id)).rowcount == 0:
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
            if db.execute("DELETE FROM running_imports WHERE id = ?", (import_id,)).rowcount == 0:
                raise ImportStopped(import_id)
            db.execute("DELETE FROM unfinished_imports WHERE import_id = ?", (import_id,))

        return self._write(work, None, retry=False)

    def undo_import(self, import_id: str) -> asyncio.Future[list[str]]:
        """Delete the conversations the unfinished import wrote, and it (written again until the database
        takes it); a batch of it still queued writes nothing. The ids of the conversations deleted."""

        def work(db: sqlite3.Connection) -> list[str]:
            db.execute("DELETE FROM running_imports WHERE id = ?", (import_id,))
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

    async def conversation_tree(self, conversation_id: str, owner: str) -> ConversationTree | None:
        """The owner's conversation with every message of every branch, in the order they were written."""

        def work(db: sqlite3.Connection) -> ConversationTree | None:
            query = "SELECT * FROM conversations WHERE id = ? AND owner = ?"
            if (row := db.execute(query, (conversation_id, owner)).fetchone()) is None:
                return None
            messages = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
            return tree_from_rows(row, messages.fetchall())

        return await self._read(work)
