"""A fake OpenAI-compatible server over real HTTP/1.1 and SSE, with faults on request.

It answers `GET /v1/models` and `POST /v1/chat/completions` (streaming), keeps connections alive as
real servers do, and records every request and every client that hung up mid-stream. What the next
replies do is scripted with `Reply`: token count and pace, usage, reasoning, tool calls, an HTTP error,
a cut connection, a stall.

Run it alone for the benchmark: `python -m tests.fake_openai --port 9000 --tokens 100 --pace-ms 20`.
"""

import argparse
import asyncio
import json
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from utils.titles import ASK as TITLE_ASK

MODELS = ["fake-model", "fake-model-large"]


def asks_a_title(request: dict[str, Any]) -> bool:
    """Whether a chat request asks for a conversation's title (NameConversation's), not for a reply."""
    messages = (request.get("json") or {}).get("messages") or [{}]
    return messages[0].get("role") == "system" and messages[0].get("content") == TITLE_ASK


@dataclass
class Call:
    """A tool call a reply makes, streamed as OpenAI streams one: its id and name first, then its
    arguments in pieces of `piece` characters, each piece naming its call by index."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)  # a str is sent as it is (even invalid JSON)
    id: str | None = None  # default: call_<n>_<index>, unique in the fake's life
    piece: int = 7

    def text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Reply:
    """What one chat completion does."""

    tokens: list[str] | None = None  # the content pieces; default: `count` numbered words
    count: int = 5
    pace: float = 0.0  # seconds between chunks
    first_delay: float = 0.0
    reasoning: list[str] = field(default_factory=list)  # reasoning_content pieces sent before the content
    usage: bool = True  # send the usage chunk when the client asks for it
    usage_values: dict[str, Any] | None = None  # send this as the usage, whatever it holds, not the counts
    status: int | None = None  # answer with this HTTP error instead
    message: str = "The fake provider failed on purpose."
    cut_after: int | None = None  # drop the connection after this many content chunks
    # Close the connection on reading the request, answering nothing: as a server whose keep-alive
    # timeout closed a pooled connection just as the request went out on it.
    hang_up: bool = False
    stall_after: int | None = None  # go silent (connection open) after this many content chunks
    finish: bool = True  # send a finish_reason
    raw: list[str] | None = None  # send these data lines as they are, then [DONE]
    linger: bool = False  # after [DONE], keep the connection open (and the response unended) until the client leaves
    # Tool calls, after the content (which is none unless `tokens` says); finish_reason "tool_calls". A
    # request whose tool_choice is "none" gets `tokens` (or the default words) instead, as OpenAI's would.
    calls: list[Call] = field(default_factory=list)

    def pieces(self) -> list[str]:
        if self.tokens is None and self.calls:
            return []
        return self.tokens if self.tokens is not None else [f"tok{i} " for i in range(1, self.count + 1)]


def word_vector(text: str, dimensions: int = 64) -> list[float]:
    """The fake's embedding of a text: its words hashed into `dimensions` counts (texts that share words
    are near; deterministic across processes, unlike `hash`)."""
    vector = [0.0] * dimensions
    for word in text.lower().split():
        vector[zlib.crc32(word.strip(".,;:!?\"'()").encode()) % dimensions] += 1.0
    return vector


class FakeOpenAI:
    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply()
        self.script: deque[Reply] = deque()
        # A conversation's title, asked after its first reply (utils/titles.py), is answered from a script
        # of its own: a test of replies scripts what it tests, whatever else the flow asks. Unscripted, no
        # title (a test of titles scripts them).
        self.titles: deque[Reply] = deque()
        self.embed_delay = 0.0  # seconds each /embeddings answer waits: a document that takes long to index
        self.requests: list[dict[str, Any]] = []
        self.hangups = 0
        self.completed = 0
        self.models_answer = True  # False: accept `GET /models` and never answer, as a hung provider does
        self.connections = 0  # connections accepted
        # Close a connection idle this long between requests, as servers do (uvicorn after 5 s); None: never.
        self.idle_close: float | None = None
        self.port = 0
        self._calls_made = 0
        self._server: asyncio.Server | None = None

    def queue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The chat requests of replies (a title's aside: `title_requests`)."""
        return [r for r in self.requests if r["path"].endswith("/chat/completions") and not asks_a_title(r)]

    @property
    def title_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions") and asks_a_title(r)]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # asyncio's default backlog of 100 drops connections when hundreds of streams start at once
        # (the benchmark), and a dropped SYN costs the client a 1 s retransmit; real servers queue more.
        self._server = await asyncio.start_server(self._connection, host, port, backlog=2048)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            carry: bytes | None = b""
            while carry is not None:
                carry = await self._exchange(reader, writer, carry)
                if carry == b"" and self.idle_close is not None:
                    try:  # the next request's first byte (none at the end: the client closed it)
                        carry = await asyncio.wait_for(reader.read(1), self.idle_close) or None
                    except TimeoutError:
                        return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, carry: bytes) -> bytes | None:
        """Serve one request (whose first bytes may have been read already); None closes the connection,
        bytes are the start of the next request."""
        head = carry + await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        request = {
            "method": method,
            "path": path,
            "headers": headers,
            "json": json.loads(body) if body else None,
            "at": time.monotonic(),
        }
        self.requests.append(request)
        if method == "GET" and path.endswith("/models"):
            if not self.models_answer:
                await reader.read()  # until the client hangs up
                return None
            data = {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in MODELS]}
            self._json(writer, 200, data)
        elif method == "POST" and path.endswith("/embeddings"):
            await asyncio.sleep(self.embed_delay)
            inputs = request["json"]["input"]
            data = [
                {"object": "embedding", "index": i, "embedding": word_vector(text)} for i, text in enumerate(inputs)
            ]
            self._json(writer, 200, {"object": "list", "data": data, "model": request["json"]["model"]})
        elif method == "POST" and path.endswith("/chat/completions"):
            if asks_a_title(request):
                # Unscripted, an answer that names nothing: the first message's start stays the title.
                reply = self.titles.popleft() if self.titles else Reply(tokens=["?"])
            else:
                reply = self.script.popleft() if self.script else self.default
            if reply.calls and request["json"].get("tool_choice") == "none":
                reply = Reply(tokens=reply.tokens, count=reply.count, pace=reply.pace)  # it may not call tools
            if reply.hang_up:
                return None
            if reply.status is not None:
                error = {"error": {"message": reply.message, "type": "fake_error", "code": reply.status}}
                self._json(writer, reply.status, error)
            else:
                return await self._stream(reader, writer, request["json"], reply)
        else:
            self._json(writer, 404, {"error": {"message": f"No route {method} {path}"}})
        await writer.drain()
        return b""

    def _json(self, writer: asyncio.StreamWriter, status: int, data: dict[str, Any]) -> None:
        body = json.dumps(data).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, Any], reply: Reply
    ) -> bytes | None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"cache-control: no-cache\r\n\r\n"
        )
        # Reading while we write tells us when the client hangs up.
        hangup = asyncio.ensure_future(reader.read(1))
        model = body.get("model", MODELS[0])
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

        def event(payload: dict[str, Any] | str) -> bytes:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        def delta(content: dict[str, Any], finish: str | None = None) -> bytes:
            return event({**base, "choices": [{"index": 0, "delta": content, "finish_reason": finish}]})

        async def wait(seconds: float | None) -> bool:
            """Sleep (forever if None); return False if the client hung up meanwhile."""
            if seconds == 0:
                await writer.drain()
                return not hangup.done()
            await writer.drain()
            await asyncio.wait([hangup], timeout=seconds)
            return not hangup.done()

        try:
            if not await wait(reply.first_delay):
                return self._hung_up()
            if reply.raw is not None:
                writer.write(b"".join(event(line) for line in reply.raw) + event("[DONE]") + b"0\r\n\r\n")
                await writer.drain()
                return b""
            writer.write(delta({"role": "assistant", "content": ""}))
            for piece in reply.reasoning:
                writer.write(delta({"reasoning_content": piece}))
                if not await wait(reply.pace):
                    return self._hung_up()
            pieces = reply.pieces()
            for index, piece in enumerate(pieces):
                if reply.cut_after is not None and index == reply.cut_after:
                    await writer.drain()
                    writer.transport.abort()
                    return None
                if reply.stall_after is not None and index == reply.stall_after:
                    await wait(None)
                    return self._hung_up()
                writer.write(delta({"content": piece}))
                if not await wait(reply.pace):
                    return self._hung_up()
            for index, call in enumerate(reply.calls):
                self._calls_made += 1
                call_id = call.id or f"call_{self._calls_made}_{index}"
                head = {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
                writer.write(delta({"tool_calls": [head]}))
                text = call.text()
                for start in range(0, len(text), call.piece):
                    piece = {"index": index, "function": {"arguments": text[start : start + call.piece]}}
                    writer.write(delta({"tool_calls": [piece]}))
                    if not await wait(reply.pace):
                        return self._hung_up()
            if reply.finish:
                writer.write(delta({}, "tool_calls" if reply.calls else "stop"))
            if reply.usage and (body.get("stream_options") or {}).get("include_usage"):
                prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                usage = reply.usage_values or {
                    "prompt_tokens": prompt,
                    "completion_tokens": len(pieces),
                    "total_tokens": prompt + len(pieces),
                }
                writer.write(event({**base, "choices": [], "usage": usage}))
            if reply.linger:
                writer.write(event("[DONE]"))
                await wait(None)
                return self._hung_up()
            writer.write(event("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
            self.completed += 1
            if not hangup.done():
                hangup.cancel()
                await asyncio.gather(hangup, return_exceptions=True)
                return b""
            # The client may already have sent its next request on this connection.
            return hangup.result() or None
        finally:
            hangup.cancel()

    def _hung_up(self) -> None:
        self.hangups += 1


class FakeOpenAIThread:
    """The fake on its own event loop in a background thread, for tests."""

    def __init__(self, default: Reply | None = None) -> None:
        self.fake = FakeOpenAI(default)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self._loop).result(5)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


async def _serve(port: int, default: Reply) -> None:
    fake = FakeOpenAI(default)
    await fake.start(port=port)
    print(f"fake OpenAI server on http://127.0.0.1:{fake.port}/v1", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--pace-ms", type=float, default=20)
    args = parser.parse_args()
    import uvloop

    uvloop.run(_serve(args.port, Reply(count=args.tokens, pace=args.pace_ms / 1000)))
