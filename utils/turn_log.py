"""A turn's ordered log of frames: the one path every socket reads a turn from.

Entry 0 is `turn_start`, entries 1..n are the chunks (an entry's position is the chunk's `seq`),
then come any `error` and the final `turn_end`. A socket follows the log from a position: the
socket that started the turn from 0, a socket that arrives mid-turn from the snapshot it was given.
Each frame is encoded once, whatever the number of sockets.

`InProcessTurnLog` keeps the log in memory. A shared implementation (a Redis stream per turn,
entry id = position) can serve several replicas behind the same interface.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from utils import protocol


class TurnLog(Protocol):
    turn_id: str

    def append(self, frame: dict[str, Any]) -> None:
        """Add a non-chunk frame (turn_start, error, turn_end, ...)."""

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        """Add the next chunk and return its seq."""

    def snapshot(self) -> dict[str, Any]:
        """The reply so far: {turn_id, seq, content, reasoning}."""

    def follow(self, position: int) -> AsyncIterator[str]:
        """The encoded frames from `position` on, waiting for new ones, until the log is closed."""

    def close(self) -> None:
        """No more entries; followers stop after the last one."""


class InProcessTurnLog:
    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self._entries: list[str] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._seq = 0
        self._closed = False
        self._grown = asyncio.Event()

    def _push(self, text: str) -> None:
        self._entries.append(text)
        # Wake the followers waiting now; the next waiters get a fresh event.
        self._grown.set()
        self._grown = asyncio.Event()

    def append(self, frame: dict[str, Any]) -> None:
        self._push(protocol.encode(frame))

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        self._seq += 1
        self._content.append(content)
        if reasoning:
            self._reasoning.append(reasoning)
        self._push(protocol.encode(protocol.chunk(self.turn_id, self._seq, content, reasoning)))
        return self._seq

    def snapshot(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "seq": self._seq,
            "content": "".join(self._content),
            "reasoning": "".join(self._reasoning),
        }

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    async def follow(self, position: int) -> AsyncIterator[str]:
        while True:
            while position < len(self._entries):
                yield self._entries[position]
                position += 1
            if self._closed:
                return
            await self._grown.wait()

    def close(self) -> None:
        self._closed = True
        self._grown.set()
