"""The statements of a conversation's documents and images in SQLite: a part of `SqliteStore`, on its
write queue and its reads."""

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.records import DocumentRecord, ImageRecord, Passage

IMAGE_COLUMNS = ", ".join(ImageRecord.FIELDS)  # an image's record without its bytes


class SqliteAttachments:
    """Documents (with their passages, their vectors and their full-text index) and images."""

    # SqliteStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    # ---- documents -------------------------------------------------------------------------------

    def add_document(self, document: DocumentRecord) -> asyncio.Future[Any]:
        marks = ", ".join("?" * len(DocumentRecord.FIELDS))
        query = f"INSERT INTO documents ({', '.join(DocumentRecord.FIELDS)}) VALUES ({marks})"
        row = document.to_row()
        return self._write(lambda db: db.execute(query, row), document.conversation_id, retry=False)

    # An indexing's writes land only while its document is still `indexing`, each checked in its own
    # write (the one writer runs it whole): an indexing that goes on after its document was removed writes
    # nothing. A document id is one indexing: a document never goes back to `indexing`.

    def document_progress(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Write how far its indexing went (and that it goes on: `updated_at`); whether it still indexes."""
        query = "UPDATE documents SET progress = ?, updated_at = ? WHERE id = ? AND status = 'indexing'"
        row = (document.progress, time.time(), document.id)
        return self._write(lambda db: db.execute(query, row).rowcount > 0, document.conversation_id, retry=False)

    def add_chunks(
        self, document: DocumentRecord, rows: list[tuple[int, int | None, str, bytes]]
    ) -> asyncio.Future[bool]:
        """Store passages (seq, page, text, vector) of a document being indexed, if it still is; whether
        it was (if not, nothing is stored). Retrieval ignores them until `finish_document` marks it ready."""
        query = "INSERT INTO chunks (document_id, conversation_id, seq, page, text, vector) VALUES (?, ?, ?, ?, ?, ?)"
        values = [(document.id, document.conversation_id, *row) for row in rows]

        def work(db: sqlite3.Connection) -> bool:
            touched = "UPDATE documents SET updated_at = ? WHERE id = ? AND status = 'indexing'"
            if db.execute(touched, (time.time(), document.id)).rowcount == 0:
                return False
            db.executemany(query, values)
            return True

        return self._write(work, document.conversation_id, retry=False)

    def finish_document(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Mark it ready, or failed (its passages deleted), if it is still indexing; whether it was."""
        query = "UPDATE documents SET status = ?, error = ?, progress = ?, chunks = ?, updated_at = ?"
        query += " WHERE id = ? AND status = 'indexing'"
        row = (document.status, document.error, document.progress, document.chunks, time.time(), document.id)

        def work(db: sqlite3.Connection) -> bool:
            if db.execute(query, row).rowcount == 0:
                return False
            if document.status == "failed":
                db.execute("DELETE FROM chunks WHERE document_id = ?", (document.id,))
            return True

        return self._write(work, document.conversation_id, retry=False)

    def delete_document(self, conversation_id: str, document_id: str) -> asyncio.Future[bool]:
        query = "DELETE FROM documents WHERE id = ? AND conversation_id = ?"
        return self._write(
            lambda db: db.execute(query, (document_id, conversation_id)).rowcount > 0, conversation_id, False
        )

    def sweep_documents(self, stale_before: float) -> asyncio.Future[list[DocumentRecord]]:
        """Mark failed the documents still `indexing` whose indexing gave no sign of life since
        `stale_before` (a process that died), deleting their passages; return them."""
        error = "Indexing was cut short (the server stopped). Remove it and attach it again."

        def work(db: sqlite3.Connection) -> list[DocumentRecord]:
            where = "status = 'indexing' AND updated_at < ?"
            found = [
                DocumentRecord.from_row(r)
                for r in db.execute(f"SELECT * FROM documents WHERE {where}", (stale_before,))
            ]
            for document in found:
                db.execute("DELETE FROM chunks WHERE document_id = ?", (document.id,))
                db.execute("UPDATE documents SET status = 'failed', error = ? WHERE id = ?", (error, document.id))
                document.status, document.error = "failed", error
            return found

        return self._write(work, None, retry=False)

    async def list_documents(self, conversation_id: str, owner: str) -> list[DocumentRecord]:
        query = "SELECT * FROM documents WHERE conversation_id = ? AND owner = ? ORDER BY created_at, id"
        rows = await self._read(lambda db: db.execute(query, (conversation_id, owner)).fetchall())
        return [DocumentRecord.from_row(row) for row in rows]

    async def document_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        """How many documents the conversation has, and how many bytes the owner's documents take."""
        query = (
            "SELECT count(*) FILTER (WHERE conversation_id = ?), coalesce(sum(size), 0) FROM documents WHERE owner = ?"
        )
        row = await self._read(lambda db: db.execute(query, (conversation_id, owner)).fetchone())
        return int(row[0]), int(row[1])

    async def document_vectors(self, document_id: str) -> tuple[list[int], list[bytes]]:
        """The ids of a document's passages and their vectors, in order."""
        query = "SELECT id, vector FROM chunks WHERE document_id = ? ORDER BY seq"
        rows = await self._read(lambda db: db.execute(query, (document_id,)).fetchall())
        return [row[0] for row in rows], [row[1] for row in rows]

    async def search_passages(self, document_ids: list[str], terms: list[str], most: int) -> list[int]:
        """The ids of the passages of these documents that hold any of `terms`, best first (BM25)."""
        if not terms or not document_ids:
            return []
        match = " OR ".join('"' + term.replace('"', "") + '"' for term in terms)
        marks = ",".join("?" * len(document_ids))
        query = (
            "SELECT c.id FROM chunks_text JOIN chunks c ON c.id = chunks_text.rowid"
            f" WHERE chunks_text MATCH ? AND c.document_id IN ({marks}) ORDER BY chunks_text.rank LIMIT ?"
        )
        rows = await self._read(lambda db: db.execute(query, (match, *document_ids, most)).fetchall())
        return [row[0] for row in rows]

    async def passages(self, owner: str, ids: list[int]) -> list[Passage]:
        """These passages, if `owner` owns their documents (in no particular order)."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        query = (
            "SELECT c.id, c.document_id, d.name, c.page, c.text, c.seq FROM chunks c"
            f" JOIN documents d ON d.id = c.document_id WHERE c.id IN ({marks}) AND d.owner = ?"
        )
        rows = await self._read(lambda db: db.execute(query, (*ids, owner)).fetchall())
        return [Passage(row[0], row[1], row[2], row[3], row[4], row[5]) for row in rows]

    # ---- images ----------------------------------------------------------------------------------

    def add_image(self, image: ImageRecord, data: bytes) -> asyncio.Future[Any]:
        query = f"INSERT INTO images ({IMAGE_COLUMNS}, data) VALUES ({', '.join('?' * len(ImageRecord.FIELDS))}, ?)"
        row = (*image.to_row(), data)
        return self._write(lambda db: db.execute(query, row), image.conversation_id, retry=False)

    def attach_images(self, conversation_id: str, message_id: str, image_ids: list[str]) -> asyncio.Future[Any]:
        marks = ",".join("?" * len(image_ids))
        # Only waiting ones: never another message's.
        query = f"UPDATE images SET message_id = ? WHERE conversation_id = ? AND id IN ({marks})"
        query += " AND message_id IS NULL"
        row = (message_id, conversation_id, *image_ids)
        return self._write(lambda db: db.execute(query, row), conversation_id)

    def copy_images(self, conversation_id: str, message_id: str, copies: list[tuple[str, str]]) -> asyncio.Future[Any]:
        # A copy of each image for an edited message (a new version of its message), bytes copied in the
        # database: every image stays one message's, served and deleted as before.
        query = (
            f"INSERT INTO images ({IMAGE_COLUMNS}, data) SELECT ?, conversation_id, owner, ?, name, type, size,"
            " width, height, created_at, data FROM images WHERE id = ? AND conversation_id = ?"
        )
        rows = [(copy, message_id, original, conversation_id) for original, copy in copies]
        return self._write(lambda db: db.executemany(query, rows), conversation_id)

    def delete_image(self, conversation_id: str, image_id: str) -> asyncio.Future[bool]:
        query = "DELETE FROM images WHERE id = ? AND conversation_id = ? AND message_id IS NULL"
        row = (image_id, conversation_id)
        return self._write(lambda db: db.execute(query, row).rowcount > 0, conversation_id, retry=False)

    async def waiting_images(self, conversation_id: str, owner: str) -> list[ImageRecord]:
        query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = ? AND owner = ? AND message_id IS NULL"
        rows = await self._read(
            lambda db: db.execute(query + " ORDER BY created_at, id", (conversation_id, owner)).fetchall()
        )
        return [ImageRecord.from_row(row) for row in rows]

    async def image_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        query = (
            "SELECT count(*) FILTER (WHERE conversation_id = ? AND message_id IS NULL), coalesce(sum(size), 0)"
            " FROM images WHERE owner = ?"
        )
        row = await self._read(lambda db: db.execute(query, (conversation_id, owner)).fetchone())
        return int(row[0]), int(row[1])

    async def image(self, conversation_id: str, image_id: str, owner: str) -> tuple[ImageRecord, bytes] | None:
        query = f"SELECT {IMAGE_COLUMNS}, data FROM images WHERE id = ? AND conversation_id = ? AND owner = ?"
        row = await self._read(lambda db: db.execute(query, (image_id, conversation_id, owner)).fetchone())
        return None if row is None else (ImageRecord.from_row(row), row["data"])

    async def image_data(self, owner: str, ids: list[str]) -> dict[str, tuple[str, bytes]]:
        if not ids:
            return {}
        query = f"SELECT id, type, data FROM images WHERE owner = ? AND id IN ({','.join('?' * len(ids))})"
        rows = await self._read(lambda db: db.execute(query, (owner, *ids)).fetchall())
        return {row[0]: (row[1], row[2]) for row in rows}
