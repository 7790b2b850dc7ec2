"""The statements of share links in PostgreSQL: a part of `PostgresStore`, on its write queue and its
reads."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from pocketchat.records import ShareRecord
from pocketchat.store.postgres_attachments import rows_changed


class PostgresShares:
    """Share links: a conversation's snapshot under the hash of a link's token (deleted with it)."""

    # PostgresStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]

    def add_share(self, share: ShareRecord, token_hash: str, snapshot: str, most: int) -> asyncio.Future[bool]:
        """Store a link, unless its conversation has `most` already; whether it was stored."""
        query = (
            "INSERT INTO shares (id, conversation_id, owner, token_hash, snapshot, created_at)"
            " SELECT $1, $2, $3, $4, $5, $6::double precision"
            " WHERE (SELECT count(*) FROM shares WHERE conversation_id = $2) < $7"
        )
        args = (share.id, share.conversation_id, share.owner, token_hash, snapshot, share.created_at, most)

        async def work(db: asyncpg.Connection) -> bool:
            return rows_changed(await db.execute(query, *args)) > 0

        return self._write(work, share.conversation_id, retry=False)

    def delete_share(self, conversation_id: str, share_id: str) -> asyncio.Future[bool]:
        """Revoke a link of the conversation; whether it had one by that id."""
        query = "DELETE FROM shares WHERE id = $1 AND conversation_id = $2"

        async def work(db: asyncpg.Connection) -> bool:
            return rows_changed(await db.execute(query, share_id, conversation_id)) > 0

        return self._write(work, conversation_id, retry=False)

    async def list_shares(self, conversation_id: str, owner: str) -> list[ShareRecord]:
        """The conversation's live links, oldest first."""
        query = "SELECT id, conversation_id, owner, created_at FROM shares WHERE conversation_id = $1 AND owner = $2"
        query += " ORDER BY created_at, id"
        rows = await self._read(lambda db: db.fetch(query, conversation_id, owner))
        return [ShareRecord(**row) for row in rows]

    async def shared(self, token_hash: str) -> tuple[str, float] | None:
        """The snapshot (JSON text) and creation time of the live link with this token hash."""
        query = "SELECT snapshot, created_at FROM shares WHERE token_hash = $1"
        row = await self._read(lambda db: db.fetchrow(query, token_hash))
        return (row["snapshot"], row["created_at"]) if row else None
