"""What a socket sends, and how it keeps up: two sender tasks, one for the socket's own frames (ready,
errors, conversation changes) in order, the other for the turn logs it follows, one turn after another,
each starting only once the frames queued before it (its `ready`) are out. Nobody waits for a socket: a
conversation queues a frame and moves on. A socket that takes longer than `--send-timeout` to accept a
frame, or lets too many frames queue up, has fallen behind: it is closed with 1013 and its page
reconnects and resumes from the turn log.
"""

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from fastapi import WebSocket

from pocketchat.conversations import Conversation
from pocketchat.turn_log import TurnLog
from pocketchat.web.sign_in import SIGNED_OUT

FRAMES, LOGS = 0, 1  # the two senders of a socket
MAX_QUEUED = 256  # frames and logs waiting for one socket before it counts as fallen behind
MAX_QUEUED_BYTES = 8 << 20  # and bytes: a `ready` carries the whole history, and hellos are cheap to send


class Close(Exception):
    """The socket must be closed with `code`."""

    code = 1011


class FellBehind(Close):
    """The socket stopped accepting frames fast enough."""

    code = 1013


class SignedOut(Close):
    """Its session was revoked: the page shows the sign-in page."""

    code = SIGNED_OUT


@dataclass
class Follow:
    """Send a turn log's frames after chunk `after_seq`, once the client's first `after_frames` frames are out."""

    log: TurnLog
    after_seq: int
    conversation: Conversation | None
    after_frames: int


class Outbox:
    """One socket's frames and followed logs, queued, and the loops that send them (`send_frames`,
    `send_logs`) and watch them go (`watch_sends`); each loop raises the `Close` that ends the socket."""

    def __init__(self, websocket: WebSocket, send_timeout: float) -> None:
        self.websocket = websocket
        self.send_timeout = send_timeout
        self._frames: deque[str] = deque()
        self._follows: deque[Follow] = deque()
        self._queued_bytes = 0
        self._queued_frames = 0  # how many frames were ever queued; and sent:
        self._sent_frames = 0
        self._closing: Close | None = None
        self._sending_since: list[float | None] = [None, None]  # by sender: FRAMES, LOGS
        self._wake_frames = asyncio.Event()
        self._wake_logs = asyncio.Event()
        self._sending_log: tuple[Follow, asyncio.Task[None]] | None = None

    # ---- queueing (never waits) ----------------------------------------------------------------

    def send_text(self, text: str) -> None:
        """Queue a frame encoded already."""
        if self._full():
            return
        self._frames.append(text)
        self._queued_bytes += len(text)
        self._queued_frames += 1
        self._wake_frames.set()

    def follow(self, log: TurnLog, after_seq: int, conversation: Conversation | None) -> None:
        if self._full():
            return
        self._follows.append(Follow(log, after_seq, conversation, self._queued_frames))
        self._wake_logs.set()

    def stop_following(self, conversation: Conversation) -> None:
        self._follows = deque(f for f in self._follows if f.conversation is not conversation)
        if self._sending_log is not None and self._sending_log[0].conversation is conversation:
            self._sending_log[1].cancel()

    def close(self, reason: Close) -> None:
        self._closing = self._closing or reason  # the frame sender closes the socket
        self._wake_frames.set()

    def _full(self) -> bool:
        if len(self._frames) + len(self._follows) >= MAX_QUEUED:
            self.close(FellBehind(f"over {MAX_QUEUED} frames waiting"))
        elif self._queued_bytes > MAX_QUEUED_BYTES:
            self.close(FellBehind(f"over {MAX_QUEUED_BYTES >> 20} MiB waiting"))
        return self._closing is not None

    # ---- sending -------------------------------------------------------------------------------

    async def send_frames(self) -> None:
        while True:
            while not self._frames or self._closing is not None:
                if self._closing is not None:
                    raise self._closing
                self._wake_frames.clear()
                await self._wake_frames.wait()
            await self._send_text(self._frames[0], FRAMES)
            self._queued_bytes -= len(self._frames.popleft())
            self._sent_frames += 1
            self._wake_logs.set()  # a follow may have waited for this frame (its `ready`)

    async def send_logs(self) -> None:
        while True:
            if not self._follows or self._sent_frames < self._follows[0].after_frames:
                self._wake_logs.clear()
                await self._wake_logs.wait()
                continue
            follow = self._follows.popleft()
            # Its own task, so that detaching can stop it without stopping this loop.
            task = asyncio.create_task(self._send_frames_of(follow))
            self._sending_log = (follow, task)
            try:
                await task
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # this loop is stopped, not only the log's sending
            finally:
                self._sending_log = None
                task.cancel()

    async def _send_frames_of(self, follow: Follow) -> None:
        async for text in follow.log.follow(follow.after_seq):
            await self._send_text(text, LOGS)

    async def _send_text(self, text: str, sender: int) -> None:
        # When the send began, for `watch_sends`: one clock read a frame, not a timer per frame.
        self._sending_since[sender] = time.monotonic()
        try:
            await self.websocket.send_text(text)
        finally:  # a log's sending may be cancelled (the socket left its conversation)
            self._sending_since[sender] = None

    async def watch_sends(self) -> None:
        """A send that takes longer than --send-timeout means the socket fell behind: close it."""
        timeout = self.send_timeout
        while True:
            await asyncio.sleep(timeout / 4)
            now = time.monotonic()
            if any(since is not None and now - since > timeout for since in self._sending_since):
                raise FellBehind(f"a frame waited over {timeout:g} s")
