"""A step's button pressed (a `press` frame) goes back to the flow that showed it (docs/protocol.md, "How a
node shows itself").

A press is checked like any frame: the socket's own conversation, a message of it, a step of that message,
a button of that step that goes back to the flow (not one that sends a message), not pressed before.
Then it goes to a node of the running turn that awaits that step (`awaited`: approve or deny before a tool
runs, say); or, on a finished reply, it is recorded once in the database (compare-and-set: a press
replayed, or made at once on another replica, is refused) and handed to the `on_press` of the node's class
in the conversation's flow ("use this answer", a thumbs up). Anything else is a `bad_frame` that changes
nothing.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pocketflow import AsyncFlow, BaseNode

from pocketchat import protocol, steps
from pocketchat.conversations import Conversation, Turn
from pocketchat.errors import BadFrame, StorageError
from pocketchat.records import Message
from pocketchat.settings import Settings
from pocketchat.store import Store

logger = logging.getLogger("pocketchat")


@dataclass
class Press:
    """What an `on_press` gets: the press, where it was made, and what a node may use to answer it."""

    conversation: Conversation
    message: Message  # the reply whose step carried the button
    step: dict[str, Any]  # the step as kept with it: {node, kind, data, id, buttons, ...}
    button: str  # the id of the button pressed
    owner: str
    store: Store
    settings: Settings


PressHandler = Callable[[Press], Awaitable[None]]


def handlers_of(flows: list[AsyncFlow]) -> dict[str, PressHandler]:
    """The `on_press` of each node class the flows run, by the class's name (what its steps give as `node`)."""
    found: dict[str, PressHandler] = {}
    for flow in flows:
        for node in _nodes(flow.start_node, set()):
            inner = getattr(node, "node", node)  # a node wrapped in flows.MayFail
            if (handler := getattr(inner, "on_press", None)) is not None:
                found[type(inner).__name__] = handler
    return found


def _nodes(node: BaseNode | None, seen: set[int]) -> Iterator[BaseNode]:
    if node is None or id(node) in seen:
        return
    seen.add(id(node))
    yield node
    for following in node.successors.values():
        yield from _nodes(following, seen)


async def awaited(turn: Turn, step_id: str, timeout: float) -> str | None:
    """For a node of `turn`: the id of the button pressed on its step `step_id`, or None if none was within
    `timeout` seconds or the turn was stopped."""
    pressed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    turn.awaiting[step_id] = pressed
    stopping = asyncio.ensure_future(turn.stop.wait())
    try:
        done, _ = await asyncio.wait({pressed, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return pressed.result() if pressed in done else None
    finally:
        stopping.cancel()
        turn.awaiting.pop(step_id, None)


def _button(step: dict[str, Any], button_id: str) -> dict[str, Any] | None:
    return next((b for b in step.get("buttons") or [] if b.get("id") == button_id and "send" not in b), None)


async def press(
    conversation: Conversation,
    frame: protocol.Press,
    owner: str,
    store: Store,
    settings: Settings,
    handlers: dict[str, PressHandler],
) -> dict[str, Any] | None:
    """Deliver a press, or raise BadFrame having changed nothing. A press on a finished reply is recorded
    and told to this process's pages: the `pressed` frame, for other replicas' (None for an awaited one)."""
    turn = conversation.turn
    if turn is not None and turn.reply.id == frame.message_id:
        step = _step(turn.log.snapshot()["steps"], frame)
        waiting = turn.awaiting.get(frame.step)
        if waiting is None or waiting.done():
            raise BadFrame("That button is not waiting for an answer (it was answered already, or timed out).")
        waiting.set_result(frame.button)
        return None
    message = conversation.tree.get(frame.message_id)
    if message is None or message.role != "assistant":
        raise BadFrame("No such reply in this conversation: the button may belong to another one.")
    step = _step(message.meta.get("steps") or [], frame)
    if frame.step in (message.meta.get("presses") or {}):
        raise BadFrame("That button was pressed already.")
    handler = handlers.get(step["node"])
    if handler is None:
        raise BadFrame(f"Nothing answers {step['node']}'s buttons in this conversation's flow now.")
    try:
        recorded = await store.record_press(conversation.id, message.id, frame.step, frame.button)
    except StorageError as error:
        raise BadFrame(f"The press could not be recorded ({error.message}); nothing changed.") from None
    if not recorded:
        raise BadFrame("That button was pressed already.")
    try:
        await handler(Press(conversation, message, step, frame.button, owner, store, settings))
    except Exception:
        logger.exception("%s's on_press failed for a press in conversation %s…", step["node"], conversation.id[:6])
    # Told once the handler is done, so a page that sees the button pressed sees what it did too.
    told = steps.pressed(conversation.id, message.id, frame.step, frame.button)
    conversation.keep_press(told)
    return told


def _step(steps: list[dict[str, Any]], frame: protocol.Press) -> dict[str, Any]:
    step = next((step for step in steps if step.get("id") == frame.step), None)
    if step is None or _button(step, frame.button) is None:
        raise BadFrame("No such button on that reply: it may have changed since the page drew it.")
    return step
