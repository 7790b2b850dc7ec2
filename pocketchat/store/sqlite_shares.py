"""The statements of share links in SQLite: a part of `SqliteStore`, on its write queue and its reads."""

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.records import ShareRecord


class SqliteShares:
    """Share links: a conversation's snapshot under the hash of a link's token (deleted with it)."""

    # SqliteStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    def add_share(self, share: ShareRecord, token_hash: str, snapshot: str, most: int) -> asyncio.Future[bool]:
        """Store a link, unless its conversation has `most` already; whether it was stored."""
        query = (
            "INSERT INTO shares (id, conversation_id, owner, token_hash, snapshot, created_at)"
            " SELECT ?, ?, ?, ?, ?, ? WHERE (SELECT count(*) FROM shares WHERE conversation_id = ?) < ?"
        )
        row = (share.id, share.conversation_id, share.owner, token_hash, snapshot, share.created_at)
        args = (*row, share.conversation_id, most)
        return self._write(lambda db: db.execute(query, args).rowcount > 0, share.conversation_id, retry=False)

    def delete_share(self, conversation_id: str, share_id: str) -> asyncio.Future[bool]:
        """Revoke a link of the conversation; whether it had one by that id."""
        query = "DELETE FROM shares WHERE id = ? AND conversation_id = ?"
        return self._write(
            lambda db: db.execute(query, (share_id, conversation_id)).rowcount > 0, conversation_id, retry=False
        )

    async def list_shares(self, conversation_id: str, owner: str) -> list[ShareRecord]:
        """The conversation's live links, oldest first."""
        query = "SELECT id, conversation_id, owner, created_at FROM shares WHERE conversation_id = ? AND owner = ?"
        query += " ORDER BY created_at, id"
        rows = await self._read(lambda db: db.execute(query, (conversation_id, owner)).fetchall())
        return [ShareRecord(**row) for row in rows]

    async def shared(self, token_hash: str) -> tuple[str, float] | None:
        """The snapshot (JSON text) and creation time of the live link with this token hash."""
        query = "SELECT snapshot, created_at FROM shares WHERE token_hash = ?"
        row = await self._read(lambda db: db.execute(query, (token_hash,)).fetchone())
        return (row[0], row[1]) if row else None
