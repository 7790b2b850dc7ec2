"""The hub keeps one copy of each live conversation, whoever is using it."""

import asyncio
from pathlib import Path

from utils.conversations import Hub
from utils.store import Store


def test_a_conversation_an_http_request_is_using_stays_the_one_copy(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "c.db")
        store.open()
        hub = Hub(store)
        conversation = hub.create("fake-model", "")
        await hub.ensure_stored(conversation)
        async with hub.borrow(conversation.id) as borrowed:
            # The last socket on it leaves while the request still works on it (a PATCH awaiting
            # its write, say): a socket that opens it now must get the same object.
            hub.release(borrowed)
            assert await hub.open(conversation.id) is borrowed
        # Nobody uses it any more: it is let go, and the next open loads it from the store.
        reloaded = await hub.open(conversation.id)
        assert reloaded is not conversation and reloaded.id == conversation.id
        store.close()

    asyncio.run(scenario())
