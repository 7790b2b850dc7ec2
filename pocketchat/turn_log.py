"""A turn's ordered log of frames: the one path every socket reads a turn from.

Chunk `seq` k is entry `(k, 0)`; any other frame gets the key `(k, n)`, where k is the number of
chunks before it and n counts the frames since chunk k: `turn_start` is `(0, 1)`, an `error` after
chunk 12 is `(12, 1)`, `turn_end` comes last. A socket follows the log *after a seq*: the socket
that started the turn after 0 (everything), a socket that arrives mid-turn after the seq of the
snapshot it got in `ready`. Each frame is encoded once, whatever the number of sockets.

`InProcessTurnLog` keeps the log in memory. With replicas (`pocketchat/cluster/redis_log.py`), the replica that
runs a turn also copies each entry to a Redis stream named by the turn id, whose entry ids are these
keys (`XADD turn:<id> <k>-<n>`); every other replica that has sockets on the conversation mirrors
that stream into an `InProcessTurnLog` of its own (`add_entry`), which its sockets follow.
"""

import asyncio
import bisect
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pocketchat import protocol


class TurnLog(Protocol):
    turn_id: str

    @property
    def seq(self) -> int:
        """The number of chunks so far."""

    def append(self, frame: dict[str, Any]) -> None:
        """Add a frame that is not a chunk (turn_start, queued, conversation, error, turn_end)."""

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        """Add the next chunk and return its seq."""

    def append_step(self, node: str, kind: str, data: Any) -> None:
        """Add a `step` frame: what node `node` shows in the page (kind `status`, `sources`, ...)."""

    def snapshot(self) -> dict[str, Any]:
        """The reply so far: {turn_id, seq, content, reasoning, steps}."""

    def follow(self, after_seq: int) -> AsyncIterator[str]:
        """The encoded frames that came after chunk `after_seq`, waiting for new ones, until the log closes."""

    def close(self) -> None:
        """No more entries; followers stop after the last one."""


STEP_PREFIX = '{"type":"step"'  # how an encoded step frame begins (protocol.encode keeps key order)


def parse_key(entry_id: str) -> tuple[int, int]:
    """A Redis stream entry id `k-n` as the log's key (k, n)."""
    k, _, n = entry_id.partition("-")
    return int(k), int(n)


class InProcessTurnLog:
    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self._entries: list[str] = []
        self._keys: list[tuple[int, int]] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._unread: list[str] = []  # mirrored chunk frames not decoded yet
        self._steps: list[dict[str, Any]] = []  # {node, kind, data} of each step frame, in order
        self._seq = 0
        self._since_chunk = 0
        self._closed = False
        self._grown = asyncio.Event()

    @property
    def seq(self) -> int:
        return self._seq

    def _push(self, key: tuple[int, int], text: str) -> None:
        self._keys.append(key)
        self._entries.append(text)
        # Wake the followers waiting now; the next waiters get a fresh event.
        self._grown.set()
        self._grown = asyncio.Event()

    def append(self, frame: dict[str, Any]) -> None:
        self._since_chunk += 1
        self._push((self._seq, self._since_chunk), protocol.encode(frame))

    def append_step(self, node: str, kind: str, data: Any) -> None:
        frame = protocol.step(self.turn_id, node, kind, data)
        self._steps.append(protocol.step_record(frame))
        self.append(frame)

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        self._seq += 1
        self._since_chunk = 0
        self._content.append(content)
        if reasoning:
            self._reasoning.append(reasoning)
        self._push((self._seq, 0), protocol.encode(protocol.chunk(self.turn_id, self._seq, content, reasoning)))
        return self._seq

    def add_entry(self, key: tuple[int, int], text: str) -> None:
        """Mirror an entry another replica appended (keys arrive in order)."""
        if self._keys and key <= self._keys[-1]:
            return  # read twice (a reader that reconnected): already here
        if key[1] == 0:
            self._seq = key[0]
            self._unread.append(text)  # read when a snapshot asks: most mirrored chunks never are
        elif text.startswith(STEP_PREFIX):
            self._steps.append(protocol.step_record(json.loads(text)))
        self._since_chunk = key[1]
        self._push(key, text)

    def snapshot(self) -> dict[str, Any]:
        for text in self._unread:
            frame = json.loads(text)
            self._content.append(frame["content"])
            if frame.get("reasoning"):
                self._reasoning.append(frame["reasoning"])
        self._unread.clear()
        return {
            "turn_id": self.turn_id,
            "seq": self._seq,
            "content": "".join(self._content),
            "reasoning": "".join(self._reasoning),
            "steps": list(self._steps),
        }

    async def follow(self, after_seq: int) -> AsyncIterator[str]:
        position = bisect.bisect_right(self._keys, (after_seq, 0))
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
