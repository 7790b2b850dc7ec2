"""Conversations, messages, sign-in sessions and the app's secrets in PostgreSQL, shared by replicas.

The same records, kept the same way as `SqliteStore` keeps them, on asyncpg: one writer task owns one
connection and writes the queued jobs in order, a group at a time in one transaction with a savepoint
per job (one job at a time when the database refuses the group, so that a refused write holds up only
its own conversation); reads go through a small pool, never through the writer's connection. The schema is versioned
(`schema_version`) and brought up to date at `open()` under an advisory lock, so that replicas starting
together migrate it once. The URL may hold a password: only its host, port and database are ever logged.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg

from pocketchat.errors import StorageError, Unavailable
from pocketchat.records import RECORD_FIELDS, ConversationRecord, DocumentRecord, Message, Passage
from pocketchat.store.sqlite import MAX_UNWRITTEN, RETRY_SECONDS, session_hash

logger = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[asyncpg.Connection], Awaitable[T]]

BATCH_SIZE = 100  # jobs committed together at most
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
]
TOMBSTONE_SECONDS = 24 * 3600  # how long a deleted conversation's id is remembered

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


def may_pass(error: BaseException) -> bool:
    """Whether `error` is the database refusing for now rather than this job failing for good. asyncpg's
    client-side errors about a job's own arguments are ValueErrors: never worth trying again."""
    return isinstance(error, MAY_PASS) and not isinstance(error, ValueError)


def _refusal(error: BaseException) -> StorageError:
    refusal = StorageError(f"The database could not save this ({str(error) or type(error).__name__}).")
    refusal.__cause__ = error
    return refusal


def _unavailable(error: BaseException) -> Unavailable:
    reason = f"it did not answer in {READ_TIMEOUT:g} s" if isinstance(error, TimeoutError) else str(error)
    return Unavailable(f"PocketChat cannot reach its database now ({reason or type(error).__name__}). Try again soon.")


def _reason(error: StorageError) -> str:
    cause = error.__cause__
    return (str(cause) or type(cause).__name__) if cause is not None else str(error)


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
        "INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at)"
        " SELECT $1, $2, $3, $4, $5, $6::double precision, $7::double precision"
        " WHERE NOT EXISTS (SELECT 1 FROM deleted_conversations WHERE id = $1) ON CONFLICT (id) DO NOTHING",
        record.id,
        record.owner,
        record.title,
        record.model,
        record.system_prompt,
        record.created_at,
        record.updated_at,
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


async def _nothing(db: asyncpg.Connection) -> None:
    """The job of a retry tick: the batch is only the writes waiting to be written again."""


class _Probe:
    """What an idle writer's queue yields every PROBE_SECONDS: ask the server whether it answers."""


PROBE = _Probe()


@dataclass
class Job:
    """One queued write. `retry`: if the database refuses it for a reason that may pass, keep it and
    write it again later; its caller has been told already."""

    work: Work[Any]
    done: asyncio.Future[Any] | None
    conversation_id: str | None = None
    retry: bool = True


class PostgresStore:
    """The store in PostgreSQL: shared by every replica that names the same database."""

    def __init__(self, url: str) -> None:
        self._url = url  # may hold a password: never logged, never in an error message
        self.where = describe(url)
        self._jobs: asyncio.Queue[Job | None] = asyncio.Queue()
        # Writes the database refused for a reason that may pass, in order; retried before new ones.
        self._unwritten: list[Job] = []
        self._batch: list[Job] = []  # the jobs being written now (the unwritten ones first)
        self._connection: asyncpg.Connection | None = None  # the writer's, and only the writer's
        self._pool: asyncpg.Pool | None = None  # for reads
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._refused: str | None = None  # why the last write failed, while writes fail
        self._locked: dict[str | None, str] = {}  # conversations whose kept writes wait on a lock, and why
        self._unanswered: str | None = None  # why the last probe failed, until the server answers again
        self._waiting_since: float | None = None  # when the write (or probe) in flight left
        self._lost: BaseException | None = None  # why the server could not be reached, at the last try
        # Told (on the event loop) of a conversation whose kept writes have all landed.
        self.on_written: Callable[[str], None] | None = None
        self.timing: Callable[[float], None] | None = None

    # ---- open and close --------------------------------------------------------------------------

    async def open(self, sweep_streaming: bool = True) -> int:
        """Bring the schema up to date, start the writer, and (with `sweep_streaming`: no other replica
        can be writing one) mark replies a crash cut short as interrupted; return how many."""
        connection = await self._connect("writer")
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
        self._connection = connection
        self._writer = asyncio.create_task(self._write_loop(), name="postgres-writer")
        logger.info("database: PostgreSQL at %s", self.where)
        return interrupted

    async def _connect(self, role: str) -> asyncpg.Connection:
        # The application name shows in pg_stat_activity: an operator sees which connection is which.
        return await asyncpg.connect(
            self._url,
            timeout=CONNECT_TIMEOUT,
            command_timeout=COMMAND_TIMEOUT,
            server_settings={"application_name": f"pocketchat-{role}", **SESSION_BOUNDS},
        )

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
        if self._waiting_since is not None and (waited := time.monotonic() - self._waiting_since) > STALL_SECONDS:
            return f"the database has not answered for {waited:.0f} s"
        return self._refused or self._unanswered

    async def close(self) -> None:
        """Finish the queued writes (and try the unwritten ones once more), then close. Bounded in time:
        a server that does not answer costs CLOSE_TIMEOUT at most, and what is left is reported. Closing
        again does nothing."""
        if self._closing:
            return
        self._closing = True
        if self._writer is not None:
            self._jobs.put_nowait(None)
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), CLOSE_TIMEOUT)
            except TimeoutError:
                self._drop_connection()  # whatever the writer waits on fails at once
                self._writer.cancel()
                await asyncio.gather(self._writer, return_exceptions=True)
                self._abandon()
        await self._say_goodbye()

    async def _say_goodbye(self) -> None:
        """Close the connections gracefully (the server logs no unexpected EOF), or at once if that hangs."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close(timeout=CONNECT_TIMEOUT)  # aborts the connection if it fails
            except Exception as error:
                logger.debug("writer connection closed abruptly: %s", error)
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), CONNECT_TIMEOUT)
            except Exception:
                self._pool.terminate()  # it could not close gracefully in time

    def _abandon(self) -> None:
        """The writer was given up on: tell every caller still waiting, and count what is lost."""
        batch = {id(job) for job in self._batch}
        left = [*self._batch, *(job for job in self._unwritten if id(job) not in batch)]
        while not self._jobs.empty():
            if (job := self._jobs.get_nowait()) is not None:
                left.append(job)
        for job in left:
            self._settle(job, None, StorageError("The database could not save this before shutdown."))
        lost = sum(1 for job in left if job.retry)
        logger.error("%d writes could not be saved before shutdown", lost)

    def _drop_connection(self) -> None:
        """Forget the writer's connection at once (no goodbye to a server that may not answer)."""
        if self._connection is not None:
            self._connection.terminate()
            self._connection = None

    # ---- the writer ------------------------------------------------------------------------------

    def unwritten(self, conversation_id: str) -> bool:
        """Whether writes of this conversation wait for the database to recover."""
        return any(job.conversation_id == conversation_id for job in self._unwritten)

    async def _write_loop(self) -> None:
        while True:
            job = await self._next_job()
            if job is None:
                await self._finish()
                return
            if isinstance(job, _Probe):
                await self._probe()
            else:
                await self._write_batch(self._gather(job))

    async def _next_job(self) -> Job | _Probe | None:
        try:
            # While writes wait for the database to recover, try them again every few seconds; while
            # there is nothing to write, ask the server every second whether it answers (/healthz).
            return await asyncio.wait_for(self._jobs.get(), RETRY_SECONDS if self._unwritten else PROBE_SECONDS)
        except TimeoutError:
            return Job(_nothing, None, retry=False) if self._unwritten else PROBE

    async def _probe(self) -> None:
        """Ask the server whether it answers, on the writer's connection (the way writes go)."""
        if self._closing:
            return
        self._waiting_since = time.monotonic()
        try:
            db = await self._writer_connection()
            await db.execute("SELECT 1", timeout=PROBE_TIMEOUT)
        except Exception as error:
            self._drop_connection()  # may hang or be broken: a new one next time
            if self._unanswered is None:
                logger.error("the database does not answer: %s", str(error) or type(error).__name__)
            self._unanswered = str(error) or type(error).__name__
        else:
            self._unanswered = None
        finally:
            self._waiting_since = None

    def _gather(self, first: Job) -> list[Job]:
        """Group commit: the jobs queued meanwhile share one transaction, each in its own savepoint."""
        batch = [first]
        while len(batch) < BATCH_SIZE and not self._jobs.empty():
            if (more := self._jobs.get_nowait()) is None:
                self._jobs.put_nowait(None)  # the shutdown mark stays last
                break
            batch.append(more)
        return batch

    async def _finish(self) -> None:
        if self._unwritten:
            self._lost = None  # once more, even if the server was out of reach at the last try
            await self._write_batch([])
            if self._unwritten:
                logger.error("%d writes could not be saved before shutdown", len(self._unwritten))

    async def _write_batch(self, batch: list[Job]) -> None:
        # The kept writes go first. `_unwritten` stays as it is until this attempt ends: the hub asks it.
        # Those that wait on a lock (JOB_REFUSED) wait for the retry tick, unless a new job of their
        # conversation must land after them: a lock held by a frozen replica costs each batch a
        # lock_timeout otherwise.
        tick = any(job.work is _nothing for job in batch)
        set_aside = set() if tick else self._locked.keys() - {job.conversation_id for job in batch}
        skipped = [job for job in self._unwritten if job.conversation_id in set_aside]
        retried = [job for job in self._unwritten if job.conversation_id not in set_aside]
        self._batch = jobs = [*retried, *batch]
        started = time.perf_counter()
        self._waiting_since = time.monotonic()
        try:
            results = await self._attempt(jobs)
        finally:
            self._batch = []
            self._waiting_since = None
        if self.timing is not None:
            self.timing(time.perf_counter() - started)
        kept = [*skipped, *(job for job, _, error in results if isinstance(error, StorageError) and job.retry)]
        refused = [_reason(error) for _, _, error in results if isinstance(error, StorageError)]
        self._locked = {job.conversation_id: self._locked[job.conversation_id] for job in skipped}
        self._locked |= {
            job.conversation_id: _reason(error)
            for job, _, error in results
            if isinstance(error, StorageError) and isinstance(error.__cause__, JOB_REFUSED) and job.conversation_id
        }
        self._refused = refused[0] if refused else next(iter(self._locked.values()), None)
        if refused:
            logger.error("database writes failed (%d kept to write again): %s", len(kept), self._refused)
        if len(refused) < len(results):
            self._unanswered = None  # it answered
        waiting = {job.conversation_id for job in self._unwritten}
        self._unwritten = kept[-MAX_UNWRITTEN:]
        for job, result, error in results:
            self._settle(job, result, error)
        for conversation_id in waiting - {job.conversation_id for job in self._unwritten}:
            if conversation_id is not None and self.on_written is not None:
                asyncio.get_running_loop().call_soon(self.on_written, conversation_id)

    async def _attempt(self, jobs: list[Job]) -> list[tuple[Job, Any, Exception | None]]:
        """Write `jobs`: together if the database takes them, else each alone; what it refuses fails with
        StorageError. Without a connection, every job is refused without a try."""
        if self._closing and self._lost is not None:
            # Shutting down, and the server was out of reach at the last try: not waited on once per
            # batch. The writes are kept, and tried once more at the end.
            return [(job, None, _refusal(self._lost)) for job in jobs]
        try:
            db = await self._writer_connection()
        except Exception as error:
            return self._unreachable(jobs, error)
        try:
            results = await self._in_one_transaction(db, jobs)
        except Exception as error:
            if self._gone(error):
                return self._unreachable(jobs, error)
            self._lost = None
            results = await self._one_by_one(db, jobs)  # the database refused the group: which ones does it take?
            if any(isinstance(error, StorageError) for _, _, error in results):
                # A new session next time: the refusal may be this one's (a read-only default taken at
                # connect, a server that has since become a standby behind the same address).
                self._drop_connection()
            return results
        self._lost = None
        return results

    def _unreachable(self, jobs: list[Job], error: BaseException) -> list[tuple[Job, Any, Exception | None]]:
        """The server is out of reach (or hangs): every job is refused."""
        self._drop_connection()  # may be broken, or stuck mid-transaction: a new one next time
        self._lost = error
        return [(job, None, _refusal(error)) for job in jobs]

    def _gone(self, error: BaseException) -> bool:
        """Whether the writer's connection is lost (or hangs) rather than refusing one write."""
        return isinstance(error, LOST) or self._connection is None or self._connection.is_closed()

    async def _in_one_transaction(
        self, db: asyncpg.Connection, jobs: list[Job]
    ) -> list[tuple[Job, Any, Exception | None]]:
        """Group commit: one transaction, a savepoint per job, so that a job that fails on its own (a
        constraint) fails alone. A refusal of the database itself (full, read-only, lost) fails them all."""
        results: list[tuple[Job, Any, Exception | None]] = []
        held: dict[str, BaseException] = {}  # conversation: why a write of it was refused (JOB_REFUSED)
        async with db.transaction():
            for job in jobs:
                if job.conversation_id in held:  # its conversation's writes stay in order, behind it
                    results.append((job, None, _refusal(held[job.conversation_id or ""])))
                    continue
                try:
                    async with db.transaction():  # nested: a savepoint
                        result = await job.work(db)
                except JOB_REFUSED as error:
                    # Rolled back to its savepoint: this job waits (kept), the others go on.
                    if job.conversation_id is not None:
                        held[job.conversation_id] = error
                    results.append((job, None, _refusal(error)))
                except Exception as error:
                    if may_pass(error):
                        raise
                    logger.error("database write failed: %s", error)
                    results.append((job, None, error))
                else:
                    results.append((job, result, None))
        return results

    async def _one_by_one(self, db: asyncpg.Connection, jobs: list[Job]) -> list[tuple[Job, Any, Exception | None]]:
        """Each job in its own transaction, in order. A refused job holds up the later jobs of its own
        conversation only (they stay behind it, in order): one write the database will not take does not
        stop every other conversation's. A lost connection refuses the rest untried."""
        results: list[tuple[Job, Any, Exception | None]] = []
        held: dict[str, BaseException] = {}  # conversation: why its first write was refused
        lost: BaseException | None = None
        for job in jobs:
            if lost is not None or job.conversation_id in held:
                # Behind a refused write of its conversation, for the same reason.
                results.append((job, None, _refusal(lost or held[job.conversation_id or ""])))
                continue
            try:
                async with db.transaction():
                    result = await job.work(db)
            except Exception as error:
                if not may_pass(error):
                    logger.error("database write failed: %s", error)
                    results.append((job, None, error))
                    continue
                if self._gone(error):
                    self._drop_connection()
                    lost = self._lost = error
                elif job.conversation_id is not None:
                    held[job.conversation_id] = error
                results.append((job, None, _refusal(error)))
            else:
                results.append((job, result, None))
        return results

    async def _writer_connection(self) -> asyncpg.Connection:
        if self._connection is None or self._connection.is_closed():
            # Lost (the server restarted, a failed batch dropped it): a new one, or the batch fails.
            self._drop_connection()
            self._connection = await self._connect("writer")
        return self._connection

    @staticmethod
    def _settle(job: Job, result: Any, error: Exception | None) -> None:
        if job.done is None or job.done.done():
            return  # a write retried after its caller was told it failed (or a caller that gave up)
        if error is None:
            job.done.set_result(result)
        else:
            job.done.set_exception(error)

    def _write(self, work: Work[T], conversation_id: str | None, retry: bool = True) -> asyncio.Future[T]:
        """Queue a write now (writes run in the order they are queued); await the result when it matters."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait(Job(work, done, conversation_id, retry))
        # The writer logs a failure; a caller that does not wait for the result need not hear of it again.
        done.add_done_callback(lambda future: future.cancelled() or future.exception())
        return done

    async def _read(self, work: Work[T]) -> T:
        """Run a read on a pooled connection, in READ_TIMEOUT at most: a server that does not answer (or a
        lost one) is `Unavailable`, said at once, not a socket that hangs or closes."""
        if self._pool is None:
            raise RuntimeError("the store is not open")
        try:
            db = await self._pool.acquire(timeout=READ_TIMEOUT)
        except Exception as error:
            if may_pass(error):
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
            if not may_pass(error):
                raise
            raise _unavailable(TimeoutError() if timed_out else error) from None
        finally:
            timer.cancel()
            await self._pool.release(db)

    # ---- conversations and messages --------------------------------------------------------------

    async def create_conversation(self, record: ConversationRecord) -> None:
        await self._write(lambda db: _insert_conversation(db, record), record.id)

    def update_conversation(
        self, record: ConversationRecord, fields: Collection[str] = RECORD_FIELDS
    ) -> asyncio.Future[Any]:
        record.updated_at = time.time()
        names = [name for name in RECORD_FIELDS if name in fields]  # named here, never by the caller
        assignments = ", ".join(f"{name} = ${number}" for number, name in enumerate(names, start=3))
        query = f"UPDATE conversations SET updated_at = $2{', ' if names else ''}{assignments} WHERE id = $1"
        row = (record.id, record.updated_at, *(getattr(record, name) for name in names))
        return self._write(lambda db: db.execute(query, *row), record.id)

    def name_conversation(self, record: ConversationRecord) -> asyncio.Future[Any]:
        record.updated_at = time.time()
        query = "UPDATE conversations SET title = $1, updated_at = $2 WHERE id = $3 AND title IS NULL"
        row = (record.title, record.updated_at, record.id)
        return self._write(lambda db: db.execute(query, *row), record.id)

    async def delete_conversation(self, conversation_id: str) -> bool:
        async def work(db: asyncpg.Connection) -> bool:
            await _lock_conversation(db, conversation_id)
            tombstone = "INSERT INTO deleted_conversations VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"
            await db.execute(tombstone, conversation_id, time.time())
            return _count(await db.execute("DELETE FROM conversations WHERE id = $1", conversation_id)) > 0

        # Not written again later: the caller tells the user it failed, and the conversation stays.
        return await self._write(work, conversation_id, retry=False)

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
                return ConversationRecord.from_row(row), [
                    Message.from_row(message) for message in await db.fetch(query, conversation_id)
                ]

        return await self._read(work)

    @staticmethod
    def _upsert(conversation_id: str, messages: list[Message], delete_ids: list[str] | None = None) -> Work[None]:
        # The rows are taken now, as queued: a reply goes on changing after its checkpoint is queued.
        rows = [m.to_row(conversation_id) for m in messages]

        async def work(db: asyncpg.Connection) -> None:
            if delete_ids:
                await db.execute("DELETE FROM messages WHERE id = ANY($1::text[])", delete_ids)
            if rows:
                await db.executemany(UPSERT_MESSAGE, rows)
            await db.execute("UPDATE conversations SET updated_at = $1 WHERE id = $2", time.time(), conversation_id)

        return work

    def open_turn(
        self, conversation_id: str, new: ConversationRecord | None, messages: list[Message], delete_ids: list[str]
    ) -> asyncio.Future[None]:
        """Queue, at once, what a turn starts with: the conversation if it is `new`, the messages it replaces
        deleted, its messages saved. Later writes land after it, so the turn need not wait for it."""
        upsert = self._upsert(conversation_id, messages, delete_ids)

        async def work(db: asyncpg.Connection) -> None:
            if new is not None:
                await _insert_conversation(db, new)
            await upsert(db)

        return self._write(work, conversation_id)

    async def save_messages(self, conversation_id: str, messages: list[Message]) -> None:
        """Insert or update these messages, in order, in one transaction."""
        await self._write(self._upsert(conversation_id, messages), conversation_id)

    async def save_interrupted(self, conversation_id: str, message: Message) -> None:
        """Store a reply whose replica died as interrupted, unless its replica stored it since."""
        query = (
            "UPDATE messages SET content = $1, reasoning = $2, status = 'interrupted', error = $3"
            " WHERE id = $4 AND status = 'streaming'"
        )
        row = (message.content, message.reasoning, message.error, message.id)
        await self._write(lambda db: db.execute(query, *row), conversation_id)

    def checkpoint(self, conversation_id: str, message: Message) -> None:
        """Queue a save of a reply in progress without waiting for it (a crash then loses little)."""
        self._jobs.put_nowait(Job(self._upsert(conversation_id, [message]), None, conversation_id))

    # ---- sign-in ---------------------------------------------------------------------------------

    async def secret(self, name: str, make: Callable[[], str]) -> str:
        """The secret `name`, made by `make()` and kept the first time it is asked for. Two replicas that
        ask at once get the same one: the second insert waits for the first to commit, then does nothing."""
        value = make()

        async def work(db: asyncpg.Connection) -> str:
            insert = "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
            await db.execute(insert, name, value)
            return await db.fetchval("SELECT value FROM secrets WHERE name = $1", name)

        return await self._write(work, None, retry=False)

    async def set_secret(self, name: str, value: str) -> None:
        """Replace the secret `name` (or keep it, the first time)."""
        query = "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2"
        await self._write(lambda db: db.execute(query, name, value), None, retry=False)

    async def read_secret(self, name: str) -> str | None:
        return await self._read(lambda db: db.fetchval("SELECT value FROM secrets WHERE name = $1", name))

    async def create_session(self, session_id: str, user: str, lifetime: float) -> None:
        now = time.time()
        row = (session_hash(session_id), user, now, now + lifetime)
        query = 'INSERT INTO sessions (id_hash, "user", created_at, expires_at) VALUES ($1, $2, $3, $4)'
        await self._write(lambda db: db.execute(query, *row), None, retry=False)

    async def session_user(self, session_id: str) -> str | None:
        """The user of a session that is neither revoked nor expired."""
        query = 'SELECT "user" FROM sessions WHERE id_hash = $1 AND revoked_at IS NULL AND expires_at > $2'
        return await self._read(lambda db: db.fetchval(query, session_hash(session_id), time.time()))

    async def revoke_sessions(self, session_id: str | None = None) -> int:
        """Revoke one session, or every one; how many were live."""
        query = "UPDATE sessions SET revoked_at = $1 WHERE revoked_at IS NULL"
        args: tuple[Any, ...] = (time.time(),)
        if session_id:
            query, args = query + " AND id_hash = $2", (*args, session_hash(session_id))

        async def work(db: asyncpg.Connection) -> int:
            return _count(await db.execute(query, *args))

        return await self._write(work, None, retry=False)

    async def dead_sessions(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions are revoked, expired or unknown (a socket on one must close)."""
        hashes = {session_hash(session_id): session_id for session_id in session_ids}
        query = (
            "SELECT id_hash FROM sessions WHERE revoked_at IS NULL AND expires_at > $1 AND id_hash = ANY($2::text[])"
        )
        rows = await self._read(lambda db: db.fetch(query, time.time(), list(hashes)))
        live = {row["id_hash"] for row in rows}
        return {session_id for digest, session_id in hashes.items() if digest not in live}

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
