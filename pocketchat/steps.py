"""The `step` frame: how a node shows itself in the page (docs/protocol.md, "How a node shows itself").

A node names what it shows (`kind`), and may say how the page draws it (`shape`), where (`display`), under
which name a later step replaces it (`step_id`), and which buttons it carries. The page knows the shapes and
places, never a node's name or kind: a new node is drawn with no page change, and a page that does not know
a shape still shows the step plainly.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from utils.clean import clean_json

# How a node's step is drawn (docs/protocol.md, "How a node shows itself"): the page knows these shapes and
# places, never a node's name or kind.
Shape = Literal["text", "markdown", "keyvalue", "table", "links", "image", "progress"]
Display = Literal["above", "below", "inline", "hidden"]
SHAPES: tuple[str, ...] = get_args(Shape)
DISPLAYS: tuple[str, ...] = get_args(Display)
MAX_BUTTONS = 8
STEP_FIELDS = ("node", "kind", "data", "id", "shape", "display", "buttons", "at")  # as kept with the reply


@dataclass(frozen=True)
class Button:
    """A button under a step. With `send`, pressing it sends that text as the user's next message; without,
    the press goes back to the node that showed it (a `press` frame: `on_press`, or a node awaiting it)."""

    id: str
    label: str
    send: str | None = None

    def to_wire(self) -> dict[str, str]:
        return {"id": self.id, "label": self.label, **({"send": self.send} if self.send is not None else {})}


def step(
    turn_id: str,
    node: str,
    kind: str,
    data: Any,
    *,
    shape: Shape | None = None,
    display: Display | None = None,
    step_id: str | None = None,
    buttons: Sequence[Button] = (),
    at: int | None = None,
) -> dict[str, Any]:
    """What a node shows in the page: `kind` names what it is (`sources`, `tool_call`, a node's own);
    `shape` how the page draws `data`, `display` where (above the reply, by default), `step_id` names it (a
    later step of the same node and id replaces it), `buttons` under it; `at` (an inline step's) the
    characters of the reply before it. Its data is often what a model or a tool wrote (a call's arguments, a
    result): made safe here, for every node, before it is sent, kept with the reply and stored
    (utils/clean.py)."""
    frame = {"type": "step", "turn_id": turn_id, "node": node, "kind": kind, "data": clean_json(data)}
    if shape is not None:
        frame["shape"] = _one_of(shape, SHAPES, "shape")
    if display is not None:
        frame["display"] = _one_of(display, DISPLAYS, "display")
    if step_id is not None:
        frame["id"] = _name(step_id, "id")
    if buttons:
        if len(buttons) > MAX_BUTTONS or len({button.id for button in buttons}) < len(buttons):
            raise ValueError(f"A step has {MAX_BUTTONS} buttons at most, each with an id of its own.")
        if step_id is None:
            raise ValueError("A step with buttons needs an id: a press names it.")
        frame["buttons"] = [{**button.to_wire(), "id": _name(button.id, "button id")} for button in buttons]
    if at is not None:
        frame["at"] = at
    return frame


NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a step's id, a button's: what a press names


def _name(value: str, what: str) -> str:
    if not NAME.fullmatch(value):
        raise ValueError(f"A step's {what} is 1 to 64 letters, digits, _ or -: not {value[:80]!r}.")
    return value


def _one_of(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:  # a node's bug: say so where it is made
        raise ValueError(f"{value!r} is not a step {what}: one of {', '.join(allowed)}.")
    return value


def step_record(frame: dict[str, Any]) -> dict[str, Any]:
    """A step as kept with its reply (`meta.steps`) and in `ready.running.steps`."""
    return {name: frame[name] for name in STEP_FIELDS if name in frame}


def pressed(conversation_id: str, message_id: str, step: str, button: str) -> dict[str, Any]:
    """A button of a reply's step was pressed (once, for good): every page shows it chosen."""
    return {
        "type": "pressed",
        "conversation_id": conversation_id,
        "message_id": message_id,
        "step": step,
        "button": button,
    }
