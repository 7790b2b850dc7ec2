"""Load benchmark: concurrent conversations through the whole app, against the fake provider read
directly with the openai SDK (the baseline), in the same run.

The fake streams 100 chunks 20 ms apart. For 1, 100 and 300 concurrent conversations it measures
time to first chunk (p50, p99), wall time and chunks/s, checks that every reply arrived complete and
in order, and prints app/baseline ratios (medians over the repetitions). Two baselines: `sdk` reads
the plain way, with the SDK's default client and chat.completions.create() (a pydantic object per
chunk); `provider` reads through the app's own OpenAIProvider (the SDK on its aiohttp transport,
plain dicts), so the ratio to it is the cost of everything the app adds, and it is the stricter one.

    .venv/bin/python -m bench.load [--levels 1,100,300] [--repeat 3]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import openai
import uvloop
import websockets

from pocketchat.providers.openai_compatible import OpenAIProvider
from tests.conftest import NO_LIMITS, AppProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 100
PACE_MS = 20
EXPECTED = "".join(f"tok{i} " for i in range(1, TOKENS + 1))


@dataclass
class Run:
    ttfts: list[float]
    wall: float
    chunks: int
    failures: int
    cpu: float = 0.0  # seconds of the app processes' CPU, where measured (bench/cluster.py)
    why: list[str] = field(default_factory=list)  # what went wrong, one line per failed conversation

    def p(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000 if ordered else float("nan")


def wait_http(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError as error:
            if getattr(error, "code", None):  # an HTTP error: the server is up
                return
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


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
    start = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    return summarize(results, time.perf_counter() - start)


async def through_app(ws_url: str, n: int) -> Run:
    sockets = [await websockets.connect(ws_url, max_size=None) for _ in range(n)]
    for ws in sockets:
        await ws.send('{"type":"hello"}')
        while json.loads(await ws.recv())["type"] != "ready":
            pass

    async def one(ws: websockets.ClientConnection) -> tuple[float | None, int, bool]:
        start = time.perf_counter()
        await ws.send('{"type":"message","content":"hi"}')
        first, text, seqs = None, [], []
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "chunk":
                first = first or time.perf_counter() - start
                text.append(frame["content"])
                seqs.append(frame["seq"])
            elif frame["type"] == "turn_end":
                ok = frame["status"] == "complete" and seqs == list(range(1, TOKENS + 1))
                return first, len(seqs), ok and "".join(text) == EXPECTED
            elif frame["type"] == "error":
                return first, len(seqs), False

    start = time.perf_counter()
    results = await asyncio.gather(*(one(ws) for ws in sockets), return_exceptions=True)
    wall = time.perf_counter() - start
    await asyncio.gather(*(ws.close() for ws in sockets))
    return summarize(results, wall)


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


async def measure(levels: list[int], repeat: int, fake_url: str, ws_url: str) -> None:
    provider = OpenAIProvider(fake_url, "bench", "fake-model", idle_limit=30.0)
    print(f"fake provider: {TOKENS} chunks, {PACE_MS} ms apart; {repeat} repetitions, medians\n")
    header = f"{'conv':>5} {'who':>9} {'p50 ttft':>9} {'p99 ttft':>9} {'wall s':>7} {'chunks/s':>9} {'failed':>6}"
    print(header)
    summary = []
    for n in levels:
        runs: dict[str, list[Run]] = {"sdk": [], "provider": [], "app": []}
        for _ in range(repeat):
            runs["sdk"].append(await sdk_baseline(fake_url, n))
            runs["provider"].append(await provider_baseline(provider, n))
            runs["app"].append(await through_app(ws_url, n))
        medians = {}
        for who, rs in runs.items():
            m = {
                "p50": statistics.median(r.p(0.5) for r in rs),
                "p99": statistics.median(r.p(0.99) for r in rs),
                "wall": statistics.median(r.wall for r in rs),
                "rate": statistics.median(r.chunks / r.wall for r in rs),
                "failed": sum(r.failures for r in rs),
            }
            medians[who] = m
            print(
                f"{n:>5} {who:>9} {m['p50']:>7.1f}ms {m['p99']:>7.1f}ms {m['wall']:>7.2f}"
                f" {m['rate']:>9.0f} {m['failed']:>6}"
            )
        summary.append((n, medians))
    await provider.aclose()
    print("\nratios app/baseline (lower is better; target at 300: p99 ttft <= 2.0, wall <= 1.3, no failure)")
    for baseline_name in ("sdk", "provider"):
        for n, m in summary:
            app, base = m["app"], m[baseline_name]
            print(
                f"vs {baseline_name:>8}, {n:>3} conversations: p50 ttft x{app['p50'] / base['p50']:.2f},"
                f" p99 ttft x{app['p99'] / base['p99']:.2f}, wall x{app['wall'] / base['wall']:.2f},"
                f" failures {app['failed']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,100,300")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    fake_port = free_port()
    fake_url = f"http://127.0.0.1:{fake_port}/v1"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        fake = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_openai", "--port", str(fake_port), "--tokens", str(TOKENS),
             "--pace-ms", str(PACE_MS)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        app = AppProcess(
            Path(tmp),
            [
                "--base-url",
                fake_url,
                "--api-key",
                "bench",
                "--model",
                "fake-model",
                "--log-level",
                "warning",
                *NO_LIMITS,
            ],
        )
        try:
            wait_http(f"{fake_url}/models")
            app.start()
            levels = [int(level) for level in args.levels.split(",")]
            uvloop.run(measure(levels, args.repeat, fake_url, app.ws_url))
        finally:
            app.stop()
            fake.terminate()
            fake.wait()


if __name__ == "__main__":
    main()
