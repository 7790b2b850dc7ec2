"""The hub keeps one copy of each live conversation, whoever is using it."""

import asyncio
import itertools
from pathlib import Path

from pocketchat import protocol
from pocketchat.conversations import Conversation, Hub
from pocketchat.records import ConversationRecord, Message
from pocketchat.store.sqlite import SqliteStore


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
        question = Message(role="user", content="q")
        reply = Message(role="assistant", content="half a", status="streaming", parent_id=question.id)
        await store.open_turn(record.id, record, [question, reply])
        conversation = await Hub(store).open(record.id, "local")
        await store.close()
        return [(m.status, m.content) for m in conversation.history]

    assert asyncio.run(scenario()) == [("complete", "q"), ("interrupted", "half a")]


def test_a_hello_again_for_an_unchanged_history_reuses_its_encoding(monkeypatch) -> None:
    """Each hello encoded the whole history again: two sockets saying hello over and over to a 5 MB
    conversation slowed every other user. Now the encoding is made once per change of the history."""
    history = [Message(role="user" if i % 2 == 0 else "assistant", content=f"{i} " + "x" * 5000) for i in range(1000)]
    for before, message in itertools.pairwise(history):
        message.parent_id = before.id
    conversation = Conversation(ConversationRecord(model="m", system_prompt="s"), history)
    encoded: list[str] = []
    to_wire = Message.to_wire
    monkeypatch.setattr(Message, "to_wire", lambda self: encoded.append(self.id) or to_wire(self))
    provider = {"kind": "openai"}

    first, _, _ = conversation.ready_frame(provider)
    assert len(encoded) == 1000 and len(first) > 5_000_000
    expected = protocol.encode(
        protocol.ready(conversation.id, None, "m", "s", [to_wire(m) for m in history], None, provider)
    )
    assert first == expected  # byte for byte what encoding the whole frame gives
    encoded.clear()
    for _ in range(50):
        again, _, _ = conversation.ready_frame(provider)
        assert again == first
    assert encoded == []  # not one message encoded again

    # Any change is seen: a message added, a reply's text or status replaced, the list replaced.
    changes = [
        lambda: conversation.history.append(Message(role="user", content="one more")),
        lambda: setattr(conversation.history[-1], "content", "edited"),
        lambda: setattr(conversation.history[0], "status", "interrupted"),
        lambda: setattr(conversation, "history", conversation.history[:-1]),
    ]
    for change in changes:
        change()
        encoded.clear()
        text, _, _ = conversation.ready_frame(provider)
        assert len(encoded) == len(conversation.history)
        assert text == protocol.encode(
            protocol.ready(conversation.id, None, "m", "s", [to_wire(m) for m in conversation.history], None, provider)
        )
