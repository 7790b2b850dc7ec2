"""The fake provider of bench/hostile.py, in a process of its own (the bench's process measures latencies:
the fake's work there would be counted in them), answering mallory's message with the row's script and
everyone else with a short reply."""

import asyncio
import multiprocessing
from collections import deque
from typing import Any

import uvloop

from bench.hostile_rows import HOSTILE_MARK
from tests.fake_openai import FakeOpenAI, Reply


class _Recorded(deque):
    """The fake's `requests`: only the last kept (the router reads it), counted into shared `stats`:
    chat requests, and the most tools one offered."""

    def __init__(self, stats: Any) -> None:
        super().__init__(maxlen=1)
        self.stats = stats

    def append(self, request: dict[str, Any]) -> None:
        super().append(request)
        if request["path"].endswith("/chat/completions"):
            self.stats[0] += 1
            self.stats[1] = max(self.stats[1], len((request["json"] or {}).get("tools") or []))


class _Router:
    """The fake's `script`: mallory's message gets the row's first reply, a request that carries tool
    results its last; everyone else the default (FakeOpenAI asks `bool(script)` then `popleft()` right
    after recording the request, with no await between)."""

    def __init__(self, fake: FakeOpenAI, replies: list[Reply]) -> None:
        self.fake, self.replies = fake, replies

    def _pick(self) -> Reply | None:
        messages = (self.fake.requests[-1]["json"] or {}).get("messages") or [{}]
        last = messages[-1]
        if last.get("role") == "tool":
            return self.replies[-1]
        if last.get("role") == "user" and HOSTILE_MARK in str(last.get("content")):
            return self.replies[0]
        return None

    def __bool__(self) -> bool:
        return bool(self.replies) and self._pick() is not None

    def popleft(self) -> Reply:
        return self._pick() or self.fake.default


def serve_fake(replies: list[Reply], ports: Any, stats: Any) -> None:
    async def serve() -> None:
        fake = FakeOpenAI(Reply(count=5))
        fake.requests = _Recorded(stats)  # type: ignore[assignment]
        fake.script = _Router(fake, replies)  # type: ignore[assignment]
        await fake.start()
        ports.put(fake.port)
        await asyncio.Event().wait()

    uvloop.run(serve())


def start_fake(replies: list[Reply]) -> tuple[multiprocessing.Process, int, Any]:
    """The fake, started; its port; its stats (chat requests, the most tools one offered)."""
    spawn = multiprocessing.get_context("spawn")
    ports, stats = spawn.Queue(), spawn.Array("d", 2, lock=False)
    process = spawn.Process(target=serve_fake, args=(replies, ports, stats), daemon=True)
    process.start()
    return process, ports.get(timeout=60), stats
