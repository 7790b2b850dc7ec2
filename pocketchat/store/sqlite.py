"""Conversations, messages, sign-in sessions and the app's secrets in one SQLite file.

Writes go through the write queue (`writes.py`); one thread of their own owns the only write connection
and runs them, so writes never block the event loop and never contend. Reads open their own connection
on a worker thread (WAL lets them run beside the writer).
"""

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from pocketchat.records import (
    CONVERSATION_COLUMNS,
    ConversationRecord,
    DocumentRecord,
    ImageRecord,
    Message,
    MessageHit,
    Passage,
    with_images,
)
from pocketchat.store import TOMBSTONE_SECONDS, like_pattern, session_hash, token_hash
from pocketchat.store.queued import QueuedStore, Row
from pocketchat.store.writes import Database, Job

logger = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]  # run on the writer's thread, with the write connection
PRIVATE = 0o600  # the database's files: read and written by the user the app runs as, nobody else

# The schema, one step per version; `PRAGMA user_version` says how many steps a file has had. The
# first step is the schema of the first release, so its files (version 0) take it as a no-op.
MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT,
    model TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    turn_id TEXT,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    error TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, seq);
""",
    # Sign-in: every conversation has an owner (the one local user, for those made before), sessions
    # are recorded so that they can be revoked, and the secret that signs them lives here.
    """
ALTER TABLE conversations ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
CREATE INDEX conversations_by_owner ON conversations(owner, updated_at);
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL
);
CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
    # The generated access token is kept as its hash: a copy of the file signs nobody in. (`token_hash`
    # is registered on the connection that migrates; secure_delete zeroes the clear value's bytes.)
    """
PRAGMA secure_delete = ON;
INSERT OR REPLACE INTO secrets (name, value)
    SELECT 'access_token_hash', token_hash(value) FROM secrets WHERE name = 'access_token';
DELETE FROM secrets WHERE name = 'access_token';
""",
    # Deleted conversations, for a day: with replicas (PostgreSQL's step 3), one whose first turn of a
    # conversation started as another deleted it must not store it again. Here for the same schema.
    """
CREATE TABLE deleted_conversations (id TEXT PRIMARY KEY, deleted_at REAL NOT NULL);
""",
    # Documents: files attached to a conversation (deleted with it), their passages with a vector each
    # (float32 bytes) and a full-text index of the passages (FTS5, kept in step by triggers; a cascade
    # from a deleted conversation or document fires them too).
    """
CREATE TABLE documents (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    progress REAL NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    embedder TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX documents_by_conversation ON documents(conversation_id, created_at);
CREATE INDEX documents_by_owner ON documents(owner);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    page INTEGER,
    text TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX chunks_by_document ON chunks(document_id, seq);
CREATE VIRTUAL TABLE chunks_text USING fts5(text, content='chunks', content_rowid='id', tokenize='porter unicode61');
CREATE TRIGGER chunks_text_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_text(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER chunks_text_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_text(chunks_text, rowid, text) VALUES ('delete', old.id, old.text);
END;
""",
    # Images attached to user messages (deleted with their conversation), bytes and all. `message_id` is
    # NULL while one waits to go with the next message. It names the message without a foreign key: an
    # edit or a regenerate deletes the message and writes it again under the same id, images and all.
    """
CREATE TABLE images (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    message_id TEXT,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    size INTEGER NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX images_by_conversation ON images(conversation_id, created_at);
CREATE INDEX images_by_owner ON images(owner);
""",
    # Tools: the tool sources a conversation turned off (JSON: a list of names; none before).
    """
ALTER TABLE conversations ADD COLUMN tools_off TEXT NOT NULL DEFAULT '[]';
""",
]

IMAGE_COLUMNS = ", ".join(ImageRecord.FIELDS)  # an image's record without its bytes

# A reply is written while it streams; once it is final (complete, stopped, error, or interrupted by the
# replica that took its turn over) no later write changes it: a producer that was paused past its lease
# and wakes up cannot write its longer reply over what the other replica stored.
UPSERT_MESSAGE = """
INSERT INTO messages (id, conversation_id, turn_id, role, content, reasoning, status, error, meta, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET content=excluded.content, reasoning=excluded.reasoning,
    status=excluded.status, error=excluded.error, meta=excluded.meta
WHERE messages.status = 'streaming'
"""


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, check_same_thread=False)
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA busy_timeout = 5000")
    return connection


def _migrate(db: sqlite3.Connection) -> None:
    """Bring the file's schema up to date, each step in its own transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.create_function("token_hash", 1, token_hash, deterministic=True)
    for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
        db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
        logger.info("database schema upgraded to version %d", number)
    if version < len(MIGRATIONS):
        # Old versions of rows (a clear token, say) stay in the write-ahead log until it is emptied.
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _keep_private(path: Path) -> None:
    """Make the database file (if new) and its -wal and -shm files readable by their owner only: they
    hold every conversation and the key that signs sessions. SQLite gives the -wal and -shm files it
    makes the database file's mode, whatever the umask; files an older release made 0644 are changed."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE))
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(file, PRIVATE)


def _insert_conversation(db: sqlite3.Connection, record: ConversationRecord) -> None:
    db.execute(
        # OR IGNORE: with replicas, two may each store a new conversation they both had in memory.
        # Never one that was deleted.
        f"INSERT OR IGNORE INTO conversations ({', '.join(CONVERSATION_COLUMNS)})"
        " SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM deleted_conversations WHERE id = ?)",
        (*record.to_row(), record.id),
    )


class _WriteConnection(Database):
    """The only write connection, used on one thread of its own: writes never block the event loop and
    never contend. Each hook is one hop to that thread."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self.connection: sqlite3.Connection | None = None  # made on the thread by `SqliteStore.open`

    async def run(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    async def close(self) -> None:
        if self.connection is not None:
            await self.run(self.connection.close)
        self._thread.shutdown()

    def may_pass(self, error: BaseException) -> bool:
        # The database refuses, not the job: full, locked past busy_timeout, read-only, an I/O error.
        return isinstance(error, sqlite3.OperationalError)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[sqlite3.Connection]:
        db = self._opened()
        await self.run(lambda: db.execute("BEGIN"))
        try:
            yield db
            await self.run(db.commit)
        except BaseException:
            await self.run(lambda: _roll_back(db))
            raise

    async def in_savepoint(self, db: sqlite3.Connection, job: Job) -> Any:
        def work() -> Any:
            db.execute("SAVEPOINT job")
            try:
                result = job.work(db)
            except sqlite3.OperationalError:
                raise  # the whole transaction fails: SQLite may have rolled it back already
            except Exception:
                db.execute("ROLLBACK TO job")
                db.execute("RELEASE job")
                raise
            db.execute("RELEASE job")
            return result

        return await self.run(work)

    async def alone(self, job: Job) -> Any:
        db = self._opened()

        def work() -> Any:
            try:
                db.execute("BEGIN")
                result = job.work(db)
                db.commit()
            except BaseException:
                _roll_back(db)
                raise
            return result

        return await self.run(work)

    def _opened(self) -> sqlite3.Connection:
        if self.connection is None:
            raise RuntimeError("the store is not open")
        return self.connection


def _roll_back(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.rollback()  # SQLite may have rolled it back already (a full disk does)


class SqliteStore(QueuedStore[_WriteConnection]):
    """The store in one SQLite file: the default, for one process."""

    def __init__(self, path: Path) -> None:
        super().__init__(_WriteConnection(), logger)
        self.path = path

    async def open(self, sweep_streaming: bool = True) -> int:
        """Bring the schema up to date, start the writer, and (with `sweep_streaming`: no other process
        can be writing one) mark replies a crash cut short as interrupted; return how many."""
        interrupted = await self._database.run(lambda: self._open(sweep_streaming))
        self._start_writing()
        return interrupted

    def _open(self, sweep_streaming: bool) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _keep_private(self.path)
        connection = _connect(self.path)
        connection.execute("PRAGMA journal_mode = WAL")
        # With WAL, NORMAL loses nothing when the process crashes, only on power loss, and spares an
        # fsync per commit.
        connection.execute("PRAGMA synchronous = NORMAL")
        _migrate(connection)
        sweep = "UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'"
        interrupted = connection.execute(sweep).rowcount if sweep_streaming else 0
        forgotten = "DELETE FROM deleted_conversations WHERE deleted_at < ?"
        connection.execute(forgotten, (time.time() - TOMBSTONE_SECONDS,))
        connection.commit()
        self._database.connection = connection
        return interrupted

    async def close(self) -> None:
        """Finish the queued writes (and try the unwritten ones once more), then close."""
        if self._closing:
            return
        await self._stop_writing()
        await self._database.close()

    # ---- reads ------------------------------------------------------------------------------------

    async def _read(self, work: Work[T]) -> T:
        def run() -> T:
            connection = _connect(self.path)
            try:
                return work(connection)
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def list_conversations(self, owner: str) -> list[ConversationRecord]:
        query = "SELECT * FROM conversations WHERE owner = ? ORDER BY updated_at DESC, created_at DESC"
        return await self._read(lambda db: [ConversationRecord.from_row(row) for row in db.execute(query, (owner,))])

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None:
        def work(db: sqlite3.Connection) -> tuple[ConversationRecord, list[Message]] | None:
            row = db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if row is None:
                return None
            rows = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
            messages = [Message.from_row(message) for message in rows]
            query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = ? AND message_id IS NOT NULL"
            images = db.execute(query + " ORDER BY created_at, id", (conversation_id,))
            return ConversationRecord.from_row(row), with_images(messages, map(ImageRecord.from_row, images))

        return await self._read(work)

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages that hold every one of `terms` (a LIKE each, case-insensitive for
        ASCII), leaving out those of the turn `leave_out_turn`."""
        likes = " AND ".join("m.content LIKE ? ESCAPE '\\'" for _ in terms) or "1 = 1"
        query = (
            "SELECT m.conversation_id, c.title, m.role, m.content, m.created_at FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id"
            f" WHERE c.owner = ? AND m.turn_id IS NOT ? AND {likes} ORDER BY m.created_at DESC LIMIT ?"
        )
        args = (owner, leave_out_turn, *(like_pattern(term) for term in terms), most)
        rows = await self._read(lambda db: db.execute(query, args).fetchall())
        return [MessageHit(*row) for row in rows]

    async def read_secret(self, name: str) -> str | None:
        row = await self._read(lambda db: db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone())
        return row[0] if row else None

    async def session_user(self, session_id: str) -> str | None:
        """The user of a session that is neither revoked nor expired."""
        query = "SELECT user FROM sessions WHERE id_hash = ? AND revoked_at IS NULL AND expires_at > ?"
        row = await self._read(lambda db: db.execute(query, (session_hash(session_id), time.time())).fetchone())
        return row[0] if row else None

    async def dead_sessions(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions are revoked, expired or unknown (a socket on one must close)."""
        hashes = {session_hash(session_id): session_id for session_id in session_ids}

        def work(db: sqlite3.Connection) -> set[str]:
            marks = ",".join("?" * len(hashes))
            query = f"SELECT id_hash FROM sessions WHERE revoked_at IS NULL AND expires_at > ? AND id_hash IN ({marks})"
            live = {row[0] for row in db.execute(query, (time.time(), *hashes))}
            return {session_id for digest, session_id in hashes.items() if digest not in live}

        return await self._read(work)

    # ---- the statements of the writes (queued.py) --------------------------------------------------

    def _insert(self, record: ConversationRecord) -> Work[None]:
        return lambda db: _insert_conversation(db, record)

    def _update(self, record: ConversationRecord, names: list[str]) -> Work[Any]:
        query = f"UPDATE conversations SET {', '.join(f'{name} = ?' for name in ['updated_at', *names])} WHERE id = ?"
        row = (record.updated_at, *(record.column(name) for name in names), record.id)
        return lambda db: db.execute(query, row)

    def _name(self, record: ConversationRecord) -> Work[Any]:
        query = "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ? AND title IS NULL"
        row = (record.title, record.updated_at, record.id)
        return lambda db: db.execute(query, row)

    def _delete(self, conversation_id: str) -> Work[bool]:
        def work(db: sqlite3.Connection) -> bool:
            db.execute("INSERT OR IGNORE INTO deleted_conversations VALUES (?, ?)", (conversation_id, time.time()))
            return db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

        return work

    def _save(
        self, conversation_id: str, rows: list[Row], delete_ids: Sequence[str], new: ConversationRecord | None
    ) -> Work[None]:
        def work(db: sqlite3.Connection) -> None:
            if new is not None:
                _insert_conversation(db, new)
            db.executemany("DELETE FROM messages WHERE id = ?", [(mid,) for mid in delete_ids])
            db.executemany(UPSERT_MESSAGE, rows)
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))

        return work

    def _interrupt(self, message: Message) -> Work[Any]:
        row = (message.content, message.reasoning, message.error, message.id)
        query = "UPDATE messages SET content = ?, reasoning = ?, status = 'interrupted', error = ?"
        query += " WHERE id = ? AND status = 'streaming'"
        return lambda db: db.execute(query, row)

    def _keep_secret(self, name: str, value: str) -> Work[str]:
        def work(db: sqlite3.Connection) -> str:
            db.execute("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", (name, value))
            return db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()[0]

        return work

    def _replace_secret(self, name: str, value: str) -> Work[Any]:
        query = "INSERT OR REPLACE INTO secrets (name, value) VALUES (?, ?)"
        return lambda db: db.execute(query, (name, value))

    def _add_session(self, row: tuple[str, str, float, float]) -> Work[Any]:
        return lambda db: db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, NULL)", row)

    def _revoke(self, id_hash: str | None) -> Work[int]:
        where, args = ("id_hash = ?", (id_hash,)) if id_hash else ("1 = 1", ())
        query = f"UPDATE sessions SET revoked_at = ? WHERE revoked_at IS NULL AND {where}"
        return lambda db: db.execute(query, (time.time(), *args)).rowcount

    # ---- documents -------------------------------------------------------------------------------

    def add_document(self, document: DocumentRecord) -> asyncio.Future[Any]:
        marks = ", ".join("?" * len(DocumentRecord.FIELDS))
        query = f"INSERT INTO documents ({', '.join(DocumentRecord.FIELDS)}) VALUES ({marks})"
        row = document.to_row()
        return self._write(lambda db: db.execute(query, row), document.conversation_id, retry=False)

    def document_progress(self, document: DocumentRecord) -> asyncio.Future[Any]:
        """Write how far its indexing went (and that it goes on: `updated_at`)."""
        query = "UPDATE documents SET progress = ?, updated_at = ? WHERE id = ? AND status = 'indexing'"
        row = (document.progress, time.time(), document.id)
        return self._write(lambda db: db.execute(query, row), document.conversation_id, retry=False)

    def add_chunks(
        self, document: DocumentRecord, rows: list[tuple[int, int | None, str, bytes]]
    ) -> asyncio.Future[Any]:
        """Store passages (seq, page, text, vector) of a document being indexed; retrieval ignores them
        until `finish_document` marks it ready."""
        query = "INSERT INTO chunks (document_id, conversation_id, seq, page, text, vector) VALUES (?, ?, ?, ?, ?, ?)"
        values = [(document.id, document.conversation_id, *row) for row in rows]

        def work(db: sqlite3.Connection) -> None:
            db.executemany(query, values)
            db.execute("UPDATE documents SET updated_at = ? WHERE id = ?", (time.time(), document.id))

        return self._write(work, document.conversation_id, retry=False)

    def finish_document(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Mark it ready, or failed (its passages deleted), if it is still indexing; whether it was."""
        query = "UPDATE documents SET status = ?, error = ?, progress = ?, chunks = ?, updated_at = ?"
        query += " WHERE id = ? AND status = 'indexing'"
        row = (document.status, document.error, document.progress, document.chunks, time.time(), document.id)

        def work(db: sqlite3.Connection) -> bool:
            if document.status == "failed":
                db.execute("DELETE FROM chunks WHERE document_id = ?", (document.id,))
            return db.execute(query, row).rowcount > 0

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
        # Only waiting ones (or the message's own, written again by an edit): never another message's.
        query = f"UPDATE images SET message_id = ? WHERE conversation_id = ? AND id IN ({marks})"
        query += " AND (message_id IS NULL OR message_id = ?)"
        row = (message_id, conversation_id, *image_ids, message_id)
        return self._write(lambda db: db.execute(query, row), conversation_id)

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
