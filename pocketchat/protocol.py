"""The WebSocket wire format, declared once (docs/protocol.md describes the same frames).

`parse_client_frame` is the one place a client frame is read; every server frame has one
constructor here; every `error.code` is an exception class here.
"""

import json
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from pocketchat.records import ConversationRecord

PROTOCOL_VERSION = 1


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


class ProtocolError(Exception):
    """An error the client is told about in an `error` frame; the socket stays open."""

    code = "internal"

    def __init__(self, message: str, turn_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.turn_id = turn_id


class BadFrame(ProtocolError):
    code = "bad_frame"


class TooLarge(ProtocolError):
    code = "too_large"


class TurnInProgress(ProtocolError):
    code = "turn_in_progress"

    def __init__(self, message: str = "A reply is still being written; stop it or wait for it to finish.") -> None:
        super().__init__(message)


class UnknownConversation(ProtocolError):
    code = "unknown_conversation"


class NothingToRegenerate(ProtocolError):
    code = "nothing_to_regenerate"


class RateLimited(ProtocolError):
    """The user went over one of their limits; nothing already running is touched."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))  # whole seconds, as HTTP's Retry-After


class Unavailable(ProtocolError):
    """A service PocketChat needs (Redis, with replicas) cannot be reached; trying again later may work."""

    code = "unavailable"


class StorageError(ProtocolError):
    """The database failed to write; what it could not write is kept in memory and written again."""

    code = "storage_error"


class ProviderError(ProtocolError):
    """The model provider failed; `retryable` says whether trying again may help."""

    code = "provider_error"

    def __init__(self, message: str, status: int | None = None, retryable: bool = False, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        # For /metrics: http_<status>, timeout, connection, stream_cut, unreadable, or what raised it.
        self.kind = kind or (f"http_{status}" if status else "other")


ERROR_CODES = [cls.code for cls in ProtocolError.__subclasses__()]


class _Frame(BaseModel):
    # Unknown fields are ignored so that newer clients can talk to this server.
    model_config = ConfigDict(extra="ignore", frozen=True)


class Hello(_Frame):
    type: Literal["hello"]
    conversation_id: ConversationId | None = None
    session_id: ConversationId | None = None  # the deprecated name of conversation_id (protocol 1)

    @property
    def conversation(self) -> str | None:
        """The conversation to attach to (None: a new one), by either name."""
        return self.conversation_id or self.session_id


class Message(_Frame):
    type: Literal["message"]
    content: Content


class Stop(_Frame):
    type: Literal["stop"]
    turn_id: Annotated[str, StringConstraints(strict=True), Unicode] | None = None


class Regenerate(_Frame):
    type: Literal["regenerate"]


class Edit(_Frame):
    type: Literal["edit"]
    message_id: Annotated[str, StringConstraints(strict=True, min_length=1), Unicode]
    content: Content


ClientFrame = Hello | Message | Stop | Regenerate | Edit
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
        data = json.loads(text)
    except ValueError:
        raise BadFrame("Frame is not valid JSON.") from None
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack
        raise BadFrame("Frame is nested too deeply.") from None
    if not isinstance(data, dict):
        raise BadFrame("Frame must be a JSON object.")
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


def encode(frame: dict[str, Any]) -> str:
    """One frame as the text sent on the wire."""
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def ready(
    conversation_id: str,
    title: str | None,
    model: str,
    system_prompt: str,
    history: list[dict[str, Any]],
    running: dict[str, Any] | None,
    provider: dict[str, Any],
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "ready",
        "protocol": PROTOCOL_VERSION,
        "conversation_id": conversation_id,
        "session_id": conversation_id,  # deprecated: the name protocol 1 began with
        "title": title,
        "model": model,
        "system_prompt": system_prompt,
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
) -> str:
    """`ready`, encoded, with its history encoded already (`encode([m.to_wire() ...])`): the same text
    as `encode(ready(...))`, without encoding a long history again."""
    head = encode(ready(conversation_id, title, model, system_prompt, [], None, provider))
    assert head.endswith(',"history":[]}')  # `ready` puts the history last, before `running`
    tail = "" if running is None else ',"running":' + encode(running)
    return head.removesuffix("[]}") + history_json + tail + "}"


def turn_start(turn_id: str, message: dict[str, Any]) -> dict[str, Any]:
    return {"type": "turn_start", "turn_id": turn_id, "message": message}


def chunk(turn_id: str, seq: int, content: str, reasoning: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "chunk", "turn_id": turn_id, "seq": seq, "content": content}
    if reasoning:
        frame["reasoning"] = reasoning
    return frame


def queued(turn_id: str, position: int) -> dict[str, Any]:
    return {"type": "queued", "turn_id": turn_id, "position": position}


def turn_end(turn_id: str, status: str, message_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {"type": "turn_end", "turn_id": turn_id, "status": status, "message_id": message_id, **stats}


def step(turn_id: str, node: str, kind: str, data: Any) -> dict[str, Any]:
    """What a node shows in the page: `kind` says how (`status`, `sources`, `suggestions`, ...)."""
    return {"type": "step", "turn_id": turn_id, "node": node, "kind": kind, "data": data}


def step_record(frame: dict[str, Any]) -> dict[str, Any]:
    """A step as kept with its reply (`meta.steps`) and in `ready.running.steps`."""
    return {"node": frame["node"], "kind": frame["kind"], "data": frame["data"]}


def conversation(record: ConversationRecord) -> dict[str, Any]:
    return {
        "type": "conversation",
        "conversation_id": record.id,
        "session_id": record.id,  # deprecated
        "title": record.title,
        "model": record.model,
        "system_prompt": record.system_prompt,
    }


def deleted(conversation_id: str) -> dict[str, Any]:
    # session_id: deprecated, the name protocol 1 began with
    return {"type": "deleted", "conversation_id": conversation_id, "session_id": conversation_id}


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
    "chunk",
    "queued",
    "step",
    "turn_end",
    "conversation",
    "deleted",
    "error",
]
