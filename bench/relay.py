"""A lean WebSocket relay between a client and the provider: a reference for any app in between.

`bench/load.py` measures it beside PocketChat, with the same client, the same fake provider, the same
request body and the same uvicorn settings (`websockets-sansio`, uvloop, no compression, no proxy
headers), and a pool that keeps its connections as long as PocketChat's. It does what every chat
server must do for a reply and little else: read a `message` frame, send one request with aiohttp,
parse the SSE lines with orjson, send one `chunk` frame per piece and a `turn_end`. No sign-in, no
store, no turn log, no limits, no second task per socket, no tuned garbage collector; what PocketChat
costs beyond it is its own. One frame per piece always: in an unpaced stream PocketChat, which puts
the pieces waiting into one frame, does less than it.

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

from pocketchat.providers.openai_compatible import KEEPALIVE_SECONDS


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
        body = {
            "model": "fake-model",
            "messages": [{"role": "user", "content": content}],
            "stream": True,
            "stream_options": {"include_usage": True},  # as PocketChat asks: the usage comes as one more chunk
        }
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
        # No connection limit, as the direct read (aiohttp's default of 100 would queue a burst), and
        # connections kept as long as PocketChat keeps them.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
        sessions.append(aiohttp.ClientSession(connector=connector))
        yield
        await sessions.pop().close()

    return Starlette(routes=[WebSocketRoute("/ws", relay)], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    # PocketChat's own uvicorn settings (main.py): the same WebSocket implementation and loop.
    relay = create_relay(args.base_url)
    uvicorn.run(
        relay, host="127.0.0.1", port=args.port, ws_per_message_deflate=False, proxy_headers=False, log_level="warning"
    )


if __name__ == "__main__":
    main()
