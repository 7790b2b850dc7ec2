"""The statements of an import and a JSON export in PostgreSQL: a part of `PostgresStore`, on its write
queue and its reads."""

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

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
    marks = ", ".join(f"${number}" for number in range(1, len(columns) + 1))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


INSERT_CONVERSATION = _insert("conversations", CONVERSATION_COLUMNS)
INSERT_MESSAGE = _insert("messages", MESSAGE_COLUMNS)
INSERT_UNFINISHED = _insert("unfinished_imports", UNFINISHED_COLUMNS)
# A batch landed: when, and how many more conversations are in whole.
TOLD = "UPDATE running_imports SET told_at = $1, imported = imported + $3 WHERE id = $2"
UNDONE = "SELECT conversation_id FROM unfinished_imports WHERE import_id = $1"
UNDO = f"DELETE FROM conversations WHERE id IN ({UNDONE})"
ENDED = "DELETE FROM running_imports WHERE id = $1 RETURNING owner, total, imported, dropped"
FOUND = (
    "SELECT owner, 'importing' AS status, total, imported, dropped, NULL AS error, replica, told_at"
    " FROM running_imports WHERE id = $1 AND owner IS NOT NULL UNION ALL"
    " SELECT owner, status, total, imported, dropped, error, NULL, ended_at FROM ended_imports WHERE id = $1"
)


async def _end(db: asyncpg.Connection, import_id: str, status: str, error: str | None = None) -> bool:
    """End a running import: no longer listed, kept in `ended_imports` as it ended (done, with its count;
    failed, nothing of it kept). Whether it was running."""
    row = await db.fetchrow(ENDED, import_id)
    if row is not None and row["owner"] is not None:  # (an import from before owners were kept is not)
        imported = row["imported"] if status == "done" else 0
        ended = (import_id, row["owner"], status, row["total"], imported, row["dropped"], error, time.time())
        await db.execute("INSERT INTO ended_imports VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", *ended)
    return row is not None


class PostgresTransfer:
    """Conversations written whole for an import, deleted again if it fails, and read whole for an export."""

    # PostgresStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]

    def claim_import(self, import_id: str, owner: str, replica: str) -> asyncio.Future[bool]:
        """List an import of the owner's as running, on that replica, unless one of theirs is (then
        False): until it ends, what it writes is listed too. Imports that ended over KEEP_SECONDS ago
        are forgotten."""
        claim = (
            "INSERT INTO running_imports (id, replica, told_at, owner) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (owner) DO NOTHING"
        )

        async def work(db: asyncpg.Connection) -> bool:
            await db.execute("DELETE FROM ended_imports WHERE ended_at < $1", time.time() - KEEP_SECONDS)
            return await db.execute(claim, import_id, replica, time.time(), owner) == "INSERT 0 1"

        return self._write(work, None, retry=False)

    def import_read(self, import_id: str, total: int, dropped: dict[str, int]) -> asyncio.Future[None]:
        """The claimed import's file was read: how many conversations it holds, what was left out."""
        query = "UPDATE running_imports SET total = $2, dropped = $3, told_at = $4 WHERE id = $1"

        async def work(db: asyncpg.Connection) -> None:
            if await db.execute(query, import_id, total, json.dumps(dropped), time.time()) == "UPDATE 0":
                raise ImportStopped(import_id)

        return self._write(work, None, retry=False)

    def release_import(self, import_id: str) -> asyncio.Future[None]:
        """The claimed import never began (its file could not be read): the owner may import again.
        Written again until the database takes it."""
        return self._write(lambda db: db.execute("DELETE FROM running_imports WHERE id = $1", import_id), None)

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
            if await db.execute(TOLD, time.time(), import_id, 0 if partial else len(trees)) == "UPDATE 0":
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
            if await db.execute(TOLD, time.time(), import_id, 1 if last else 0) == "UPDATE 0":
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
            if not await _end(db, import_id, "done"):
                raise ImportStopped(import_id)
            await db.execute("DELETE FROM unfinished_imports WHERE import_id = $1", import_id)

        return self._write(work, None, retry=False)

    def undo_import(self, import_id: str, error: str) -> asyncio.Future[list[str]]:
        """Delete the conversations the unfinished import wrote, and it, kept as failed with `error` (written
        again until the database takes it); a batch of it still queued writes nothing. The ids of the
        conversations deleted."""

        async def work(db: asyncpg.Connection) -> list[str]:
            # Its row first: a batch in flight on another replica holds it, and lands before this goes on.
            await _end(db, import_id, "failed", error)
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

    async def find_import(self, import_id: str) -> StoredImport | None:
        """The import by that id as the database has it, running or ended."""
        row = await self._read(lambda db: db.fetchrow(FOUND, import_id))
        return None if row is None else StoredImport.from_row(import_id, row)

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
