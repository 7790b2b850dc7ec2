"""The `/ws` endpoint: one `Client` per WebSocket.

A client reads frames and acts on them (hello, message, stop, ...). What it sends leaves through two
sender tasks: one sends its own frames (ready, errors, conversation changes) in order, the other the
turn logs it follows, one turn after another, each starting only once the frames queued before it
(its `ready`) are out. Nobody waits for a socket: a conversation queues a frame and moves on. A
socket that takes longer than `--send-timeout` to accept a frame, or lets too many frames queue up,
has fallen behind: it is closed with 1013 and its page reconnects and resumes from the turn log.
"""

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from state import AppState, chat_state
from turns import start_turn
from utils import protocol
from utils.conversations import Conversation
from utils.protocol import BadFrame, ProtocolError
from utils.turn_log import TurnLog

logger = logging.getLogger("pocketchat")

MAX_QUEUED = 256  # frames and logs waiting for one socket before it counts as fallen behind
GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)  # the socket closed under us


class FellBehind(Exception):
    """The socket stopped accepting frames fast enough."""


@dataclass
class Follow:
    """Send a turn log's frames after chunk `after_seq`, once the client's first `after_frames` frames are out."""

    log: TurnLog
    after_seq: int
    conversation: Conversation | None
    after_frames: int


class Client:
    """One WebSocket: reads frames, acts on them, and sends what it should see, never blocking others."""

    def __init__(self, websocket: WebSocket, state: AppState) -> None:
        self.websocket = websocket
        self.state = state
        self.conversation: Conversation | None = None
        self._frames: deque[str] = deque()
        self._follows: deque[Follow] = deque()
        self._queued_frames = 0  # how many frames were ever queued; and sent:
        self._sent_frames = 0
        self._overflowed = False
        self._wake_frames = asyncio.Event()
        self._wake_logs = asyncio.Event()
        self._sending_log: tuple[Follow, asyncio.Task[None]] | None = None

    # ---- what a conversation calls (never waits) ----------------------------------------------

    def send(self, frame: dict[str, Any]) -> None:
        if self._full():
            return
        self._frames.append(protocol.encode(frame))
        self._queued_frames += 1
        self._wake_frames.set()

    def follow(self, log: TurnLog, after_seq: int) -> None:
        if self._full():
            return
        self._follows.append(Follow(log, after_seq, self.conversation, self._queued_frames))
        self._wake_logs.set()

    def detach(self) -> None:
        """Leave the conversation: its logs are no longer followed; frames already queued still go."""
        if (conversation := self.conversation) is None:
            return
        self._stop_following(conversation)
        self.conversation = None
        conversation.subscribers.discard(self)
        self.state.hub.release(conversation)

    def _full(self) -> bool:
        if len(self._frames) + len(self._follows) >= MAX_QUEUED:
            self._overflowed = True  # the frame sender closes the socket
            self._wake_frames.set()
        return self._overflowed

    def _stop_following(self, conversation: Conversation) -> None:
        self._follows = deque(f for f in self._follows if f.conversation is not conversation)
        if self._sending_log is not None and self._sending_log[0].conversation is conversation:
            self._sending_log[1].cancel()

    # ---- the socket's loops --------------------------------------------------------------------

    async def serve(self) -> None:
        """Read and send until the socket closes, or must be closed (1013: fell behind; 1011: a bug)."""
        tasks = [asyncio.create_task(loop()) for loop in (self._read, self._send_frames, self._send_logs)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            self.detach()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        close_code = None
        for outcome in outcomes:
            if isinstance(outcome, FellBehind):
                logger.warning("closing a WebSocket that fell behind (%s)", outcome)
                close_code = close_code or 1013
            elif isinstance(outcome, Exception) and not isinstance(outcome, GONE):
                logger.error("WebSocket handler failed", exc_info=outcome)
                close_code = 1011
        if close_code is not None:
            # A socket that fell behind may not take even the close frame: do not wait for it forever.
            with contextlib.suppress(*GONE, TimeoutError):
                async with asyncio.timeout(self.state.settings.send_timeout):
                    await self.websocket.close(close_code)

    async def _read(self) -> None:
        max_bytes = self.state.settings.max_frame_bytes
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                await self.handle(protocol.parse_client_frame(message, max_bytes))
            except ProtocolError as error:
                self.send(protocol.error(error))

    async def _send_frames(self) -> None:
        while True:
            while not self._frames:
                if self._overflowed:
                    raise FellBehind(f"over {MAX_QUEUED} frames waiting")
                self._wake_frames.clear()
                await self._wake_frames.wait()
            await self._send_text(self._frames[0])
            self._frames.popleft()
            self._sent_frames += 1
            self._wake_logs.set()  # a follow may have waited for this frame (its `ready`)

    async def _send_logs(self) -> None:
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
                await asyncio.wait({task})
            finally:
                self._sending_log = None
                task.cancel()
            if not task.cancelled():
                task.result()

    async def _send_frames_of(self, follow: Follow) -> None:
        async for text in follow.log.follow(follow.after_seq):
            await self._send_text(text)

    async def _send_text(self, text: str) -> None:
        timeout = self.state.settings.send_timeout
        try:
            async with asyncio.timeout(timeout):
                await self.websocket.send_text(text)
        except TimeoutError:
            raise FellBehind(f"a frame waited over {timeout:g} s") from None

    # ---- frames from the client ----------------------------------------------------------------

    async def handle(self, frame: protocol.ClientFrame) -> None:
        if isinstance(frame, protocol.Hello):
            await self.hello(frame.session_id)
            return
        conversation = self.conversation
        if isinstance(frame, protocol.Stop):
            turn = conversation.turn if conversation else None
            # A stop that arrives after its turn ended, or before any, is harmless and ignored.
            if turn is not None and frame.turn_id in (None, turn.id):
                turn.stop.set()
            return
        if isinstance(frame, protocol.Message):
            conversation = conversation or await self.hello(None)
            start_turn(self.state, conversation, conversation.begin_message(frame.content))
            return
        if conversation is None:
            raise BadFrame(f"Say hello first: a '{frame.type}' needs a conversation.")
        if isinstance(frame, protocol.Regenerate):
            start_turn(self.state, conversation, conversation.begin_regenerate())
        elif isinstance(frame, protocol.Edit):
            start_turn(self.state, conversation, conversation.begin_edit(frame.message_id, frame.content))

    async def hello(self, session_id: str | None) -> Conversation:
        conversation = await self.state.hub.open(session_id) if session_id else self.state.new_conversation()
        self._attach(conversation)
        frame, log, after_seq = conversation.ready_frame(self.state.provider.describe())
        self.send(frame)
        if log is not None:
            self.follow(log, after_seq)
        return conversation

    def _attach(self, conversation: Conversation) -> None:
        """Attach to `conversation`; `ready` and its log follow from here, so the old follow stops.
        The new one is held before the old one is let go: a hello again for the same conversation
        must not drop it from memory while this socket is on it."""
        previous, self.conversation = self.conversation, conversation
        conversation.subscribers.add(self)
        if previous is not None:
            self._stop_following(previous)
            if previous is not conversation:
                previous.subscribers.discard(self)
                self.state.hub.release(previous)


def origin_allowed(websocket: WebSocket, allowed: list[str]) -> bool:
    """Browsers send Origin: only the page's own origin and the configured ones may connect."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True  # not a browser: no page of another site can be behind it
    origin = origin.lower().rstrip("/")
    return urlsplit(origin).netloc == websocket.headers.get("host", "").lower() or origin in allowed


async def chat_socket(websocket: WebSocket) -> None:
    state = chat_state(websocket.app)
    if not origin_allowed(websocket, state.settings.allowed_origins):
        logger.warning("refused a WebSocket from origin %s", websocket.headers.get("origin"))
        await websocket.close(code=1008)
        return
    await websocket.accept()
    await Client(websocket, state).serve()
