"""The statements of an import and a JSON export in PostgreSQL: a part of `PostgresStore`, on its write
queue and its reads."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

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
    marks = ", ".join(f"${number}" for number in range(1, len(columns) + 1))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


INSERT_CONVERSATION = _insert("conversations", CONVERSATION_COLUMNS)
INSERT_MESSAGE = _insert("messages", MESSAGE_COLUMNS)
INSERT_UNFINISHED = _insert("unfinished_imports", UNFINISHED_COLUMNS)
TOLD = "UPDATE running_imports SET told_at = $1 WHERE id = $2"
UNDONE = "SELECT conversation_id FROM unfinished_imports WHERE import_id = $1"
UNDO = f"DELETE FROM conversations WHERE id IN ({UNDONE})"


class PostgresTransfer:
    """Conversations written whole for an import, deleted again if it fails, and read whole for an export."""

    # PostgresStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]

    def begin_import(self, import_id: str, replica: str) -> asyncio.Future[None]:
        """List an import as running, on that replica: until it ends, what it writes is listed too."""
        begin = "INSERT INTO running_imports VALUES ($1, $2, $3)"
        return self._write(lambda db: db.execute(begin, import_id, replica, time.time()), None, retry=False)

    def import_conversations(
        self, owner: str, trees: list[ConversationTree], import_id: str, partial: bool = False
    ) -> asyncio.Future[None]:
        """Write these conversations (new ids: never over a stored one) as the owner's, in one transaction,
        listed as the import's (`partial`: hidden, more of it to come); ImportStopped if it is not running
        any more."""
        conversations, messages = conversation_rows(owner, trees), message_rows(trees)
        unfinished = [(tree.id, import_id, partial) for tree in trees]

        async def work(db: asyncpg.Connection) -> None:
            # The import's row stays locked until this commits: an undo meanwhile waits, then deletes this too.
            if await db.execute(TOLD, time.time(), import_id) == "UPDATE 0":
                raise ImportStopped(import_id)
            await db.executemany(INSERT_CONVERSATION, conversations)
            await db.executemany(INSERT_MESSAGE, messages)
            await db.executemany(INSERT_UNFINISHED, unfinished)

        # Not kept to write again: the import is told it failed, and deletes what it wrote.
        return self._write(work, None, retry=False)

    def import_messages(
        self, conversation_id: str, messages: list[TreeMessage], import_id: str, last: bool, leaf_id: str | None
    ) -> asyncio.Future[None]:
        """More messages of a partial conversation the import writes; with the `last`, the path it shows
        (`leaf_id`), and it is shown; ImportStopped if the import is not running any more."""
        rows = rows_of(conversation_id, messages)

        async def work(db: asyncpg.Connection) -> None:
            if await db.execute(TOLD, time.time(), import_id) == "UPDATE 0":
                raise ImportStopped(import_id)
            await db.executemany(INSERT_MESSAGE, rows)
            if last:
                await db.execute("UPDATE conversations SET leaf_id = $1 WHERE id = $2", leaf_id, conversation_id)
                await db.execute(
                    "UPDATE unfinished_imports SET partial = false WHERE conversation_id = $1", conversation_id
                )

        return self._write(work, None, retry=False)

    def finish_import(self, import_id: str) -> asyncio.Future[None]:
        """The import ended whole: its conversations are no longer its to delete (ImportStopped if it was
        found stopped meanwhile, and undone)."""

        async def work(db: asyncpg.Connection) -> None:
            if await db.execute("DELETE FROM running_imports WHERE id = $1", import_id) == "DELETE 0":
                raise ImportStopped(import_id)
            await db.execute("DELETE FROM unfinished_imports WHERE import_id = $1", import_id)

        return self._write(work, None, retry=False)

    def undo_import(self, import_id: str) -> asyncio.Future[list[str]]:
        """Delete the conversations the unfinished import wrote, and it (written again until the database
        takes it); a batch of it still queued writes nothing. The ids of the conversations deleted."""

        async def work(db: asyncpg.Connection) -> list[str]:
            # Its row first: a batch in flight on another replica holds it, and lands before this goes on.
            await db.execute("DELETE FROM running_imports WHERE id = $1", import_id)
            undone = [row[0] for row in await db.fetch(UNDONE, import_id)]
            await db.execute(UNDO, import_id)
            return undone

        return self._write(work, None)

    async def import_state(self, conversation_id: str) -> ImportState:
        query = (
            "SELECT EXISTS (SELECT 1 FROM unfinished_imports WHERE conversation_id = $1),"
            " EXISTS (SELECT 1 FROM conversations WHERE id = $1)"
        )
        row = await self._read(lambda db: db.fetchrow(query, conversation_id))
        return import_state(row[0], row[1])

    async def running_imports(self) -> list[tuple[str, str, float]]:
        """The imports not ended: each with the replica writing it and when its last batch landed."""

        async def work(db: asyncpg.Connection) -> list[tuple[str, str, float]]:
            rows = await db.fetch("SELECT id, replica, told_at FROM running_imports")
            return [(row["id"], row["replica"], row["told_at"]) for row in rows]

        return await self._read(work)

    async def conversation_tree(self, conversation_id: str, owner: str) -> ConversationTree | None:
        """The owner's conversation with every message of every branch, in the order they were written."""

        async def work(db: asyncpg.Connection) -> ConversationTree | None:
            async with db.transaction(isolation="repeatable_read", readonly=True):
                query = f"SELECT {', '.join(CONVERSATION_COLUMNS)} FROM conversations WHERE id = $1 AND owner = $2"
                if (row := await db.fetchrow(query, conversation_id, owner)) is None:
                    return None
                query = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages WHERE conversation_id = $1 ORDER BY seq"
                return tree_from_rows(row, await db.fetch(query, conversation_id))

        return await self._read(work)
