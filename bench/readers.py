"""The ways the load benchmarks read a burst of streams of the fake provider, each checked complete and in
order and timed (first chunk, wall, CPU): directly (aiohttp, the SSE lines parsed by hand), through the
openai SDK, through the app's own provider, and through the whole app over its WebSocket. bench/load.py
and bench/cluster.py compare them."""

import asyncio
import json
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import openai
import psutil
import websockets

from pocketchat.providers.openai_compatible import OpenAIProvider
from tests.conftest import seqs_of

TOKENS = 100
EXPECTED = "".join(f"tok{i} " for i in range(1, TOKENS + 1))


def expected(tokens: int) -> str:
    return "".join(f"tok{i} " for i in range(1, tokens + 1))


@dataclass
class Run:
    ttfts: list[float]
    wall: float
    chunks: int
    failures: int
    cpu: float = 0.0  # seconds of CPU of the processes that did the work (the app's, or the bench's for direct)
    why: list[str] = field(default_factory=list)  # what went wrong, one line per failed conversation

    def p(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000 if ordered else float("nan")

    @property
    def rate(self) -> float:
        return self.chunks / self.wall

    @property
    def cpu_us_per_chunk(self) -> float:
        return self.cpu / self.chunks * 1e6 if self.chunks else float("nan")


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of processes `pids` so far."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def direct(fake_url: str, n: int, tokens: int = TOKENS, pool: aiohttp.ClientSession | None = None) -> Run:
    """The leanest read: aiohttp, the SSE lines parsed by hand. Its CPU is the bench process's own.

    Without `pool` (issue 21's baseline) each conversation opens a connection of its own; with it, the
    connections `pool` kept from the runs before are used again, as an app's pool is (`pooled`)."""
    if pool is None:
        # No connection limit: aiohttp's default of 100 would read 300 replies in three waves.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await direct(fake_url, n, tokens, session)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    want = expected(tokens)

    async def one() -> tuple[float | None, int, bool]:
        start, first, text = time.perf_counter(), None, []
        async with pool.post(f"{fake_url}/chat/completions", json=body) as response:
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                choices = json.loads(line[6:])["choices"]
                if choices and (piece := choices[0]["delta"].get("content")):
                    first = first or time.perf_counter() - start
                    text.append(piece)
        return first, len(text), "".join(text) == want

    cpu = own_cpu_seconds()
    start = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    return summarize(results, time.perf_counter() - start, own_cpu_seconds() - cpu)


async def sdk_baseline(fake_url: str, n: int) -> Run:
    """Read the fake the plain way: the SDK's default client and chat.completions.create().

    A fresh client each time, warmed by one request: a client left idle while the others run finds
    its pooled connections stale, and httpx closes them one event-loop turn each inside the first
    request (2-3 s under this load), which would flatter the app."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with openai.AsyncOpenAI(base_url=fake_url, api_key="bench", max_retries=0) as client:
        await client.models.list()

        async def one() -> tuple[float | None, int, bool]:
            start = time.perf_counter()
            stream = await client.chat.completions.create(**body)
            return await collect(start, (c.choices[0].delta.content async for c in stream if c.choices))

        return await timed(n, one)


async def provider_baseline(provider: OpenAIProvider, n: int) -> Run:
    """Read the fake through the app's own OpenAIProvider.open_stream: the stream the app reads,
    without the app around it."""
    messages = [{"role": "user", "content": "hi"}]

    async def one() -> tuple[float | None, int, bool]:
        start = time.perf_counter()
        async with provider.open_stream(messages, "fake-model", None) as chunks:
            return await collect(start, (c["choices"][0]["delta"].get("content") async for c in chunks if c["choices"]))

    return await timed(n, one)


async def collect(start: float, pieces: AsyncIterator[str | None]) -> tuple[float | None, int, bool]:
    first, text = None, []
    async for piece in pieces:
        if piece:
            first = first or time.perf_counter() - start
            text.append(piece)
    return first, len(text), "".join(text) == EXPECTED


async def timed(n: int, one: Callable[[], Awaitable[tuple[float | None, int, bool]]]) -> Run:
    cpu = own_cpu_seconds()
    start = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    return summarize(results, time.perf_counter() - start, own_cpu_seconds() - cpu)


@dataclass
class App:
    """An app process to measure: where its socket is, the cookie that signs in, its pid."""

    ws_url: str
    cookie: str
    pid: int


async def through_app(app: App, n: int, tokens: int = TOKENS) -> Run:
    """n conversations at once, each on a socket that said hello first; the app's CPU is measured
    from the first message to the last turn_end."""
    headers = {"Cookie": app.cookie}
    sockets = [await websockets.connect(app.ws_url, max_size=None, additional_headers=headers) for _ in range(n)]
    for ws in sockets:
        await ws.send('{"type":"hello"}')
        while json.loads(await ws.recv())["type"] != "ready":
            pass
    want = expected(tokens)

    async def one(ws: websockets.ClientConnection) -> tuple[float | None, int, bool, str]:
        start = time.perf_counter()
        await ws.send('{"type":"message","content":"hi"}')
        first, text, seqs, errors = None, [], [], []
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "chunk":
                first = first or time.perf_counter() - start
                text.append(frame["content"])
                seqs.extend(seqs_of(frame))
            elif frame["type"] == "error":
                errors.append(frame["code"])
                if "turn_id" not in frame:  # the message was refused: no turn, no turn_end
                    return first, len(seqs), False, f"message refused: {frame['code']}"
            elif frame["type"] == "turn_end":
                ok = frame["status"] == "complete" and not errors and seqs == list(range(1, tokens + 1))
                ok = ok and "".join(text) == want
                return first, len(seqs), ok, f"{len(seqs)} chunks, turn_end {frame['status']}, errors {errors}"

    cpu = cpu_seconds([app.pid])
    start = time.perf_counter()
    results = await asyncio.gather(*(one(ws) for ws in sockets), return_exceptions=True)
    wall = time.perf_counter() - start
    cpu = cpu_seconds([app.pid]) - cpu
    await asyncio.gather(*(ws.close() for ws in sockets))
    return summarize(results, wall, cpu)


def summarize(results: list, wall: float, cpu: float = 0.0) -> Run:
    """Results are (first chunk s, chunks, ok[, what went wrong]) or the exception a conversation raised."""
    ttfts, chunks, why = [], 0, []
    for result in results:
        if isinstance(result, BaseException):
            why.append(repr(result))
        elif not result[2] or result[0] is None:
            why.append(result[3] if len(result) > 3 else f"{result[1]} chunks, incomplete or out of order")
        else:
            ttfts.append(result[0])
            chunks += result[1]
    return Run(ttfts, wall, chunks, len(why), cpu, why)
