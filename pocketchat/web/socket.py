"""The `/ws` endpoint: one `Client` per WebSocket.

A client reads frames and acts on them (hello, message, stop, ...). What it sends goes through its
`Outbox` (pocketchat/web/outbox.py), which never makes anyone wait for a socket, and closes one that
falls behind.
"""

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn, TurnIds
from pocketchat.errors import BadFrame, ProtocolError, RateLimited, StorageError
from pocketchat.paths import Again
from pocketchat.presses import press
from pocketchat.records import ImageRecord
from pocketchat.state import AppState, chat_state
from pocketchat.store import SAVE_WAIT_SECONDS
from pocketchat.tools.client import ClientTools
from pocketchat.turn_log import TurnLog
from pocketchat.turns import begin_turn
from pocketchat.web.outbox import Close, FellBehind, Outbox, SignedOut
from pocketchat.web.sign_in import VISITOR, Visitor, same_origin

logger = logging.getLogger("pocketchat")

GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)  # the socket closed under us


class Client:
    """One WebSocket: reads frames, acts on them, and sends what it should see, never blocking others."""

    def __init__(self, websocket: WebSocket, state: AppState, user: str) -> None:
        self.websocket = websocket
        self.state = state
        self.user = user
        self.conversation: Conversation | None = None
        self.outbox = Outbox(websocket, state.settings.send_timeout)
        self.tools = ClientTools(self.send)  # the tools this client declared, and its calls waiting for answers

    # ---- what a conversation calls (never waits) ----------------------------------------------

    def send(self, frame: dict[str, Any]) -> None:
        self.outbox.send_text(protocol.encode(frame))

    def send_text(self, text: str) -> None:
        """Queue a frame encoded already."""
        self.outbox.send_text(text)

    def follow(self, log: TurnLog, after_seq: int) -> None:
        self.outbox.follow(log, after_seq, self.conversation)

    def detach(self) -> None:
        """Leave the conversation: its logs are no longer followed; frames already queued still go."""
        if (conversation := self.conversation) is None:
            return
        self.outbox.stop_following(conversation)
        self.conversation = None
        conversation.subscribers.discard(self)
        self.state.hub.release(conversation)

    def sign_out(self) -> None:
        self.outbox.close(SignedOut("its session was revoked"))

    # ---- the socket's loops --------------------------------------------------------------------

    async def serve(self) -> None:
        """Read and send until the socket closes, or must be closed (1013: fell behind; 1011: a bug)."""
        outbox = self.outbox
        loops = (self._read, outbox.send_frames, outbox.send_logs, outbox.watch_sends)
        tasks = [asyncio.create_task(loop()) for loop in loops]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            self.tools.close()  # its calls waiting for an answer are denied now
            self.detach()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        close_code = None
        for outcome in outcomes:
            if isinstance(outcome, FellBehind):
                logger.warning("closing a WebSocket that fell behind (%s)", outcome)
            if isinstance(outcome, Close):
                close_code = close_code or outcome.code
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

    # ---- frames from the client ----------------------------------------------------------------

    async def handle(self, frame: protocol.ClientFrame) -> None:
        if isinstance(frame, protocol.Hello):
            if frame.tools is not None:
                self.tools.declare(frame.tools)
            await self.hello(frame.conversation_id)
            return
        if isinstance(frame, protocol.ToolCallAck):
            self.tools.acknowledge(frame.call_id)
            return
        if isinstance(frame, protocol.ToolResult):
            self.tools.answer(frame)
            return
        if isinstance(frame, protocol.ToolCallNack):
            self.tools.deny(frame.call_id, frame.reason)
            return
        conversation = self.conversation
        if isinstance(frame, protocol.Stop):
            turn = conversation.turn if conversation else None
            # A stop that arrives after its turn ended, or before any, is harmless and ignored.
            if turn is not None and frame.turn_id in (None, turn.id):
                self.state.coordinator.stop(turn)  # here, or on the replica that runs it
            elif conversation is not None and frame.turn_id is not None:
                # A turn that another replica started and this one has not heard of yet (its client
                # saw turn_start there first): passed on, to whichever replica runs it.
                self.state.coordinator.stop_unseen(conversation, frame.turn_id)
            return
        begin: Callable[[TurnIds], Turn]
        if isinstance(frame, protocol.UserMessage):
            conversation = conversation or await self.hello(None)
            images = await self._images(conversation, frame.images)
            begin = functools.partial(conversation.begin_message, frame.content, images)
        elif conversation is None:
            raise BadFrame(f"Say hello first: a '{frame.type}' needs a conversation.")
        elif isinstance(frame, protocol.Switch):
            await self.switch(conversation, frame.message_id)
            return
        elif isinstance(frame, protocol.Press):
            await self.state.limits.take_change(self.user)
            state = self.state
            told = await press(conversation, frame, self.user, state.store, state.settings, state.press_handlers)
            if told is not None:
                state.coordinator.pressed(conversation.id, told)  # the other replicas' pages
            return
        else:
            answered = (
                conversation.to_regenerate()
                if isinstance(frame, protocol.Regenerate)
                else conversation.to_edit(frame.message_id)
            )
            # Its images go again with the message answered again: not to a model that cannot see them.
            self.state.images.refuse_unseen(self._model(conversation), answered.images, again=True)
            if isinstance(frame, protocol.Regenerate):
                begin = conversation.begin_regenerate
            else:
                await self.state.images.check_copies(conversation.id, self.user, answered.images)
                begin = functools.partial(conversation.begin_edit, frame.message_id, frame.content)
        await self.state.hub.check_changeable(conversation)
        await begin_turn(self.state, conversation, begin, self.user, self.tools)

    async def switch(self, conversation: Conversation, message_id: str) -> None:
        """Show other versions: every socket on the conversation, here and on other replicas, gets the path."""
        await self.state.limits.take_change(self.user)
        coordinator = self.state.coordinator
        held = await coordinator.hold_for_switch(conversation.id)
        holding = True

        def choose() -> None:
            conversation.switch(message_id)
            conversation.broadcast_text(conversation.path_frame())

        try:
            choose()
            # Written over the path version this copy knows. Refused if another was stored meanwhile (a
            # turn that another replica ended before this one read it): then, while the lease is held,
            # chosen again on the copy read afresh, and written over the stored one (pocketchat/paths.py).
            stored = self.state.hub.paths.choose(conversation, Again(lambda: holding, choose)).done
            if held is not None:
                # With replicas, held until the write lands (2 s at most: a database that does not answer
                # keeps it, and writes it when it recovers, unless a later path was stored by then), so
                # that no turn's write of the path lands before it. One process writes in order: nothing
                # to wait for.
                with contextlib.suppress(StorageError, TimeoutError):
                    await asyncio.wait_for(asyncio.shield(stored), SAVE_WAIT_SECONDS)
        finally:
            holding = False
            await coordinator.let_go(conversation.id, held)

    async def _images(self, conversation: Conversation, ids: list[str]) -> list[ImageRecord]:
        """The images a message names, checked (waiting here, for a model that sees them) before its turn."""
        if not ids:
            return []
        return await self.state.images.for_message(conversation.id, self.user, ids, self._model(conversation))

    def _model(self, conversation: Conversation) -> str:
        return conversation.record.model or self.state.default_model or ""

    async def hello(self, conversation_id: str | None) -> Conversation:
        state = self.state
        await state.limits.take_hello(self.user)  # unknown ids too: each costs a lookup
        if conversation_id:
            conversation = await state.hub.open(conversation_id, self.user)
        else:
            conversation = await state.new_conversation(self.user)
        self._attach(conversation)  # before sharing it: a socket that closes meanwhile lets it go as usual
        if not conversation_id:
            await state.hub.share(conversation)  # before `ready` tells its id
        ready, log, after_seq = conversation.ready_frame(self.state.provider.describe())
        self.send_text(ready)
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
            self.outbox.stop_following(previous)
            if previous is not conversation:
                previous.subscribers.discard(self)
                self.state.hub.release(previous)


async def chat_socket(websocket: WebSocket) -> None:
    state = chat_state(websocket.app)
    # Browsers send Origin: only the page's own origin and the configured ones may connect.
    if not same_origin(websocket.headers, state.settings.allowed_origins, websocket=True):
        logger.warning("refused a WebSocket from origin %s", websocket.headers.get("origin"))
        await websocket.close(code=1008)
        return
    visitor: Visitor = websocket.scope[VISITOR]
    user = visitor.user
    assert user is not None  # the sign-in middleware let no one else through
    await websocket.accept()
    try:
        await state.limits.take_socket(user)
    except RateLimited as limited:
        await websocket.send_text(protocol.encode(protocol.error(limited)))
        await websocket.close(1013)
        return
    client = Client(websocket, state, user)
    if visitor.session_id is not None:
        state.accounts.add_socket(visitor.session_id, client)
    state.metrics.sockets.inc()
    try:
        await client.serve()
    finally:
        state.metrics.sockets.dec()
        await state.limits.socket_closed(user)
        if visitor.session_id is not None:
            state.accounts.remove_socket(visitor.session_id, client)
