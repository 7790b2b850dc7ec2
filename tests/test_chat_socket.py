"""The socket client on its own, with a stand-in for the WebSocket: the paths no real socket reaches."""

import asyncio
import logging

from flow import FLOWS, create_indexing_flow
from pocketchat.providers import UnavailableProvider
from pocketchat.settings import Settings
from pocketchat.state import AppState
from pocketchat.store.sqlite import SqliteStore
from pocketchat.web.socket import Client


class BrokenWebSocket:
    """Accepts a `hello`, then fails to send in a way no disconnect explains (a bug, a bad frame)."""

    def __init__(self) -> None:
        self.closed_with: int | None = None
        self.gone = asyncio.Event()
        self.incoming = [{"type": "websocket.receive", "text": '{"type": "hello"}'}]

    async def receive(self) -> dict:
        if self.incoming:
            return self.incoming.pop()
        await self.gone.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        raise UnicodeEncodeError("utf-8", text, 0, 1, "surrogates not allowed")

    async def close(self, code: int = 1000) -> None:
        self.closed_with = code
        self.gone.set()


def test_an_unexpected_failure_while_sending_closes_the_socket_with_1011_and_is_logged(tmp_path, caplog):
    async def scenario() -> tuple[int | None, int]:
        store = SqliteStore(tmp_path / "c.db")
        await store.open()
        state = AppState(Settings(model="m"), store, UnavailableProvider("none"), FLOWS, create_indexing_flow)
        websocket = BrokenWebSocket()
        client = Client(websocket, state, "local")  # type: ignore[arg-type]
        await asyncio.wait_for(client.serve(), 5)
        await store.close()
        return websocket.closed_with, len(state.hub.conversations)

    with caplog.at_level(logging.ERROR):
        closed_with, live = asyncio.run(scenario())
    assert closed_with == 1011
    assert "WebSocket handler failed" in caplog.text and "surrogates not allowed" in caplog.text
    assert live == 1  # the new conversation it made is kept (for 10 minutes), not leaked as attached
