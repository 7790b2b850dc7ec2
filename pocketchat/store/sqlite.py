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
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pocketchat.hashes import session_hash
from pocketchat.records import (
    CONVERSATION_COLUMNS,
    ConversationRecord,
    ImageRecord,
    Message,
    with_images,
)
from pocketchat.store import TOMBSTONE_SECONDS
from pocketchat.store.queued import ChosenPath, QueuedStore, Row, merged_meta
from pocketchat.store.sqlite_attachments import IMAGE_COLUMNS, SqliteAttachments
from pocketchat.store.sqlite_memory import SqliteMemory
from pocketchat.store.sqlite_schema import migrate
from pocketchat.store.sqlite_search import SqliteSearch
from pocketchat.store.sqlite_shares import SqliteShares
from pocketchat.store.sqlite_transfer import SqliteTransfer
from pocketchat.store.transfer import IMPORTING, PARTIAL
from pocketchat.store.writes import Database, Job, JobFailed

logger = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]  # statements, given a connection: the writer's, or a reading thread's
PRIVATE = 0o600  # the database's files: read and written by the user the app runs as, nobody else

# A reply is written while it streams; once it is final (complete, stopped, error, or interrupted by the
# replica that took its turn over) no later write changes it: a producer that was paused past its lease
# and wakes up cannot write its longer reply over what the other replica stored.
UPSERT_MESSAGE = """
INSERT INTO messages
    (id, conversation_id, turn_id, role, content, reasoning, status, error, meta, created_at, parent_id)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
        f" SELECT {', '.join('?' * len(CONVERSATION_COLUMNS))}"
        " WHERE NOT EXISTS (SELECT 1 FROM deleted_conversations WHERE id = ?)",
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

    async def together(self, jobs: list[Job]) -> list[Any]:
        db = self._opened()

        def work() -> list[Any]:  # the whole group in one hand-off to the database thread
            results: list[Any] = []
            running: int | None = None  # the job running now, if one is: else it is BEGIN or COMMIT
            try:
                db.execute("BEGIN")
                for index, job in enumerate(jobs):
                    running = index
                    results.append(job.work(db))
                    self.answered_at = time.monotonic()  # read by the event loop: a float, set whole
                running = None
                db.commit()
            except BaseException as error:
                _roll_back(db)
                if isinstance(error, Exception) and running is not None:
                    raise JobFailed(running, error) from error
                raise
            return results

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


READERS = 4  # threads that read the file, each with a connection of its own


class _Readers:
    """The threads that read the file, each keeping its connection: opening one (the file, the WAL
    index, the whole schema parsed again) cost more than the reads a turn makes, and a burst of turns
    waited on it (README, Benchmarks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="sqlite-read")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()  # `_connections`, from the reading threads

    async def run(self, work: Work[T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._in_thread, work)

    def _in_thread(self, work: Work[T]) -> T:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = _connect(self.path)
            with self._lock:
                self._connections.append(db)
        try:
            return work(db)
        finally:
            if db.in_transaction:
                db.rollback()  # a read left a snapshot open: the next one must see the newest writes

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()


class SqliteStore(
    SqliteShares, SqliteMemory, SqliteAttachments, SqliteSearch, SqliteTransfer, QueuedStore[_WriteConnection]
):
    """The store in one SQLite file: the default, for one process."""

    def __init__(self, path: Path) -> None:
        super().__init__(_WriteConnection(), logger)
        self.path = path
        self._readers = _Readers(path)

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
        migrate(connection)
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
        await asyncio.to_thread(self._readers.close)

    # ---- reads ------------------------------------------------------------------------------------

    async def _read(self, work: Work[T]) -> T:
        return await self._readers.run(work)

    async def list_conversations(self, owner: str) -> list[ConversationRecord]:
        query = f"SELECT * FROM conversations WHERE owner = ? AND id NOT IN {PARTIAL}"
        query += " ORDER BY updated_at DESC, created_at DESC"
        return await self._read(lambda db: [ConversationRecord.from_row(row) for row in db.execute(query, (owner,))])

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None:
        def work(db: sqlite3.Connection) -> tuple[ConversationRecord, list[Message]] | None:
            query = f"SELECT *, {IMPORTING} FROM conversations WHERE id = ? AND id NOT IN {PARTIAL}"
            row = db.execute(query, (conversation_id,)).fetchone()
            if row is None:
                return None
            rows = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
            messages = [Message.from_row(message) for message in rows]
            query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = ? AND message_id IS NOT NULL"
            images = db.execute(query + " ORDER BY created_at, id", (conversation_id,))
            record = ConversationRecord.from_row(row)
            record.importing = bool(row["importing"])
            return record, with_images(messages, map(ImageRecord.from_row, images))

        return await self._read(work)

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

    def _name(self, record: ConversationRecord, replacing: str | None) -> Work[Any]:
        query = "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ? AND title IS ?"
        row = (record.title, record.updated_at, record.id, replacing)
        return lambda db: db.execute(query, row)

    def _delete(self, conversation_id: str) -> Work[bool]:
        def work(db: sqlite3.Connection) -> bool:
            db.execute("INSERT OR IGNORE INTO deleted_conversations VALUES (?, ?)", (conversation_id, time.time()))
            return db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

        return work

    def _save(
        self, conversation_id: str, rows: list[Row], new: ConversationRecord | None, path: ChosenPath | None
    ) -> Work[bool | None]:
        touch = "UPDATE conversations SET updated_at = ? WHERE id = ?"
        choose = None if path is None else self._choose(conversation_id, path, touch=True)

        def work(db: sqlite3.Connection) -> bool | None:
            if new is not None:
                _insert_conversation(db, new)
            db.executemany(UPSERT_MESSAGE, rows)
            written = None if choose is None else choose(db)  # touches `updated_at` too, if written
            if not written:
                db.execute(touch, (time.time(), conversation_id))
            return written

        return work

    def _choose(self, conversation_id: str, path: ChosenPath, touch: bool = False) -> Work[bool]:
        query = "UPDATE conversations SET leaf_id = ?, path_version = path_version + 1"
        args: tuple[Any, ...] = (path.leaf_id,)
        if touch:  # a turn's opening write: `updated_at` with it, in one statement
            query, args = query + ", updated_at = ?", (*args, time.time())
        query, args = query + " WHERE id = ?", (*args, conversation_id)
        if path.expected is not None:
            query, args = query + " AND path_version = ?", (*args, path.expected)
        return lambda db: db.execute(query, args).rowcount > 0

    def _press(self, conversation_id: str, message_id: str, step: str, button: str) -> Work[bool]:
        # Step ids are letters, digits, _ and - (pocketchat/steps.py): a JSON path of their own.
        path = f'$.presses."{step}"'
        query = (
            "UPDATE messages SET meta = json_set(coalesce(meta, '{}'), ?, ?) WHERE id = ? AND conversation_id = ?"
            " AND status != 'streaming' AND json_extract(coalesce(meta, '{}'), ?) IS NULL"
        )
        return lambda db: db.execute(query, (path, button, message_id, conversation_id, path)).rowcount > 0

    def _interrupt(self, message: Message) -> Work[Any]:
        query = "UPDATE messages SET content = ?, reasoning = ?, status = 'interrupted', error = ?,"
        query += " meta = coalesce(?, meta) WHERE id = ? AND status = 'streaming'"
        read = "SELECT meta FROM messages WHERE id = ? AND status = 'streaming'"

        def work(db: sqlite3.Connection) -> Any:
            stored = db.execute(read, (message.id,)).fetchone() if message.meta else None
            meta = merged_meta(stored[0] if stored else None, message)
            return db.execute(query, (message.content, message.reasoning, message.error, meta, message.id))

        return work

    def _interrupt_or_open(
        self, conversation_id: str, message: Message, rows: list[Row], record: ConversationRecord
    ) -> Work[Any]:
        # The row of a reply whose opening write landed keeps its usage so far (meta): its end is written,
        # with its steps, as `_interrupt` does. Else the opening write is made now, with the reply as it ended.
        interrupt = self._interrupt(message)
        open_turn = self._save(conversation_id, rows, record, ChosenPath(None, record.path_version))

        def work(db: sqlite3.Connection) -> bool | None:
            if db.execute("SELECT 1 FROM messages WHERE id = ?", (message.id,)).fetchone() is None:
                return open_turn(db)
            interrupt(db)
            return None

        return work

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
