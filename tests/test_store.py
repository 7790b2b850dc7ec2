"""The SQLite store, on a real file: writes in order, one failure isolated, reads beside the writer."""

import asyncio
import logging

import pytest

from utils.messages import ConversationRecord, Message
from utils.protocol import StorageError
from utils.sqlite_store import Job, SqliteStore


def test_queued_writes_land_in_order_and_a_failing_one_takes_no_other_down(tmp_path, caplog):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        writes = [store.create_conversation(record)]
        writes += [store.save_messages(record.id, [Message(role="user", content=str(i))]) for i in range(5)]
        writes.insert(3, store.save_messages("no-such-conversation", [Message(role="user", content="orphan")]))
        results = await asyncio.gather(*writes, return_exceptions=True)
        _, messages = await store.load(record.id)
        await store.close()
        return results, messages

    with caplog.at_level(logging.ERROR):
        results, messages = asyncio.run(scenario())
    assert [type(r).__name__ for r in results] == ["NoneType"] * 3 + ["IntegrityError"] + ["NoneType"] * 3
    assert [m.content for m in messages] == ["0", "1", "2", "3", "4"]
    assert "database write failed" in caplog.text


def test_a_reply_marked_streaming_is_found_interrupted_on_the_next_open(tmp_path):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        reply = Message(role="assistant", content="half a repl", status="streaming")
        await store.open_turn(record.id, record, [Message(role="user", content="q"), reply], [])
        await store.close()
        again = SqliteStore(tmp_path / "chat.db")
        interrupted = await again.open()
        _, messages = await again.load(record.id)
        await again.close()
        return interrupted, [(m.status, m.content) for m in messages]

    assert asyncio.run(scenario()) == (1, [("complete", "q"), ("interrupted", "half a repl")])


def test_loading_an_unknown_conversation_gives_none(tmp_path):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        loaded = await store.load("no-such-id")
        await store.close()
        return loaded

    assert asyncio.run(scenario()) is None


def fill_the_disk(store: SqliteStore) -> None:
    """The database may not grow by a single page: the next write that needs one fails as on a full disk."""
    store._jobs.put(Job(lambda db: db.execute("PRAGMA max_page_count = 1"), None, retry=False))


def free_the_disk(store: SqliteStore) -> None:
    # On the writer's connection at once, not queued behind the writes waiting for room.
    store._connection.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_disk_fails_only_its_own_writes_and_they_are_written_once_it_recovers(tmp_path):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(record)
        fill_the_disk(store)
        big = Message(role="assistant", content="a reply that needs room " * 2000)
        with pytest.raises(StorageError, match="full"):
            await store.save_messages(record.id, [big])
        failing_while_full = store.failure
        kept_while_full = store.unwritten(record.id)
        # The writer is alive: later writes are answered (and fail too while the disk is full).
        with pytest.raises(StorageError):
            await store.save_messages(record.id, [Message(role="user", content="more " * 2000)])
        free_the_disk(store)
        await store.save_messages(record.id, [Message(role="user", content="after")])
        _, messages = await store.load(record.id)
        recovered = (store.failure, store.unwritten(record.id))
        await store.close()  # shutdown completes
        return failing_while_full, kept_while_full, recovered, [m.content[:5] for m in messages]

    failing, kept, recovered, stored = asyncio.run(scenario())
    assert "full" in failing and kept
    assert recovered == (None, False)
    assert stored == ["a rep", "more ", "after"]  # the refused writes landed first, in order


def test_writes_still_refused_at_shutdown_are_reported_and_shutdown_completes(tmp_path, caplog):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(record)
        fill_the_disk(store)
        with pytest.raises(StorageError):
            await store.save_messages(record.id, [Message(role="user", content="x" * 100_000)])
        await store.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert "1 writes could not be saved before shutdown" in caplog.text
