"""The hub keeps one copy of each live conversation, whoever is using it."""

import asyncio
from pathlib import Path

from utils.conversations import Hub
from utils.messages import ConversationRecord, Message
from utils.sqlite_store import SqliteStore


def test_a_conversation_an_http_request_is_using_stays_the_one_copy(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path / "c.db")
        await store.open()
        hub = Hub(store)
        conversation = hub.create("local", "fake-model", "")
        await hub.ensure_stored(conversation)
        async with hub.borrow(conversation.id, "local") as borrowed:
            # The last socket on it leaves while the request still works on it (a PATCH awaiting
            # its write, say): a socket that opens it now must get the same object.
            hub.release(borrowed)
            assert await hub.open(conversation.id, "local") is borrowed
        # Nobody uses it any more: it is let go, and the next open loads it from the store.
        reloaded = await hub.open(conversation.id, "local")
        assert reloaded is not conversation and reloaded.id == conversation.id
        await store.close()

    asyncio.run(scenario())


def test_a_reply_left_streaming_with_no_turn_running_is_loaded_as_interrupted(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, str]]:
        store = SqliteStore(tmp_path / "c.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        # A turn whose final save never landed: its reply is still marked streaming in the database.
        reply = Message(role="assistant", content="half a", status="streaming")
        await store.open_turn(record.id, record, [Message(role="user", content="q"), reply], [])
        conversation = await Hub(store).open(record.id, "local")
        await store.close()
        return [(m.status, m.content) for m in conversation.history]

    assert asyncio.run(scenario()) == [("complete", "q"), ("interrupted", "half a")]
