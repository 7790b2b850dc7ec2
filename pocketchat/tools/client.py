"""Tools a client declares in its `hello` (docs/protocol.md): when the model calls one, that client gets a
`tool_call` frame and answers `tool_call_ack`, then `tool_result`, or `tool_call_nack` (denied). A call
it does not answer in time, or that a stop cuts short, is cancelled: the client gets `tool_call_cancel`.
One `ClientTools` per socket; only that socket can answer its calls."""

import asyncio
import json
from collections.abc import Callable
from typing import Any

from pocketchat import protocol
from pocketchat.errors import BadFrame
from pocketchat.tools import CLIENT, CallContext, Denied, Tool, ToolFailed
from utils.clean import clean_json

GONE = "the client disconnected"


class ClientTools:
    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self.send = send  # queues a frame for the socket (never waits)
        self.tools: list[Tool] = []
        self._pending: dict[str, asyncio.Future[str]] = {}  # by call id
        self._acknowledged: set[str] = set()
        self._closed = False

    def declare(self, declarations: list[protocol.ToolDeclaration]) -> None:
        """The tools this client offers from now on (a hello's `tools`). A name declared twice refuses
        the whole hello, changing nothing: the model would be offered both, and one call could not say
        which it meant."""
        names: set[str] = set()
        for tool in declarations:
            if tool.name in names:
                raise BadFrame(f"'tools': the name {tool.name!r} is declared twice; each tool needs a name of its own.")
            names.add(tool.name)
        # The schema is any JSON the frame allowed (a lone surrogate, a NUL): made safe before it is offered.
        self.tools = [
            Tool(CLIENT, f"{CLIENT}.{t.name}", t.description, clean_json(t.parameters), self._caller(t.name))
            for t in declarations
        ]

    def _caller(self, name: str) -> Callable[[dict[str, Any], CallContext], Any]:
        async def call(arguments: dict[str, Any], context: CallContext) -> str:
            return await self._call(name, arguments, context)

        return call

    async def _call(self, name: str, arguments: dict[str, Any], context: CallContext) -> str:
        if self._closed:
            raise Denied(GONE)
        answer = asyncio.get_running_loop().create_future()
        self._pending[context.call_id] = answer
        self.send(protocol.tool_call(context.turn_id, context.call_id, name, arguments))
        try:
            return await answer
        except asyncio.CancelledError:
            if not self._closed:  # timed out, or the turn stopped: the client may drop it
                reason = context.cancelled or "cancelled"
                if context.call_id in self._acknowledged and reason != "stopped":
                    reason += " (it was acknowledged)"
                self.send(protocol.tool_call_cancel(context.turn_id, context.call_id, reason))
            raise
        finally:
            self._pending.pop(context.call_id, None)
            self._acknowledged.discard(context.call_id)

    def acknowledge(self, call_id: str) -> None:
        """`tool_call_ack`: the client runs the call (its result must still come within --tool-timeout)."""
        if call_id in self._pending:
            self._acknowledged.add(call_id)

    def answer(self, frame: protocol.ToolResult) -> None:
        """`tool_result`: a call of this client's ends (an answer to a call it does not have is ignored)."""
        if (waiting := self._pending.get(frame.call_id)) is None or waiting.done():
            return
        if frame.error is not None:
            waiting.set_exception(ToolFailed(frame.error))
        else:
            result = frame.result
            waiting.set_result(result if isinstance(result, str) else json.dumps(result, ensure_ascii=False))

    def deny(self, call_id: str, reason: str) -> None:
        """`tool_call_nack`: the client refuses the call."""
        if (waiting := self._pending.get(call_id)) is not None and not waiting.done():
            waiting.set_exception(Denied(reason or "the client refused it"))

    def close(self) -> None:
        """The socket closed: its pending calls are denied at once rather than waiting for their time."""
        self._closed = True
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(Denied(GONE))
