"""The PostgreSQL writer's one connection, as the write queue (`writes.py`) uses it: made again when it is
lost, probed while idle so that /healthz sees a server that stops answering, bounded in what one
session may cost the others; and which refusals may pass."""

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from pocketchat.store.writes import Database, Job, JobFailed

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds to reach the server; an unreachable one fails a batch, not the writer
COMMAND_TIMEOUT = 10.0  # seconds a statement may take before the batch counts as refused
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


def describe(url: str) -> str:
    """host:port/database of a URL: what may be logged of it (never its user or password)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"
    except ValueError:
        return "(a URL that does not parse)"


class WriteConnection(Database):
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
        return may_pass(error)

    def waits(self, error: BaseException) -> bool:
        return isinstance(error, JOB_REFUSED)

    def lost(self, error: BaseException) -> bool:
        return isinstance(error, LOST) or self.connection is None or self.connection.is_closed()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._connected() as db, db.transaction():
            yield db

    async def together(self, jobs: list[Job]) -> list[Any]:
        results: list[Any] = []
        running: int | None = None  # the job running now, if one is: else it is the connection or commit
        try:
            async with self.transaction() as db:
                for index, job in enumerate(jobs):
                    running = index
                    results.append(await job.work(db))
                    self.answered_at = time.monotonic()
                running = None
        except Exception as error:
            if running is not None:
                raise JobFailed(running, error) from error
            raise
        return results

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
