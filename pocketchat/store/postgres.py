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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from pocketchat.errors import Unavailable
from pocketchat.hashes import session_hash
from pocketchat.records import (
    CONVERSATION_COLUMNS,
    ConversationRecord,
    ImageRecord,
    Message,
    with_images,
)
from pocketchat.store import TOMBSTONE_SECONDS
from pocketchat.store.postgres_attachments import IMAGE_COLUMNS, PostgresAttachments, rows_changed
from pocketchat.store.postgres_connection import (
    COMMAND_TIMEOUT,
    CONNECT_TIMEOUT,
    SESSION_BOUNDS,
    WriteConnection,
    describe,
    may_pass,
)
from pocketchat.store.postgres_memory import PostgresMemory
from pocketchat.store.postgres_schema import START_TIMEOUT, migrate
from pocketchat.store.postgres_search import PostgresSearch
from pocketchat.store.postgres_shares import PostgresShares
from pocketchat.store.postgres_transfer import PostgresTransfer
from pocketchat.store.queued import ChosenPath, QueuedStore, Row, merged_meta
from pocketchat.store.transfer import IMPORTING, PARTIAL

logger = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[asyncpg.Connection], Awaitable[T]]

POOL_SIZE = 5  # read connections at most
CLOSE_TIMEOUT = 15.0  # seconds close() waits for the writer before it gives up on what is left
READ_TIMEOUT = 3.0  # seconds a read may take; then the user is told the database is unavailable
STALL_SECONDS = 1.0  # a write (or probe) the server has not answered for this long makes /healthz fail

# Never `SELECT *`: the search index's vectors (`words`, `title_words`, as long as the text) are never read back.
CONVERSATION_READ = ", ".join((*CONVERSATION_COLUMNS, "leaf_id", "path_version"))
MESSAGE_COLUMNS = (
    "seq, id, conversation_id, turn_id, role, content, reasoning, status, error, meta, created_at, parent_id"
)

# A reply is written while it streams; once it is final (complete, stopped, error, or interrupted by the
# replica that took its turn over) no later write changes it: a producer that was paused past its lease
# and wakes up cannot write its longer reply over what the other replica stored.
UPSERT_MESSAGE = """
INSERT INTO messages
    (id, conversation_id, turn_id, role, content, reasoning, status, error, meta, created_at, parent_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (id) DO UPDATE SET content = excluded.content, reasoning = excluded.reasoning,
    status = excluded.status, error = excluded.error, meta = excluded.meta
WHERE messages.status = 'streaming'
"""


def _unavailable(error: BaseException) -> Unavailable:
    reason = f"it did not answer in {READ_TIMEOUT:g} s" if isinstance(error, TimeoutError) else str(error)
    return Unavailable(f"PocketChat cannot reach its database now ({reason or type(error).__name__}). Try again soon.")


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
        " SELECT $1, $2, $3, $4, $5, $6::double precision, $7::double precision, $8, $9, $10"
        " WHERE NOT EXISTS (SELECT 1 FROM deleted_conversations WHERE id = $1) ON CONFLICT (id) DO NOTHING",
        *record.to_row(),
    )


async def _nothing_to_reset(connection: asyncpg.Connection) -> None:
    """A read connection's release: asyncpg's default resets the session (a round trip each read: under
    a burst, each waits its turn of a busy event loop); reads change nothing a session keeps (no SET,
    LISTEN or lock), and asyncpg still rolls back a transaction left open."""


class PostgresStore(
    PostgresShares, PostgresMemory, PostgresAttachments, PostgresSearch, PostgresTransfer, QueuedStore[WriteConnection]
):
    """The store in PostgreSQL: shared by every replica that names the same database."""

    def __init__(self, url: str) -> None:
        super().__init__(WriteConnection(url), logger)
        self._url = url  # may hold a password: never logged, never in an error message
        self.where = describe(url)
        self._pool: asyncpg.Pool | None = None  # for reads

    # ---- open and close --------------------------------------------------------------------------

    async def open(self, sweep_streaming: bool = True) -> int:
        """Bring the schema up to date, start the writer, and (with `sweep_streaming`: no other replica
        can be writing one) mark replies a crash cut short as interrupted; return how many."""
        connection = await self._database.connect()
        try:
            await migrate(connection)
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
                reset=_nothing_to_reset,
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
            return rows_changed(await db.execute(sweep, timeout=START_TIMEOUT))

    @property
    def failure(self) -> str | None:
        """Why writes fail now: the last batch was refused, the server did not answer the last probe, or
        the write in flight has waited for it over STALL_SECONDS (a stall, a lock held by a frozen replica)."""
        if (waited := self.stalled_for()) > STALL_SECONDS:
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

    async def list_conversations(self, owner: str) -> list[ConversationRecord]:
        query = f"SELECT {CONVERSATION_READ} FROM conversations WHERE owner = $1 AND id NOT IN {PARTIAL}"
        query += " ORDER BY updated_at DESC, created_at DESC"
        rows = await self._read(lambda db: db.fetch(query, owner))
        return [ConversationRecord.from_row(row) for row in rows]

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None:
        async def work(db: asyncpg.Connection) -> tuple[ConversationRecord, list[Message]] | None:
            # One snapshot: the messages are those of the conversation as read, not of a later write.
            async with db.transaction(isolation="repeatable_read", readonly=True):
                query = (
                    f"SELECT {CONVERSATION_READ}, {IMPORTING} FROM conversations WHERE id = $1 AND id NOT IN {PARTIAL}"
                )
                row = await db.fetchrow(query, conversation_id)
                if row is None:
                    return None
                query = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = $1 ORDER BY seq"
                messages = [Message.from_row(message) for message in await db.fetch(query, conversation_id)]
                query = f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = $1 AND message_id IS NOT NULL"
                images = await db.fetch(query + " ORDER BY created_at, id", conversation_id)
                record = ConversationRecord.from_row(row)
                record.importing = row["importing"]
                return record, with_images(messages, map(ImageRecord.from_row, images))

        return await self._read(work)

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

    def _name(self, record: ConversationRecord, replacing: str | None) -> Work[str]:
        query = "UPDATE conversations SET title = $1, updated_at = $2 WHERE id = $3 AND title IS NOT DISTINCT FROM $4"
        row = (record.title, record.updated_at, record.id, replacing)
        return lambda db: db.execute(query, *row)

    def _delete(self, conversation_id: str) -> Work[bool]:
        async def work(db: asyncpg.Connection) -> bool:
            await _lock_conversation(db, conversation_id)
            tombstone = "INSERT INTO deleted_conversations VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"
            await db.execute(tombstone, conversation_id, time.time())
            return rows_changed(await db.execute("DELETE FROM conversations WHERE id = $1", conversation_id)) > 0

        return work

    def _save(
        self, conversation_id: str, rows: list[Row], new: ConversationRecord | None, path: ChosenPath | None
    ) -> Work[bool | None]:
        touch = "UPDATE conversations SET updated_at = $1 WHERE id = $2"
        choose = None if path is None else self._choose(conversation_id, path, touch=True)

        async def work(db: asyncpg.Connection) -> bool | None:
            if new is not None:
                await _insert_conversation(db, new)
            if rows:
                await db.executemany(UPSERT_MESSAGE, rows)
            written = None if choose is None else await choose(db)  # touches `updated_at` too, if written
            if not written:
                await db.execute(touch, time.time(), conversation_id)
            return written

        return work

    def _choose(self, conversation_id: str, path: ChosenPath, touch: bool = False) -> Work[bool]:
        query = "UPDATE conversations SET leaf_id = $1, path_version = path_version + 1"
        args: tuple[Any, ...] = (path.leaf_id, conversation_id)
        if touch:  # a turn's opening write: `updated_at` with it, in one statement
            query, args = query + f", updated_at = ${len(args) + 1}", (*args, time.time())
        query += " WHERE id = $2"
        if path.expected is not None:
            query, args = query + f" AND path_version = ${len(args) + 1}", (*args, path.expected)

        async def work(db: asyncpg.Connection) -> bool:
            return rows_changed(await db.execute(query, *args)) > 0

        return work

    def _press(self, conversation_id: str, message_id: str, step: str, button: str) -> Work[bool]:
        meta = "coalesce(meta, '{}')::jsonb"
        query = (
            f"UPDATE messages SET meta = jsonb_set({meta}, '{{presses}}',"
            f" coalesce({meta} -> 'presses', '{{}}') || jsonb_build_object($1::text, $2::text))::text"
            f" WHERE id = $3 AND conversation_id = $4 AND status != 'streaming' AND {meta} -> 'presses' -> $1 IS NULL"
        )

        async def work(db: asyncpg.Connection) -> bool:
            return await db.execute(query, step, button, message_id, conversation_id) == "UPDATE 1"

        return work

    def _interrupt(self, message: Message) -> Work[str]:
        query = (
            "UPDATE messages SET content = $1, reasoning = $2, status = 'interrupted', error = $3,"
            " meta = coalesce($5, meta) WHERE id = $4 AND status = 'streaming'"
        )
        row = (message.content, message.reasoning, message.error, message.id)
        read = "SELECT meta FROM messages WHERE id = $1 AND status = 'streaming' FOR UPDATE"

        async def work(db: asyncpg.Connection) -> str:
            stored = await db.fetchval(read, message.id) if message.meta else None
            return await db.execute(query, *row, merged_meta(stored, message))

        return work

    def _interrupt_or_open(
        self, conversation_id: str, message: Message, rows: list[Row], record: ConversationRecord
    ) -> Work[Any]:
        # The row of a reply whose opening write landed keeps its usage so far (meta): its end is written,
        # with its steps, as `_interrupt` does. Else the opening write is made now, with the reply as it ended.
        interrupt = self._interrupt(message)
        open_turn = self._save(conversation_id, rows, record, ChosenPath(None, record.path_version))

        async def work(db: asyncpg.Connection) -> bool | None:
            if await db.fetchval("SELECT 1 FROM messages WHERE id = $1", message.id) is None:
                return await open_turn(db)
            await interrupt(db)
            return None

        return work

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
            return rows_changed(await db.execute(query, *args))

        return work
