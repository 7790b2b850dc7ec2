"""Conversations, messages, sign-in sessions and the app's secrets in PostgreSQL, shared by replicas.

The same records, kept the same way as `SqliteStore` keeps them, on asyncpg: writes go through the
write queue (`writes.py`) on one connection of the writer's own, made again when it is lost and probed
while idle so that /healthz sees a server that stops answering; reads go through a small pool, never
through the writer's connection. The schema is versioned (`schema_version`) and brought up to date at
`open()` under an advisory lock, so that replicas starting together migrate it once. The URL may hold a
password: only its host, port and database are ever logged.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg

from pocketchat.errors import Unavailable
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
from pocketchat.store import TOMBSTONE_SECONDS, like_pattern, session_hash
from pocketchat.store.queued import QueuedStore, Row
from pocketchat.store.writes import Database, Job

logger = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[asyncpg.Connection], Awaitable[T]]

POOL_SIZE = 5  # read connections at most
CONNECT_TIMEOUT = 5.0  # seconds to reach the server; an unreachable one fails a batch, not the writer
COMMAND_TIMEOUT = 10.0  # seconds a statement may take before the batch counts as refused
START_TIMEOUT = 300.0  # seconds for start-up statements: waiting for another replica's migration, the sweep
CLOSE_TIMEOUT = 15.0  # seconds close() waits for the writer before it gives up on what is left
READ_TIMEOUT = 3.0  # seconds a read may take; then the user is told the database is unavailable
STALL_SECONDS = 1.0  # a write (or probe) the server has not answered for this long makes /healthz fail
PROBE_SECONDS = 1.0  # an idle writer asks the server this often whether it answers
PROBE_TIMEOUT = 5.0  # seconds a probe may take before the writer's connection is dropped
# What one session may cost the others, in milliseconds, set on every connection of the app. A replica
# frozen inside a transaction (SIGSTOP, a VM pause) keeps its row locks until the server ends its
# session; meanwhile every other replica's one writer would wait behind them. A lock wait or a
# statement past its bound fails that job alone, kept to be written again.
SESSION_BOUNDS = {
    "idle_in_transaction_session_timeout": "3000",
    "lock_timeout": "1000",
    "statement_timeout": "5000",
}
# The key of the advisory lock that serialises migrations (any constant, the same in every replica).
SCHEMA_LOCK = 0x706F636B6574  # "pocket"

# The schema, one step per version; `schema_version` holds a row per step applied. PostgreSQL applies
# DDL in transactions, so a step and its row land together or not at all.
SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)
"""
MIGRATIONS = [
    # The tables and columns of SQLite's schema (its steps 1 and 2). Timestamps are float seconds, as
    # in SQLite, so that records round-trip exactly; meta is the JSON text SQLite keeps (JSONB would
    # reorder its keys). "user" is quoted: unquoted it is PostgreSQL's CURRENT_USER.
    """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    title TEXT,
    model TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    owner TEXT NOT NULL DEFAULT 'local'
);
CREATE INDEX conversations_by_owner ON conversations (owner, updated_at);
CREATE TABLE messages (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    turn_id TEXT,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    error TEXT,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, seq);
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    "user" TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
    # The generated access token is kept as its hash (hex SHA-256, as `token_hash` makes it): a copy of
    # the database signs nobody in.
    """
INSERT INTO secrets (name, value)
    SELECT 'access_token_hash', encode(sha256(convert_to(value, 'UTF8')), 'hex') FROM secrets
    WHERE name = 'access_token'
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
DELETE FROM secrets WHERE name = 'access_token';
""",
    # Deleted conversations, for a day: a replica whose first turn of a conversation started as another
    # deleted it must not store it again (SQLite's step 4).
    """
CREATE TABLE deleted_conversations (id TEXT PRIMARY KEY, deleted_at DOUBLE PRECISION NOT NULL);
""",
    # Documents (SQLite's step 5): files attached to a conversation (deleted with it), their passages
    # with a vector each (float32 bytes), and a full-text index of the passages (a tsvector column the
    # server keeps, with a GIN index).
    """
CREATE TABLE documents (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    size BIGINT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    progress DOUBLE PRECISION NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    embedder TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX documents_by_conversation ON documents (conversation_id, created_at);
CREATE INDEX documents_by_owner ON documents (owner);
CREATE TABLE chunks (
    id BIGSERIAL PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    page INTEGER,
    text TEXT NOT NULL,
    vector BYTEA NOT NULL,
    words TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX chunks_by_document ON chunks (document_id, seq);
CREATE INDEX chunks_words ON chunks USING GIN (words);
""",
    # Images attached to user messages (SQLite's step 6): deleted with their conversation, bytes and all;
    # `message_id` NULL while one waits to go with the next message (no foreign key: an edit writes its
    # message again under the same id).
    """
CREATE TABLE images (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    message_id TEXT,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    size BIGINT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    data BYTEA NOT NULL
);
CREATE INDEX images_by_conversation ON images (conversation_id, created_at);
CREATE INDEX images_by_owner ON images (owner);
""",
    # Tools (SQLite's step 7): the tool sources a conversation turned off, as JSON text (a list of names).
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
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (id) DO UPDATE SET content = excluded.content, reasoning = excluded.reasoning,
    status = excluded.status, error = excluded.error, meta = excluded.meta
WHERE messages.status = 'streaming'
"""

# Refusals that may pass: the database (or the way to it) fails, not the job. The job fails its caller
# with StorageError and is kept to be written again, in order. Anything else (a unique or foreign key
# violation, text PostgreSQL cannot hold) is the job's own failure and takes no other job down.
MAY_PASS: tuple[type[BaseException], ...] = (
    OSError,  # the connection: refused, reset, unreachable
    TimeoutError,  # connect or command timeout
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.InterfaceError,  # "connection is closed" and the like (client-side)
    asyncpg.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
    asyncpg.OperatorInterventionError,  # 57: shutdown, crash, query cancelled
    asyncpg.PostgresSystemError,  # 58: I/O error
    asyncpg.TransactionRollbackError,  # 40: serialization failure, deadlock
    asyncpg.ReadOnlySQLTransactionError,  # 25006: a standby, or a database made read-only
    asyncpg.InsufficientPrivilegeError,  # 42501: write rights revoked (an operator restores them)
    asyncpg.LockNotAvailableError,  # 55P03
)

# Of those, the ones that fail one job and not the database: a lock another session holds too long (a
# frozen replica's), a statement past statement_timeout. The job waits; the other jobs are written.
JOB_REFUSED: tuple[type[BaseException], ...] = (asyncpg.LockNotAvailableError, asyncpg.QueryCanceledError)


# Of those, the ones that say the connection itself is gone or hangs: no other job can be written on it.
LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
)


def _may_pass(error: BaseException) -> bool:
    """Whether `error` is the database refusing for now rather than this job failing for good. asyncpg's
    client-side errors about a job's own arguments are ValueErrors: never worth trying again."""
    return isinstance(error, MAY_PASS) and not isinstance(error, ValueError)


def _unavailable(error: BaseException) -> Unavailable:
    reason = f"it did not answer in {READ_TIMEOUT:g} s" if isinstance(error, TimeoutError) else str(error)
    return Unavailable(f"PocketChat cannot reach its database now ({reason or type(error).__name__}). Try again soon.")


def describe(url: str) -> str:
    """host:port/database of a URL: what may be logged of it (never its user or password)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"
    except ValueError:
        return "(a URL that does not parse)"


def _count(status: str) -> int:
    """The row count of a command status such as 'UPDATE 3' or 'INSERT 0 1'."""
    return int(status.rsplit(" ", 1)[-1])


async def _lock_conversation(db: asyncpg.Connection, conversation_id: str) -> None:
    """Until the transaction ends, be the one writer storing or deleting this conversation: a new
    conversation stored by one replica's writer while another's deletes it is then either deleted or
    never stored, whichever commits first."""
    await db.execute("SELECT pg_advisory_xact_lock(hashtext($1))", "pocketchat conversation " + conversation_id)


async def _insert_conversation(db: asyncpg.Connection, record: ConversationRecord) -> None:
    await _lock_conversation(db, record.id)
    await db.execute(
        # DO NOTHING: with replicas, two may each store a new conversation they both had in memory.
        # Never one that was deleted (a first turn on one replica, a delete on another).
        f"INSERT INTO conversations ({', '.join(CONVERSATION_COLUMNS)})"
        " SELECT $1, $2, $3, $4, $5, $6::double precision, $7::double precision, $8"
        " WHERE NOT EXISTS (SELECT 1 FROM deleted_conversations WHERE id = $1) ON CONFLICT (id) DO NOTHING",
        *record.to_row(),
    )


async def _migrate(db: asyncpg.Connection) -> None:
    """Bring the database's schema up to date. Replicas that start together queue on the advisory lock;
    each one after the first finds the steps applied and applies nothing."""
    async with db.transaction():
        # Waiting for another replica's migration, and migrating, may take longer than any write.
        await db.execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
        # The transaction-scoped lock is released by the commit (or by the server if this process dies).
        await db.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK, timeout=START_TIMEOUT)
        await db.execute(SCHEMA_VERSION_TABLE)
        version = await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
        if version > len(MIGRATIONS):
            logger.warning("database schema version %d is newer than this release's %d", version, len(MIGRATIONS))
        for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
            await db.execute(step, timeout=START_TIMEOUT)
            await db.execute("INSERT INTO schema_version VALUES ($1, $2)", number, time.time())
            logger.info("database schema upgraded to version %d", number)


class _WriteConnection(Database):
    """The writer's one connection: made again when it is lost, dropped at once when it may hang (no
    goodbye to a server that may not answer), and asked while the queue is idle whether the server
    answers (/healthz)."""

    def __init__(self, url: str) -> None:
        self._url = url  # may hold a password: never logged, never in an error message
        self.connection: asyncpg.Connection | None = None
        self.idle_seconds = PROBE_SECONDS

    async def connect(self) -> asyncpg.Connection:
        # The application name shows in pg_stat_activity: an operator sees which connection is which.
        return await asyncpg.connect(
            self._url,
            timeout=CONNECT_TIMEOUT,
            command_timeout=COMMAND_TIMEOUT,
            server_settings={"application_name": "pocketchat-writer", **SESSION_BOUNDS},
        )

    def drop(self) -> None:
        """Forget the connection at once (no goodbye to a server that may not answer)."""
        if self.connection is not None:
            self.connection.terminate()
            self.connection = None

    async def close(self) -> None:
        """Close the connection gracefully (the server logs no unexpected EOF), or at once if that fails."""
        connection, self.connection = self.connection, None
        if connection is not None:
            try:
                await connection.close(timeout=CONNECT_TIMEOUT)  # aborts the connection if it fails
            except Exception as error:
                logger.debug("writer connection closed abruptly: %s", error)

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection, made again if it was lost (the server restarted, a failed batch dropped it).
        What finds it lost, hanging or stuck mid-transaction drops it: a new one next time."""
        if self.connection is None or self.connection.is_closed():
            self.drop()
            self.connection = await self.connect()
        try:
            yield self.connection
        except Exception as error:
            if self.lost(error):
                self.drop()
            raise

    # ---- what the write queue asks of it ---------------------------------------------------------

    def may_pass(self, error: BaseException) -> bool:
        return _may_pass(error)

    def waits(self, error: BaseException) -> bool:
        return isinstance(error, JOB_REFUSED)

    def lost(self, error: BaseException) -> bool:
        return isinstance(error, LOST) or self.connection is None or self.connection.is_closed()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._connected() as db, db.transaction():
            yield db

    async def in_savepoint(self, db: asyncpg.Connection, job: Job) -> Any:
        async with db.transaction():  # nested: a savepoint
            return await job.work(db)

    async def alone(self, job: Job) -> Any:
        async with self.transaction() as db:
            return await job.work(db)

    def renew(self) -> None:
        # A new session next time: the refusal may be this one's (a read-only default taken at connect,
        # a server that has since become a standby behind the same address).
        self.drop()

    async def idle(self) -> None:
        """Ask the server whether it answers, on the writer's connection (the way writes go)."""
        try:
            async with self._connected() as db:
                await db.execute("SELECT 1", timeout=PROBE_TIMEOUT)
        except Exception:
            self.drop()  # may hang or be broken: a new one next time
            raise

    def abort(self) -> None:
        self.drop()  # whatever the writer waits on fails at once


class PostgresStore(QueuedStore[_WriteConnection]):
    """The store in PostgreSQL: shared by every replica that names the same database."""

    def __init__(self, url: str) -> None:
        super().__init__(_WriteConnection(url), logger)
        self._url = url  # may hold a password: never logged, never in an error message
        self.where = describe(url)
        self._pool: asyncpg.Pool | None = None  # for reads

    # ---- open and close --------------------------------------------------------------------------

    async def open(self, sweep_streaming: bool = True) -> int:
        """Bring the schema up to date, start the writer, and (with `sweep_streaming`: no other replica
        can be writing one) mark replies a crash cut short as interrupted; return how many."""
        connection = await self._database.connect()
        try:
            await _migrate(connection)
            interrupted = await self._sweep(connection) if sweep_streaming else 0
            forgotten = "DELETE FROM deleted_conversations WHERE deleted_at < $1"
            await connection.execute(forgotten, time.time() - TOMBSTONE_SECONDS, timeout=START_TIMEOUT)
            self._pool = await asyncpg.create_pool(
                self._url,
                min_size=1,
                max_size=POOL_SIZE,
                timeout=CONNECT_TIMEOUT,
                command_timeout=COMMAND_TIMEOUT,
                server_settings={"application_name": "pocketchat-reader", **SESSION_BOUNDS},
            )
        except BaseException:
            connection.terminate()
            raise
        self._database.connection = connection
        self._start_writing()
        logger.info("database: PostgreSQL at %s", self.where)
        return interrupted

    @staticmethod
    async def _sweep(db: asyncpg.Connection) -> int:
        sweep = "UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'"
        async with db.transaction():
            await db.execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")  # a big table takes long
            return _count(await db.execute(sweep, timeout=START_TIMEOUT))

    @property
    def failure(self) -> str | None:
        """Why writes fail now: the last batch was refused, the server did not answer the last probe, or
        the write in flight has waited for it over STALL_SECONDS (a stall, a lock held by a frozen replica)."""
        if self.waiting_since is not None and (waited := time.monotonic() - self.waiting_since) > STALL_SECONDS:
            return f"the database has not answered for {waited:.0f} s"
        return super().failure

    async def close(self) -> None:
        """Finish the queued writes (and try the unwritten ones once more), then close. Bounded in time:
        a server that does not answer costs CLOSE_TIMEOUT at most, and what is left is reported. Closing
        again does nothing."""
        if self._closing:
            return
        await self._stop_writing(CLOSE_TIMEOUT)
        await self._database.close()
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), CONNECT_TIMEOUT)
            except Exception:
                self._pool.terminate()  # it could not close gracefully in time

    # ---- reads ------------------------------------------------------------------------------------

    async def _read(self, work: Work[T]) -> T:
        """Run a read on a pooled connection, in READ_TIMEOUT at most: a server that does not answer (or a
        lost one) is `Unavailable`, said at once, not a socket that hangs or closes."""
        if self._pool is None:
            raise RuntimeError("the store is not open")
        try:
            db = await self._pool.acquire(timeout=READ_TIMEOUT)
        except Exception as error:
            if _may_pass(error):
                raise _unavailable(error) from None
            raise
        timed_out = False

        def time_out() -> None:
            # The connection is closed under the read, which then fails at once: cancelling the read
            # instead would wait for a rollback that a server which does not answer never answers.
            nonlocal timed_out
            timed_out = True
            db.terminate()

        timer = asyncio.get_running_loop().call_later(READ_TIMEOUT, time_out)
        try:
            return await work(db)
        except Exception as error:
            if not _may_pass(error):
                raise
            raise _unavailable(TimeoutError() if timed_out else error) from None
        finally:
            timer.cancel()
            await self._pool.release(db)

    async def list_conversations(self, owner: str) -> list[ConversationRecord]:
        query = "SELECT * FROM conversations WHERE owner = $1 ORDER BY updated_at DESC, created_at DESC"
        rows = await self._read(lambda db: db.fetch(query, owner))
        return [ConversationRecord.from_row(row) for row in rows]

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None:
        async def work(db: asyncpg.Connection) -> tuple[ConversationRecord, list[Message]] | None:
            # One snapshot: the messages are those of the conversation as read, not of a later write.
            async with db.transaction(isolation="repeatable_read", readonly=True):
                row = await db.fetchrow("SELECT * FROM conversations WHERE id = $1", conversation_id)
                if row is None:
                    return None
                query = "SELECT * FROM messages WHERE conversation_id = $1 ORDER BY seq"
                messages = [Message.from_row(message) for message in await db.fetch(query, conversation_id)]
                query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = $1 AND message_id IS NOT NULL"
                images = await db.fetch(query + " ORDER BY created_at, id", conversation_id)
                return ConversationRecord.from_row(row), with_images(messages, map(ImageRecord.from_row, images))

        return await self._read(work)

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages that hold every one of `terms` (ILIKE: case-insensitive), leaving
        out those of the turn `leave_out_turn`."""
        likes = " AND ".join(f"m.content ILIKE ${number} ESCAPE '\\'" for number in range(4, 4 + len(terms)))
        query = (
            "SELECT m.conversation_id, c.title, m.role, m.content, m.created_at FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id"
            " WHERE c.owner = $1 AND m.turn_id IS DISTINCT FROM $2"
            f" {'AND ' + likes if likes else ''} ORDER BY m.created_at DESC LIMIT $3"
        )
        args = (owner, leave_out_turn, most, *(like_pattern(term) for term in terms))
        rows = await self._read(lambda db: db.fetch(query, *args))
        return [MessageHit(*row) for row in rows]

    async def read_secret(self, name: str) -> str | None:
        return await self._read(lambda db: db.fetchval("SELECT value FROM secrets WHERE name = $1", name))

    async def session_user(self, session_id: str) -> str | None:
        """The user of a session that is neither revoked nor expired."""
        query = 'SELECT "user" FROM sessions WHERE id_hash = $1 AND revoked_at IS NULL AND expires_at > $2'
        return await self._read(lambda db: db.fetchval(query, session_hash(session_id), time.time()))

    async def dead_sessions(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions are revoked, expired or unknown (a socket on one must close)."""
        hashes = {session_hash(session_id): session_id for session_id in session_ids}
        query = (
            "SELECT id_hash FROM sessions WHERE revoked_at IS NULL AND expires_at > $1 AND id_hash = ANY($2::text[])"
        )
        rows = await self._read(lambda db: db.fetch(query, time.time(), list(hashes)))
        live = {row["id_hash"] for row in rows}
        return {session_id for digest, session_id in hashes.items() if digest not in live}

    # ---- the statements of the writes (queued.py) --------------------------------------------------

    def _insert(self, record: ConversationRecord) -> Work[None]:
        return lambda db: _insert_conversation(db, record)

    def _update(self, record: ConversationRecord, names: list[str]) -> Work[str]:
        assignments = ", ".join(f"{name} = ${number}" for number, name in enumerate(names, start=3))
        query = f"UPDATE conversations SET updated_at = $2{', ' if names else ''}{assignments} WHERE id = $1"
        row = (record.id, record.updated_at, *(record.column(name) for name in names))
        return lambda db: db.execute(query, *row)

    def _name(self, record: ConversationRecord) -> Work[str]:
        query = "UPDATE conversations SET title = $1, updated_at = $2 WHERE id = $3 AND title IS NULL"
        row = (record.title, record.updated_at, record.id)
        return lambda db: db.execute(query, *row)

    def _delete(self, conversation_id: str) -> Work[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            await _lock_conversation(db, conversation_id)
            tombstone = "INSERT INTO deleted_conversations VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"
            await db.execute(tombstone, conversation_id, time.time())
            return _count(await db.execute("DELETE FROM conversations WHERE id = $1", conversation_id)) > 0

        return work

    def _save(
        self, conversation_id: str, rows: list[Row], delete_ids: Sequence[str], new: ConversationRecord | None
    ) -> Work[None]:
        async def work(db: asyncpg.Connection) -> None:
            if new is not None:
                await _insert_conversation(db, new)
            if delete_ids:
                await db.execute("DELETE FROM messages WHERE id = ANY($1::text[])", delete_ids)
            if rows:
                await db.executemany(UPSERT_MESSAGE, rows)
            await db.execute("UPDATE conversations SET updated_at = $1 WHERE id = $2", time.time(), conversation_id)

        return work

    def _interrupt(self, message: Message) -> Work[str]:
        query = (
            "UPDATE messages SET content = $1, reasoning = $2, status = 'interrupted', error = $3"
            " WHERE id = $4 AND status = 'streaming'"
        )
        row = (message.content, message.reasoning, message.error, message.id)
        return lambda db: db.execute(query, *row)

    def _keep_secret(self, name: str, value: str) -> Work[str]:
        # Two replicas that ask at once get the same one: the second insert waits for the first to commit,
        # then does nothing.
        async def work(db: asyncpg.Connection) -> str:
            insert = "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
            await db.execute(insert, name, value)
            return await db.fetchval("SELECT value FROM secrets WHERE name = $1", name)

        return work

    def _replace_secret(self, name: str, value: str) -> Work[str]:
        query = "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2"
        return lambda db: db.execute(query, name, value)

    def _add_session(self, row: tuple[str, str, float, float]) -> Work[str]:
        query = 'INSERT INTO sessions (id_hash, "user", created_at, expires_at) VALUES ($1, $2, $3, $4)'
        return lambda db: db.execute(query, *row)

    def _revoke(self, id_hash: str | None) -> Work[int]:
        query = "UPDATE sessions SET revoked_at = $1 WHERE revoked_at IS NULL"
        args: tuple[Any, ...] = (time.time(),)
        if id_hash:
            query, args = query + " AND id_hash = $2", (*args, id_hash)

        async def work(db: asyncpg.Connection) -> int:
            return _count(await db.execute(query, *args))

        return work

    # ---- documents -------------------------------------------------------------------------------

    def add_document(self, document: DocumentRecord) -> asyncio.Future[Any]:
        marks = ", ".join(f"${number}" for number in range(1, len(DocumentRecord.FIELDS) + 1))
        query = f"INSERT INTO documents ({', '.join(DocumentRecord.FIELDS)}) VALUES ({marks})"
        row = document.to_row()
        return self._write(lambda db: db.execute(query, *row), document.conversation_id, retry=False)

    def document_progress(self, document: DocumentRecord) -> asyncio.Future[Any]:
        """Write how far its indexing went (and that it goes on: `updated_at`)."""
        query = "UPDATE documents SET progress = $1, updated_at = $2 WHERE id = $3 AND status = 'indexing'"
        row = (document.progress, time.time(), document.id)
        return self._write(lambda db: db.execute(query, *row), document.conversation_id, retry=False)

    def add_chunks(
        self, document: DocumentRecord, rows: list[tuple[int, int | None, str, bytes]]
    ) -> asyncio.Future[Any]:
        """Store passages (seq, page, text, vector) of a document being indexed; retrieval ignores them
        until `finish_document` marks it ready."""
        query = (
            "INSERT INTO chunks (document_id, conversation_id, seq, page, text, vector) VALUES ($1, $2, $3, $4, $5, $6)"
        )
        values = [(document.id, document.conversation_id, *row) for row in rows]

        async def work(db: asyncpg.Connection) -> None:
            await db.executemany(query, values)
            await db.execute("UPDATE documents SET updated_at = $1 WHERE id = $2", time.time(), document.id)

        return self._write(work, document.conversation_id, retry=False)

    def finish_document(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Mark it ready, or failed (its passages deleted), if it is still indexing; whether it was."""
        query = "UPDATE documents SET status = $1, error = $2, progress = $3, chunks = $4, updated_at = $5"
        query += " WHERE id = $6 AND status = 'indexing'"
        row = (document.status, document.error, document.progress, document.chunks, time.time(), document.id)

        async def work(db: asyncpg.Connection) -> bool:
            if document.status == "failed":
                await db.execute("DELETE FROM chunks WHERE document_id = $1", document.id)
            return _count(await db.execute(query, *row)) > 0

        return self._write(work, document.conversation_id, retry=False)

    def delete_document(self, conversation_id: str, document_id: str) -> asyncio.Future[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            query = "DELETE FROM documents WHERE id = $1 AND conversation_id = $2"
            return _count(await db.execute(query, document_id, conversation_id)) > 0

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
        # Only waiting ones (or the message's own, written again by an edit): never another message's.
        query = (
            "UPDATE images SET message_id = $1 WHERE conversation_id = $2 AND id = ANY($3::text[])"
            " AND (message_id IS NULL OR message_id = $1)"
        )
        return self._write(lambda db: db.execute(query, message_id, conversation_id, image_ids), conversation_id)

    def delete_image(self, conversation_id: str, image_id: str) -> asyncio.Future[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            query = "DELETE FROM images WHERE id = $1 AND conversation_id = $2 AND message_id IS NULL"
            return _count(await db.execute(query, image_id, conversation_id)) > 0

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
