"""A turn's ordered log of frames: the one path every socket reads a turn from.

Chunk `seq` k is entry `(k, 0)`; any other frame gets the key `(k, n)`, where k is the number of
chunks before it and n counts the frames since chunk k: `turn_start` is `(0, 1)`, an `error` after
chunk 12 is `(12, 1)`, `turn_end` comes last. A socket follows the log *after a seq*: the socket
that started the turn after 0 (everything), a socket that arrives mid-turn after the seq of the
snapshot it got in `ready`. Each frame is encoded once, whatever the number of sockets; a follower
that finds several chunks waiting (a slow socket, a provider that sent many in one read) gets them
as one frame covering their seqs (`first_seq` to `seq`), made for it.

`InProcessTurnLog` keeps the log in memory. With replicas, the replica that runs a turn also copies
each entry to a Redis stream named by the turn id (`pocketchat/cluster/produced_log.py`), whose entry
ids are these keys (`XADD turn:<id> <k>-<n>`); every other replica that has sockets on the
conversation mirrors that stream into an `InProcessTurnLog` of its own (`add_entry`,
`pocketchat/cluster/mirrors.py`), which its sockets follow.
"""

import asyncio
import bisect
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pocketchat import protocol, steps


class TurnLog(Protocol):
    turn_id: str

    @property
    def seq(self) -> int:
        """The number of chunks so far."""

    @property
    def size(self) -> int:
        """The number of entries so far: chunks, steps and the other frames."""

    def append(self, frame: dict[str, Any]) -> None:
        """Add a frame that is not a chunk (turn_start, queued, conversation, error, turn_end)."""

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        """Add the next chunk and return its seq."""

    def append_step(self, node: str, kind: str, data: Any, **show: Any) -> None:
        """Add a `step` frame: what node `node` shows in the page (kind `sources`, `tool_call`, its own...);
        `show` says how: `shape`, `display`, `step_id` (a later step of the node by that id replaces it),
        `buttons` (pocketchat/steps.py)."""

    def snapshot(self, resume: bool = False) -> dict[str, Any]:
        """The reply so far: {turn_id, seq, content, reasoning, steps}. `resume`: the snapshot a socket
        then follows the log from (after `seq`): without the steps that came after chunk `seq`, which
        the follow sends (a reload while a tool runs would show its call twice)."""

    def follow(self, after_seq: int) -> AsyncIterator[str]:
        """The encoded frames that came after chunk `after_seq`, waiting for new ones, until the log closes."""

    def close(self) -> None:
        """No more entries; followers stop after the last one."""

    async def confirm(self) -> bool:
        """Whether this process may still write the turn's record: with replicas, whether the turn is
        still this replica's (another one did not take it over while this one was frozen)."""


# Chunks one frame may carry when a follower finds several waiting: a bound on the frame's size.
MAX_JOINED = 256
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
        # One item per chunk in both (reasoning "" for a chunk without): the reply up to any seq.
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._unread: list[str] = []  # mirrored chunk frames not decoded yet
        self._steps: list[tuple[tuple[int, int], dict[str, Any]]] = []  # each step's key and {node, kind, data}
        self._seq = 0
        self._since_chunk = 0
        self._closed = False
        self._waiters: list[asyncio.Future[None]] = []  # followers waiting for the next entry
        self._cuts = 0  # how many times entries were dropped from the end (`_cut`), and where the last cut was
        self._cut_at = 0

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def size(self) -> int:
        return len(self._entries)

    def _push(self, key: tuple[int, int], text: str) -> None:
        self._keys.append(key)
        self._entries.append(text)
        self._wake()

    def _wake(self) -> None:
        # Wake the followers waiting now. A future each rather than an asyncio.Event renewed at every
        # entry: this runs once a chunk, and the Event's making and waiting were a twentieth of a
        # burst's CPU. (One future shared by all would not do: cancelling one follower cancels it.)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _cut(self, keep: int) -> None:
        """Drop every entry after the first `keep` (a produced log's, whose turn was taken over)."""
        del self._entries[keep:], self._keys[keep:]
        self._seq, self._since_chunk = self._keys[-1] if self._keys else (0, 0)
        del self._content[self._seq :], self._reasoning[self._seq :]
        self._steps = [(key, step) for key, step in self._steps if key <= self._keys[-1]] if self._keys else []
        self._cuts, self._cut_at = self._cuts + 1, keep

    def _shown(self) -> int:
        """How many entries followers may read (a produced log may hold some back)."""
        return len(self._entries)

    def append(self, frame: dict[str, Any]) -> None:
        self._since_chunk += 1
        self._push((self._seq, self._since_chunk), protocol.encode(frame))

    def append_step(self, node: str, kind: str, data: Any, **show: Any) -> None:
        if show.get("display") == "inline":  # drawn where the reply was when it came
            show["at"] = sum(len(part) for part in self._content)
        frame = steps.step(self.turn_id, node, kind, data, **show)
        self.append(frame)
        self._keep_step(self._keys[-1], steps.step_record(frame))

    def _keep_step(self, key: tuple[int, int], step: dict[str, Any]) -> None:
        """Keep a step for the reply: in place of the node's earlier step of the same id, if it has one
        (a progress bar that moves is one step in the reply, however often it moved)."""
        if "id" in step:
            for index, (_, kept) in enumerate(self._steps):
                if kept.get("id") == step["id"] and kept["node"] == step["node"]:
                    self._steps[index] = (self._steps[index][0], step)
                    return
        self._steps.append((key, step))

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        self._seq += 1
        self._since_chunk = 0
        self._content.append(content)
        self._reasoning.append(reasoning or "")
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
            self._keep_step(key, steps.step_record(json.loads(text)))
        self._since_chunk = key[1]
        self._push(key, text)

    def snapshot(self, resume: bool = False) -> dict[str, Any]:
        for text in self._unread:
            frame = json.loads(text)
            self._content.append(frame["content"])
            self._reasoning.append(frame.get("reasoning") or "")
        self._unread.clear()
        held = self._held_seq()
        seq = self._seq if held is None else held
        return {
            "turn_id": self.turn_id,
            "seq": seq,
            "content": "".join(self._content if held is None else self._content[:held]),
            "reasoning": "".join(self._reasoning if held is None else self._reasoning[:held]),
            "steps": [step for key, step in self._steps if not resume or key[0] < seq],
        }

    def _held_seq(self) -> int | None:
        """The seq of the last chunk followers may read, if a produced log holds later ones back."""
        return None

    async def follow(self, after_seq: int) -> AsyncIterator[str]:
        position = bisect.bisect_right(self._keys, (after_seq, 0))
        cuts = self._cuts
        while True:
            if cuts != self._cuts:
                # A produced log dropped entries (its turn was taken over) and ended differently: a
                # follower that was past the cut goes on from it, so that it gets the new end.
                cuts, position = self._cuts, min(position, self._cut_at)
            # Read again after each frame: while it was being sent, the log may have grown, or been cut.
            while cuts == self._cuts and position < (shown := self._shown()):
                end = self._chunks_from(position, shown)
                yield self._entries[position] if end == position + 1 else self._joined(position, end)
                position = end
            if cuts != self._cuts:
                continue
            if self._closed and position == len(self._entries):
                return  # closed, and nothing held back any more
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:  # a follower that left: not kept until the next entry
                    self._waiters.remove(waiter)
                raise

    def _chunks_from(self, position: int, shown: int) -> int:
        """Where the run of chunks that begins at entry `position` ends (at most MAX_JOINED of them, all
        here already); `position + 1` if that entry is not a chunk, or the chunks' text is not decoded
        (a mirror's: it sends them one by one, as they came)."""
        end = position + 1
        if self._keys[position][1] != 0 or self._unread:
            return end
        while end < shown and self._keys[end][1] == 0 and end - position < MAX_JOINED:
            end += 1
        return end

    def _joined(self, position: int, end: int) -> str:
        """One frame for the chunks of entries `position` to `end`: a follower that fell behind (a slow
        socket, a provider that sent many chunks in one read) catches up in one send, not one each."""
        first, last = self._keys[position][0], self._keys[end - 1][0]
        content = "".join(self._content[first - 1 : last])
        reasoning = "".join(self._reasoning[first - 1 : last])
        return protocol.encode(protocol.chunk(self.turn_id, last, content, reasoning or None, first_seq=first))

    def close(self) -> None:
        self._closed = True
        self._wake()

    async def confirm(self) -> bool:
        return True  # one process: nobody else can take its turns
