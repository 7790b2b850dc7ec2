"""The SQLite store when the database refuses writes: another process holding the write lock past the
busy timeout, or no room left. Refused writes fail their callers with StorageError, are kept and
written again in order, hold up only their own conversation, and keep it in memory while they wait."""

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time

import pytest

from pocketchat.conversations import Hub
from pocketchat.errors import StorageError
from pocketchat.records import ConversationRecord, Message
from pocketchat.store.sqlite import Job, SqliteStore


def hold_the_write_lock(path) -> sqlite3.Connection:
    """Another process (a backup, the sqlite3 shell) holds the write lock longer than busy_timeout (5 s)."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


class WriteRefused(logging.Handler):
    """Set as soon as the writer logs that the database refused writes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "database writes failed" in record.getMessage():
            self.seen.set()


def test_a_kept_checkpoint_never_overwrites_the_final_reply_saved_after_it(tmp_path):
    refused = WriteRefused()
    logging.getLogger("pocketchat.store.sqlite").addHandler(refused)

    async def scenario():
        path = tmp_path / "chat.db"
        store = SqliteStore(path)
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        reply = Message(role="assistant", content="", status="streaming")
        await store.open_turn(record.id, record, [Message(role="user", content="q"), reply])
        other = hold_the_write_lock(path)
        gate = threading.Event()
        # Hold the writer so that the checkpoint and the final save share one batch.
        store._jobs.put_nowait(Job(lambda db: gate.wait(10), None, retry=False))
        reply.content = "half a rep"
        store.checkpoint(record.id, reply)  # the turn's last checkpoint (its row is copied now)
        reply.content, reply.status = "half a reply, and the rest", "complete"
        final = asyncio.ensure_future(store.save_messages(record.id, [reply]))
        await asyncio.sleep(0.1)
        gate.set()
        assert await asyncio.to_thread(refused.seen.wait, 30)  # refused while the lock is held
        other.execute("ROLLBACK")
        with contextlib.suppress(StorageError):
            await final  # written behind the kept checkpoint, or kept behind it (which batch it joined)
        await store.close()  # writes what is kept, in order, then closes
        with sqlite3.connect(path) as db:
            return db.execute("SELECT content, status FROM messages WHERE id = ?", (reply.id,)).fetchone()

    try:
        stored = asyncio.run(scenario())
    finally:
        logging.getLogger("pocketchat.store.sqlite").removeHandler(refused)
    assert stored == ("half a reply, and the rest", "complete")


def test_a_write_refused_by_a_locked_database_fails_with_storage_error(tmp_path):
    async def scenario():
        path = tmp_path / "chat.db"
        store = SqliteStore(path)
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(record)
        other = hold_the_write_lock(path)
        try:
            with pytest.raises(StorageError, match="locked"):
                await store.save_messages(record.id, [Message(role="assistant", content="a reply")])
        finally:
            other.execute("ROLLBACK")
            await store.close()

    asyncio.run(scenario())


def test_a_conversation_is_kept_while_its_refused_write_is_tried_again_and_let_go_once_written(tmp_path):
    async def scenario():
        path = tmp_path / "chat.db"
        store = SqliteStore(path)
        await store.open()
        hub = Hub(store)
        conversation = hub.create("local", "m", "")
        await hub.ensure_stored(conversation)
        other = hold_the_write_lock(path)
        reply = Message(role="assistant", content="the reply, only in memory")
        conversation.history.append(reply)
        with pytest.raises(StorageError):
            await store.save_messages(conversation.id, [reply])
        hub.release(conversation)  # its last socket leaves: kept, its write waits
        kept = conversation in hub.conversations
        await asyncio.sleep(3)  # a retry is under way now (each waits 5 s for the lock)
        async with hub.borrow(conversation.id, "local") as borrowed:  # a GET from a second tab
            same_copy = borrowed is conversation
        other.execute("ROLLBACK")
        deadline = time.monotonic() + 15
        while store.unwritten(conversation.id) or conversation in hub.conversations:
            assert time.monotonic() < deadline, "never written, or never let go"
            await asyncio.sleep(0.05)
        _, history = await store.load(conversation.id)
        await store.close()
        return kept, same_copy, [m.content for m in history]

    assert asyncio.run(scenario()) == (True, True, ["the reply, only in memory"])


def test_one_write_too_big_for_the_space_left_holds_up_only_its_own_conversation(tmp_path):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        a = ConversationRecord(model="m", system_prompt="")
        b = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(a)
        await store.create_conversation(b)
        pages = store._database.connection.execute("PRAGMA page_count").fetchone()[0]
        store._jobs.put_nowait(Job(lambda db: db.execute(f"PRAGMA max_page_count = {pages + 20}"), None, retry=False))
        with pytest.raises(StorageError):
            await store.save_messages(a.id, [Message(role="assistant", content="x" * 1_000_000)])
        with pytest.raises(StorageError):  # a's next write waits behind its first, in order
            await store.save_messages(a.id, [Message(role="user", content="after it")])
        try:
            await store.save_messages(b.id, [Message(role="user", content="small")])
            return "written", store.unwritten(a.id), store.unwritten(b.id)
        finally:
            store._database.connection.execute("PRAGMA max_page_count = 1073741823")
            await store.close()

    assert asyncio.run(scenario()) == ("written", True, False)
