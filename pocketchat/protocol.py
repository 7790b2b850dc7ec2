"""The WebSocket wire format, declared once (docs/protocol.md describes the same frames).

`parse_client_frame` is the one place a client frame is read; every server frame has one
constructor here; every `error.code` is an exception class of `pocketchat/errors.py`.
"""

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pocketchat.errors import BadFrame, ProtocolError, ProviderError, RateLimited, TooLarge
from pocketchat.records import ConversationRecord, possible_id

PROTOCOL_VERSION = 1
# Protocol 1 began by calling a conversation's id `session_id`: that name is still read in `hello` and still
# sent beside `conversation_id` (`conversation_ids`), here only.
OLD_CONVERSATION_ID = "session_id"
MAX_DEPTH = 64  # lists and objects in one frame, nested (a tool declaration's schema, a tool's result)


def unicode_text(value: object) -> object:
    """Refuse text that cannot be sent or stored: JSON's `\\ud83d` escapes decode to lone surrogates,
    which no UTF-8 socket or database accepts, and `\\u0000` to a NUL, which PostgreSQL refuses."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
        if "\x00" in value:  # PostgreSQL text cannot hold it
            raise ValueError("must not hold a NUL character")
    return value


# Before the other checks: a lone surrogate also breaks pydantic's own pattern matching.
Unicode = BeforeValidator(unicode_text)
ConversationId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=64), Unicode]
Content = Annotated[str, StringConstraints(strict=True, pattern=r"\S"), Unicode]


class _Frame(BaseModel):
    # Unknown fields are ignored so that newer clients can talk to this server.
    model_config = ConfigDict(extra="ignore", frozen=True)


ToolName = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9_-]{1,48}$")]
CallId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=128), Unicode]
MAX_CLIENT_TOOLS = 32


class ToolDeclaration(_Frame):
    """A tool a client offers the model: called `client.<name>`; `parameters` is its arguments' JSON schema."""

    name: ToolName
    description: Annotated[str, StringConstraints(strict=True, max_length=2000), Unicode] = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Hello(_Frame):
    type: Literal["hello"]
    conversation_id: ConversationId | None = None  # the conversation to attach to (None: a new one)
    # Tools this client offers from now on; absent: those it declared before, if any.
    tools: Annotated[list[ToolDeclaration], Field(max_length=MAX_CLIENT_TOOLS)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """A conversation named by its old name, when it is not named by its own."""
        if isinstance(data, dict) and data.get("conversation_id") is None and OLD_CONVERSATION_ID in data:
            return {**data, "conversation_id": data[OLD_CONVERSATION_ID]}
        return data


def image_id(value: str) -> str:
    if not possible_id(value):
        raise ValueError("is not an image id")
    return value


ImageId = Annotated[str, StringConstraints(strict=True), AfterValidator(image_id)]
MAX_IMAGE_IDS = 100  # a bound on the frame's work; the setting --limit-images-per-message is checked later


class UserMessage(_Frame):
    """The user's message: starts a turn. `images` names images uploaded to the conversation for it
    (`POST .../images`); with images, the text may be empty."""

    type: Literal["message"]
    # Before `content`: its check reads them.
    images: Annotated[list[ImageId], Field(max_length=MAX_IMAGE_IDS)] = []
    content: Annotated[str, StringConstraints(strict=True), Unicode]

    @field_validator("content")
    @classmethod
    def _not_empty(cls, content: str, info: ValidationInfo) -> str:
        if not content.strip() and not info.data.get("images"):
            # The type the pattern of `Content` gives: the message says "'content' must not be empty".
            raise PydanticCustomError("string_pattern_mismatch", "must not be empty")
        return content


class Stop(_Frame):
    type: Literal["stop"]
    turn_id: Annotated[str, StringConstraints(strict=True), Unicode] | None = None


class Regenerate(_Frame):
    type: Literal["regenerate"]


class Edit(_Frame):
    type: Literal["edit"]
    message_id: Annotated[str, StringConstraints(strict=True, min_length=1), Unicode]
    content: Content


class Switch(_Frame):
    """Show the versions on the path through this message (every socket of the conversation is told)."""

    type: Literal["switch"]
    message_id: Annotated[str, StringConstraints(strict=True, min_length=1), Unicode]


class ToolCallAck(_Frame):
    """The client runs the call it got as `tool_call`."""

    type: Literal["tool_call_ack"]
    call_id: CallId


class ToolCallNack(_Frame):
    """The client refuses the call: the model is told it was denied, and why."""

    type: Literal["tool_call_nack"]
    call_id: CallId
    reason: Annotated[str, StringConstraints(strict=True, max_length=1000), Unicode] = ""


class ToolResult(_Frame):
    """The result of a client's tool call (any JSON; text as it is), or its `error`."""

    type: Literal["tool_result"]
    call_id: CallId
    result: Any = None
    error: Annotated[str, StringConstraints(strict=True, max_length=4000), Unicode] | None = None


StepName = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class Press(_Frame):
    """A button of a step pressed: back to the flow that showed it (pocketchat/presses.py)."""

    type: Literal["press"]
    message_id: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=64), Unicode]
    step: StepName
    button: StepName


ClientFrame = Hello | UserMessage | Stop | Regenerate | Edit | Switch | ToolCallAck | ToolCallNack | ToolResult | Press
CLIENT_FRAME_TYPES = [frame.model_fields["type"].annotation.__args__[0] for frame in ClientFrame.__args__]
_client_frame: TypeAdapter[ClientFrame] = TypeAdapter(Annotated[ClientFrame, Field(discriminator="type")])


def parse_client_frame(message: Mapping[str, Any], max_bytes: int) -> ClientFrame:
    """Read one ASGI `websocket.receive` message as a client frame, or raise the error to send back."""
    text = message.get("text")
    if text is None:
        raise BadFrame("Binary frames are not accepted; send JSON text.")
    if len(text) > max_bytes or len(text.encode()) > max_bytes:
        raise TooLarge(f"Frame is over the {max_bytes}-byte limit.")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        data = _loads_slowly(text)
    if not isinstance(data, dict):
        raise BadFrame("Frame must be a JSON object.")
    if _too_deep(data):
        raise BadFrame(f"Frame is nested too deeply (over {MAX_DEPTH} levels).")
    if data.get("type") not in CLIENT_FRAME_TYPES:
        shown = repr(data.get("type"))[:40]  # not echoed whole: a client could make it any size
        raise BadFrame(f"Unknown frame type {shown}; expected one of {', '.join(CLIENT_FRAME_TYPES)}.")
    try:
        return _client_frame.validate_python(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:]) or "frame"
        if first["type"] == "string_pattern_mismatch":
            raise BadFrame(f"'{where}' must not be empty.") from None
        message = first["msg"].removeprefix("Value error, ")
        raise BadFrame(f"'{where}': {message}.") from None


def _too_deep(data: Any) -> bool:
    """Whether `data` nests lists and objects over MAX_DEPTH deep: what reads it later (the model's prompt,
    the database's JSON) would recurse that deep. Walked without recursion."""
    level: list[Any] = [data]
    for _ in range(MAX_DEPTH + 1):
        level = [
            inner
            for value in level
            for inner in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
            if isinstance(inner, dict | list)
        ]
        if not level:
            return False
    return True


def _loads_slowly(text: str) -> Any:
    """A frame orjson refused, read by the json module: it reads what orjson does not (the escape of a
    lone surrogate, which the frame's checks then refuse by name; NaN) and says why the rest fails."""
    try:
        return json.loads(text)
    except ValueError:
        raise BadFrame("Frame is not valid JSON.") from None
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack
        raise BadFrame("Frame is nested too deeply.") from None


def encode(frame: Any) -> str:
    """One frame (or part of one) as the text sent on the wire: compact JSON, text as it is, not escaped.
    orjson encodes it in a fraction of the json module's time; what orjson refuses (an integer over 64
    bits in a client tool's result, a lone surrogate) the json module encodes, or refuses, as before."""
    try:
        return orjson.dumps(frame, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def ready(
    conversation_id: str,
    title: str | None,
    model: str,
    system_prompt: str,
    history: list[dict[str, Any]],
    running: dict[str, Any] | None,
    provider: dict[str, Any],
    tools_off: list[str] | None = None,
    sampling: dict[str, float] | None = None,
    flow: str = "",
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "ready",
        "protocol": PROTOCOL_VERSION,
        **conversation_ids(conversation_id),
        "title": title,
        "model": model,
        "system_prompt": system_prompt,
        "tools_off": tools_off or [],
        "sampling": sampling or {},
        "flow": flow,
        "provider": provider,
        "history": history,
    }
    if running is not None:
        frame["running"] = running
    return frame


def ready_text(
    conversation_id: str,
    title: str | None,
    model: str,
    system_prompt: str,
    history_json: str,
    running: dict[str, Any] | None,
    provider: dict[str, Any],
    tools_off: list[str] | None = None,
    sampling: dict[str, float] | None = None,
    flow: str = "",
) -> str:
    """`ready`, encoded, with its history encoded already (`encode([m.to_wire() ...])`): the same text
    as `encode(ready(...))`, without encoding a long history again."""
    head = encode(ready(conversation_id, title, model, system_prompt, [], None, provider, tools_off, sampling, flow))
    assert head.endswith(',"history":[]}')  # `ready` puts the history last, before `running`
    tail = "" if running is None else ',"running":' + encode(running)
    return head.removesuffix("[]}") + history_json + tail + "}"


def turn_start(turn_id: str, message: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """`message`: the user message, with its `parent_id`; `reply`: the reply's `{id, versions?}`."""
    return {"type": "turn_start", "turn_id": turn_id, "message": message, "reply": reply}


def path_text(conversation_id: str, history_json: str) -> str:
    """`path`, encoded, with its history encoded already (as `ready_text`): the path a conversation shows."""
    head = encode({"type": "path", "conversation_id": conversation_id, "history": []})
    return head.removesuffix("[]}") + history_json + "}"


def chunk(
    turn_id: str, seq: int, content: str, reasoning: str | None = None, first_seq: int | None = None
) -> dict[str, Any]:
    """Chunk `seq`; with `first_seq`, chunks `first_seq` to `seq` in one frame, their text joined."""
    frame: dict[str, Any] = {"type": "chunk", "turn_id": turn_id, "seq": seq, "content": content}
    if reasoning:
        frame["reasoning"] = reasoning
    if first_seq is not None and first_seq < seq:
        frame["first_seq"] = first_seq
    return frame


def queued(turn_id: str, position: int) -> dict[str, Any]:
    return {"type": "queued", "turn_id": turn_id, "position": position}


def turn_end(turn_id: str, status: str, message_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {"type": "turn_end", "turn_id": turn_id, "status": status, "message_id": message_id, **stats}


def conversation(record: ConversationRecord) -> dict[str, Any]:
    return {
        "type": "conversation",
        **conversation_ids(record.id),
        "title": record.title,
        "model": record.model,
        "system_prompt": record.system_prompt,
        "tools_off": record.tools_off,
        "sampling": record.sampling,
        "flow": record.flow,
    }


def tool_call(turn_id: str, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """To the client that declared tool `name`: the model calls it; answer with the same `call_id`."""
    return {"type": "tool_call", "turn_id": turn_id, "call_id": call_id, "name": name, "arguments": arguments}


def tool_call_cancel(turn_id: str, call_id: str, reason: str) -> dict[str, Any]:
    """To that client: the call is over without its answer (its time ran out, or the turn stopped)."""
    return {"type": "tool_call_cancel", "turn_id": turn_id, "call_id": call_id, "reason": reason}


def deleted(conversation_id: str) -> dict[str, Any]:
    return {"type": "deleted", **conversation_ids(conversation_id)}


def conversation_ids(conversation_id: str) -> dict[str, str]:
    """A conversation's id as a server frame names it: by its name, and by its old one for old clients."""
    return {"conversation_id": conversation_id, OLD_CONVERSATION_ID: conversation_id}


def document(conversation_id: str, state: dict[str, Any]) -> dict[str, Any]:
    """A document of the conversation changed: `state` is its `{id, name, size, status, progress,
    chunks, error?}`, or `{id, status: "removed"}`."""
    return {"type": "document", "conversation_id": conversation_id, "document": state}


def error(error: ProtocolError) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "error", "code": error.code, "message": error.message}
    if error.turn_id:
        frame["turn_id"] = error.turn_id
    if isinstance(error, ProviderError) and error.status is not None:
        frame["status"] = error.status
    if isinstance(error, RateLimited):
        frame["retry_after"] = error.retry_after
    return frame


SERVER_FRAME_TYPES = [
    "ready",
    "turn_start",
    "path",
    "chunk",
    "queued",
    "step",
    "turn_end",
    "conversation",
    "deleted",
    "document",
    "pressed",
    "tool_call",
    "tool_call_cancel",
    "error",
]
