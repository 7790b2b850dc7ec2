"""Conversations and messages in one SQLite file.

One writer thread owns the only write connection, so writes never block the event loop and never
contend; reads open their own connection on a worker thread (WAL lets them run beside the writer).
"""

import asyncio
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from utils.messages import ConversationRecord, Message

logger = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA = """
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
"""

UPSERT_MESSAGE = """
INSERT INTO messages (id, conversation_id, turn_id, role, content, reasoning, status, error, meta, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET content=excluded.content, reasoning=excluded.reasoning,
    status=excluded.status, error=excluded.error, meta=excluded.meta
"""


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, check_same_thread=False)
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA busy_timeout = 5000")
    return connection


def _insert_conversation(db: sqlite3.Connection, record: ConversationRecord) -> None:
    db.execute(
        "INSERT INTO conversations (id, title, model, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
        (record.id, record.title, record.model, record.system_prompt, record.created_at, record.updated_at),
    )


def _conversation(row: sqlite3.Row) -> ConversationRecord:
    return ConversationRecord(
        id=row["id"],
        title=row["title"],
        model=row["model"],
        system_prompt=row["system_prompt"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _message(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"],
        turn_id=row["turn_id"],
        role=row["role"],
        content=row["content"],
        reasoning=row["reasoning"],
        status=row["status"],
        error=row["error"],
        meta=json.loads(row["meta"]),
        created_at=row["created_at"],
    )


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._jobs: queue.SimpleQueue[tuple[Callable[[sqlite3.Connection], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._writer = threading.Thread(target=self._write_loop, name="sqlite-writer", daemon=True)

    def open(self) -> int:
        """Create the schema, start the writer and mark replies a crash cut short; return how many."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = _connect(self.path)
        connection.execute("PRAGMA journal_mode = WAL")
        # With WAL, NORMAL loses nothing when the process crashes, only on power loss, and spares an
        # fsync per commit.
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.executescript(SCHEMA)
        interrupted = connection.execute(
            "UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'"
        ).rowcount
        connection.commit()
        self._connection = connection
        self._writer.start()
        return interrupted

    def close(self) -> None:
        """Finish the queued writes, then close."""
        self._jobs.put(None)
        self._writer.join()
        self._connection.close()

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            # Group commit: the jobs queued meanwhile share one transaction, each in its own savepoint.
            batch = [job]
            while len(batch) < 100:
                try:
                    if (more := self._jobs.get_nowait()) is None:
                        self._jobs.put(None)
                        break
                    batch.append(more)
                except queue.Empty:
                    break
            results = []
            self._connection.execute("BEGIN")
            for work, done in batch:
                self._connection.execute("SAVEPOINT job")
                try:
                    results.append((done, work(self._connection), None))
                    self._connection.execute("RELEASE job")
                except Exception as error:
                    self._connection.execute("ROLLBACK TO job")
                    self._connection.execute("RELEASE job")
                    logger.exception("database write failed")
                    results.append((done, None, error))
            self._connection.commit()
            for done, result, error in results:
                if error is None:
                    done.set_result(result)
                else:
                    done.set_exception(error)

    def _submit(self, work: Callable[[sqlite3.Connection], T]) -> Future[T]:
        done: Future[T] = Future()
        self._jobs.put((work, done))
        return done

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue a write now (writes run in the order they are queued); await the result when it matters."""
        future = asyncio.wrap_future(self._submit(work))
        # The writer logs a failure; a caller that does not wait for the result need not hear of it again.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        return future

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            connection = _connect(self.path)
            try:
                return work(connection)
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def create_conversation(self, record: ConversationRecord) -> None:
        await self._write(lambda db: _insert_conversation(db, record))

    def update_conversation(self, record: ConversationRecord) -> asyncio.Future[Any]:
        record.updated_at = time.time()
        row = (record.title, record.model, record.system_prompt, record.updated_at, record.id)
        return self._write(
            lambda db: db.execute(
                "UPDATE conversations SET title = ?, model = ?, system_prompt = ?, updated_at = ? WHERE id = ?", row
            )
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self._write(
            lambda db: db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0
        )

    async def list_conversations(self) -> list[ConversationRecord]:
        return await self._read(
            lambda db: [
                _conversation(row)
                for row in db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, created_at DESC")
            ]
        )

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None:
        def work(db: sqlite3.Connection) -> tuple[ConversationRecord, list[Message]] | None:
            row = db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if row is None:
                return None
            rows = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
            return _conversation(row), [_message(message) for message in rows]

        return await self._read(work)

    def _upsert(
        self, conversation_id: str, messages: list[Message], delete_ids: list[str] | None = None
    ) -> Callable[[sqlite3.Connection], None]:
        rows = [
            (
                m.id,
                conversation_id,
                m.turn_id,
                m.role,
                m.content,
                m.reasoning,
                m.status,
                m.error,
                json.dumps(m.meta),
                m.created_at,
            )
            for m in messages
        ]

        def work(db: sqlite3.Connection) -> None:
            db.executemany("DELETE FROM messages WHERE id = ?", [(mid,) for mid in delete_ids or []])
            db.executemany(UPSERT_MESSAGE, rows)
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))

        return work

    def open_turn(
        self, conversation_id: str, new: ConversationRecord | None, messages: list[Message], delete_ids: list[str]
    ) -> asyncio.Future[None]:
        """Queue, at once, what a turn starts with: the conversation if it is `new`, the messages it replaces
        deleted, its messages saved. Later writes land after it, so the turn need not wait for it."""
        upsert = self._upsert(conversation_id, messages, delete_ids)

        def work(db: sqlite3.Connection) -> None:
            if new is not None:
                _insert_conversation(db, new)
            upsert(db)

        return self._write(work)

    async def save_messages(self, conversation_id: str, messages: list[Message]) -> None:
        """Insert or update these messages, in order, in one transaction."""
        await self._write(self._upsert(conversation_id, messages))

    def checkpoint(self, conversation_id: str, message: Message) -> None:
        """Queue a save of a reply in progress without waiting for it (a crash then loses little)."""
        self._submit(self._upsert(conversation_id, [message]))
