"""The statements of a conversation's documents and images in PostgreSQL: a part of `PostgresStore`, on
its write queue and its reads."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from pocketchat.records import DocumentRecord, ImageRecord, Passage

IMAGE_COLUMNS = ", ".join(ImageRecord.FIELDS)  # an image's record without its bytes


def rows_changed(status: str) -> int:
    """The row count of a command status such as 'UPDATE 3' or 'INSERT 0 1'."""
    return int(status.rsplit(" ", 1)[-1])


class PostgresAttachments:
    """Documents (with their passages, their vectors and their full-text index) and images."""

    # PostgresStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]

    # ---- documents -------------------------------------------------------------------------------

    def add_document(self, document: DocumentRecord) -> asyncio.Future[Any]:
        marks = ", ".join(f"${number}" for number in range(1, len(DocumentRecord.FIELDS) + 1))
        query = f"INSERT INTO documents ({', '.join(DocumentRecord.FIELDS)}) VALUES ({marks})"
        row = document.to_row()
        return self._write(lambda db: db.execute(query, *row), document.conversation_id, retry=False)

    # An indexing's writes land only while its document is still `indexing`, each checked in its own
    # transaction (the UPDATE's row lock holds off a sweep or a delete until it commits): a replica that
    # woke from a pause, or that indexes a document removed elsewhere, writes nothing. A document id is
    # one indexing: a document never goes back to `indexing`, and a file attached again is a new one.

    def document_progress(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Write how far its indexing went (and that it goes on: `updated_at`); whether it still indexes."""
        query = "UPDATE documents SET progress = $1, updated_at = $2 WHERE id = $3 AND status = 'indexing'"
        row = (document.progress, time.time(), document.id)

        async def work(db: asyncpg.Connection) -> bool:
            return rows_changed(await db.execute(query, *row)) > 0

        return self._write(work, document.conversation_id, retry=False)

    def add_chunks(
        self, document: DocumentRecord, rows: list[tuple[int, int | None, str, bytes]]
    ) -> asyncio.Future[bool]:
        """Store passages (seq, page, text, vector) of a document being indexed, if it still is; whether
        it was (if not, nothing is stored). Retrieval ignores them until `finish_document` marks it ready."""
        query = (
            "INSERT INTO chunks (document_id, conversation_id, seq, page, text, vector) VALUES ($1, $2, $3, $4, $5, $6)"
        )
        values = [(document.id, document.conversation_id, *row) for row in rows]

        async def work(db: asyncpg.Connection) -> bool:
            touched = "UPDATE documents SET updated_at = $1 WHERE id = $2 AND status = 'indexing'"
            if rows_changed(await db.execute(touched, time.time(), document.id)) == 0:
                return False
            await db.executemany(query, values)
            return True

        return self._write(work, document.conversation_id, retry=False)

    def finish_document(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Mark it ready, or failed (its passages deleted), if it is still indexing; whether it was."""
        query = "UPDATE documents SET status = $1, error = $2, progress = $3, chunks = $4, updated_at = $5"
        query += " WHERE id = $6 AND status = 'indexing'"
        row = (document.status, document.error, document.progress, document.chunks, time.time(), document.id)

        async def work(db: asyncpg.Connection) -> bool:
            if rows_changed(await db.execute(query, *row)) == 0:
                return False
            if document.status == "failed":
                await db.execute("DELETE FROM chunks WHERE document_id = $1", document.id)
            return True

        return self._write(work, document.conversation_id, retry=False)

    def delete_document(self, conversation_id: str, document_id: str) -> asyncio.Future[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            query = "DELETE FROM documents WHERE id = $1 AND conversation_id = $2"
            return rows_changed(await db.execute(query, document_id, conversation_id)) > 0

        return self._write(work, conversation_id, retry=False)

    def sweep_documents(self, stale_before: float) -> asyncio.Future[list[DocumentRecord]]:
        """Mark failed the documents still `indexing` whose indexing gave no sign of life since
        `stale_before` (its replica died), deleting their passages; return them."""
        error = "Indexing was cut short (the server stopped). Remove it and attach it again."

        async def work(db: asyncpg.Connection) -> list[DocumentRecord]:
            where = "status = 'indexing' AND updated_at < $1"
            rows = await db.fetch(f"SELECT * FROM documents WHERE {where} FOR UPDATE", stale_before)
            found = [DocumentRecord.from_row(row) for row in rows]
            for document in found:
                await db.execute("DELETE FROM chunks WHERE document_id = $1", document.id)
                await db.execute("UPDATE documents SET status = 'failed', error = $1 WHERE id = $2", error, document.id)
                document.status, document.error = "failed", error
            return found

        return self._write(work, None, retry=False)

    async def list_documents(self, conversation_id: str, owner: str) -> list[DocumentRecord]:
        query = "SELECT * FROM documents WHERE conversation_id = $1 AND owner = $2 ORDER BY created_at, id"
        rows = await self._read(lambda db: db.fetch(query, conversation_id, owner))
        return [DocumentRecord.from_row(row) for row in rows]

    async def document_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        """How many documents the conversation has, and how many bytes the owner's documents take."""
        query = (
            "SELECT count(*) FILTER (WHERE conversation_id = $1), coalesce(sum(size), 0) FROM documents"
            " WHERE owner = $2"
        )
        row = await self._read(lambda db: db.fetchrow(query, conversation_id, owner))
        return int(row[0]), int(row[1])

    async def document_vectors(self, document_id: str) -> tuple[list[int], list[bytes]]:
        """The ids of a document's passages and their vectors, in order."""
        query = "SELECT id, vector FROM chunks WHERE document_id = $1 ORDER BY seq"
        rows = await self._read(lambda db: db.fetch(query, document_id))
        return [row[0] for row in rows], [row[1] for row in rows]

    async def search_passages(self, document_ids: list[str], terms: list[str], most: int) -> list[int]:
        """The ids of the passages of these documents that hold any of `terms`, best first (ts_rank)."""
        if not terms or not document_ids:
            return []
        # Each term quoted as a lexeme of its own, stemmed by the 'english' configuration; stop words drop out.
        match = " | ".join("'" + term.replace("'", "") + "'" for term in terms)
        query = (
            "SELECT id FROM chunks, to_tsquery('english', $1) AS q WHERE words @@ q AND document_id = ANY($2::text[])"
            " ORDER BY ts_rank(words, q) DESC LIMIT $3"
        )
        rows = await self._read(lambda db: db.fetch(query, match, document_ids, most))
        return [row[0] for row in rows]

    async def passages(self, owner: str, ids: list[int]) -> list[Passage]:
        """These passages, if `owner` owns their documents (in no particular order)."""
        if not ids:
            return []
        query = (
            "SELECT c.id, c.document_id, d.name, c.page, c.text, c.seq FROM chunks c"
            " JOIN documents d ON d.id = c.document_id WHERE c.id = ANY($1::bigint[]) AND d.owner = $2"
        )
        rows = await self._read(lambda db: db.fetch(query, ids, owner))
        return [Passage(row[0], row[1], row[2], row[3], row[4], row[5]) for row in rows]

    # ---- images ----------------------------------------------------------------------------------

    def add_image(self, image: ImageRecord, data: bytes) -> asyncio.Future[Any]:
        marks = ", ".join(f"${number}" for number in range(1, len(ImageRecord.FIELDS) + 2))
        query = f"INSERT INTO images ({IMAGE_COLUMNS}, data) VALUES ({marks})"
        row = (*image.to_row(), data)
        return self._write(lambda db: db.execute(query, *row), image.conversation_id, retry=False)

    def attach_images(self, conversation_id: str, message_id: str, image_ids: list[str]) -> asyncio.Future[Any]:
        # Only waiting ones: never another message's.
        query = (
            "UPDATE images SET message_id = $1 WHERE conversation_id = $2 AND id = ANY($3::text[])"
            " AND message_id IS NULL"
        )
        return self._write(lambda db: db.execute(query, message_id, conversation_id, image_ids), conversation_id)

    def copy_images(self, conversation_id: str, message_id: str, copies: list[tuple[str, str]]) -> asyncio.Future[Any]:
        # A copy of each image for an edited message (a new version of its message), bytes copied in the
        # database: every image stays one message's, served and deleted as before.
        query = (
            f"INSERT INTO images ({IMAGE_COLUMNS}, data) SELECT $1, conversation_id, owner, $2, name, type, size,"
            " width, height, created_at, data FROM images WHERE id = $3 AND conversation_id = $4"
        )
        rows = [(copy, message_id, original, conversation_id) for original, copy in copies]
        return self._write(lambda db: db.executemany(query, rows), conversation_id)

    def delete_image(self, conversation_id: str, image_id: str) -> asyncio.Future[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            query = "DELETE FROM images WHERE id = $1 AND conversation_id = $2 AND message_id IS NULL"
            return rows_changed(await db.execute(query, image_id, conversation_id)) > 0

        return self._write(work, conversation_id, retry=False)

    async def waiting_images(self, conversation_id: str, owner: str) -> list[ImageRecord]:
        query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = $1 AND owner = $2 AND message_id IS NULL"
        rows = await self._read(lambda db: db.fetch(query + " ORDER BY created_at, id", conversation_id, owner))
        return [ImageRecord.from_row(row) for row in rows]

    async def image_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        query = (
            "SELECT count(*) FILTER (WHERE conversation_id = $1 AND message_id IS NULL), coalesce(sum(size), 0)"
            " FROM images WHERE owner = $2"
        )
        row = await self._read(lambda db: db.fetchrow(query, conversation_id, owner))
        return int(row[0]), int(row[1])

    async def image(self, conversation_id: str, image_id: str, owner: str) -> tuple[ImageRecord, bytes] | None:
        query = f"SELECT {IMAGE_COLUMNS}, data FROM images WHERE id = $1 AND conversation_id = $2 AND owner = $3"
        row = await self._read(lambda db: db.fetchrow(query, image_id, conversation_id, owner))
        return None if row is None else (ImageRecord.from_row(row), row["data"])

    async def image_data(self, owner: str, ids: list[str]) -> dict[str, tuple[str, bytes]]:
        if not ids:
            return {}
        query = "SELECT id, type, data FROM images WHERE owner = $1 AND id = ANY($2::text[])"
        rows = await self._read(lambda db: db.fetch(query, owner, ids))
        return {row[0]: (row[1], row[2]) for row in rows}
