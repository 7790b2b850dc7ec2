"""The leanest WebSocket relay between a client and the provider: the floor for any app in between.

`bench/load.py` measures it beside PocketChat, with the same client, the same fake provider and the
same uvicorn settings (`websockets-sansio`, uvloop, no compression). It does what every chat server
must do for a reply and nothing else: read a `message` frame, send one request with aiohttp, parse
the SSE lines with orjson, send one `chunk` frame per piece and a `turn_end`. No sign-in, no store,
no turn log, no limits, no second task per socket; what PocketChat costs beyond it is its own.

    python -m bench.relay --port 9100 --base-url http://127.0.0.1:9000/v1
"""

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect


def create_relay(base_url: str) -> Starlette:
    """An app whose `/ws` answers `hello` with `ready` and streams each `message`'s reply from `base_url`."""
    url = f"{base_url}/chat/completions"
    sessions: list[aiohttp.ClientSession] = []

    async def relay(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                frame = orjson.loads(await websocket.receive_text())
                if frame["type"] == "hello":
                    await websocket.send_text('{"type":"ready"}')
                elif frame["type"] == "message":
                    await reply(websocket, frame["content"])
        except WebSocketDisconnect:
            return

    async def reply(websocket: WebSocket, content: str) -> None:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], "stream": True}
        seq = 0
        async with sessions[0].post(url, data=orjson.dumps(body)) as response:
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                choices = orjson.loads(line[6:])["choices"]
                if choices and (piece := choices[0]["delta"].get("content")):
                    seq += 1
                    await websocket.send_text(orjson.dumps({"type": "chunk", "seq": seq, "content": piece}).decode())
        await websocket.send_text('{"type":"turn_end","status":"complete"}')

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # No connection limit, as the direct read: aiohttp's default of 100 would queue a burst.
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        yield
        await sessions.pop().close()

    return Starlette(routes=[WebSocketRoute("/ws", relay)], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    # PocketChat's own uvicorn settings (main.py): the same WebSocket implementation and loop.
    uvicorn.run(
        create_relay(args.base_url), host="127.0.0.1", port=args.port, ws_per_message_deflate=False, log_level="warning"
    )


if __name__ == "__main__":
    main()
