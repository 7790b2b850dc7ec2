"""The SQLite store, on a real file: writes in order, one failure isolated, reads beside the writer."""

import asyncio
import logging

from utils.messages import ConversationRecord, Message
from utils.store import Store


def test_queued_writes_land_in_order_and_a_failing_one_takes_no_other_down(tmp_path, caplog):
    async def scenario():
        store = Store(tmp_path / "chat.db")
        store.open()
        record = ConversationRecord(model="m", system_prompt="")
        writes = [store.create_conversation(record)]
        writes += [store.save_messages(record.id, [Message(role="user", content=str(i))]) for i in range(5)]
        writes.insert(3, store.save_messages("no-such-conversation", [Message(role="user", content="orphan")]))
        results = await asyncio.gather(*writes, return_exceptions=True)
        _, messages = await store.load(record.id)
        store.close()
        return results, messages

    with caplog.at_level(logging.ERROR):
        results, messages = asyncio.run(scenario())
    assert [type(r).__name__ for r in results] == ["NoneType"] * 3 + ["IntegrityError"] + ["NoneType"] * 3
    assert [m.content for m in messages] == ["0", "1", "2", "3", "4"]
    assert "database write failed" in caplog.text


def test_a_reply_marked_streaming_is_found_interrupted_on_the_next_open(tmp_path):
    async def write_then_crash():
        store = Store(tmp_path / "chat.db")
        store.open()
        record = ConversationRecord(model="m", system_prompt="")
        reply = Message(role="assistant", content="half a repl", status="streaming")
        await store.open_turn(record.id, record, [Message(role="user", content="q"), reply], [])
        store.close()
        return record.id

    conversation_id = asyncio.run(write_then_crash())
    store = Store(tmp_path / "chat.db")
    assert store.open() == 1
    _, messages = asyncio.run(store.load(conversation_id))
    store.close()
    assert [(m.status, m.content) for m in messages] == [("complete", "q"), ("interrupted", "half a repl")]


def test_loading_an_unknown_conversation_gives_none(tmp_path):
    store = Store(tmp_path / "chat.db")
    store.open()
    assert asyncio.run(store.load("no-such-id")) is None
    store.close()
