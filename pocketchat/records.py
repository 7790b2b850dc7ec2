"""The records a conversation is made of, as stored and as sent in `ready.history`."""

import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from utils.clean import stored_json

Role = Literal["user", "assistant"]
# streaming: a reply being written; interrupted: a reply a crash or shutdown cut short.
Status = Literal["complete", "streaming", "stopped", "error", "interrupted"]


def new_id() -> str:
    """An unguessable id (128 bits)."""
    return secrets.token_urlsafe(16)


# Every id this app ever made is base64url (22 characters; a few older ones, hand-made, are shorter).
POSSIBLE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def possible_id(text: str) -> bool:
    """Whether `text` could be an id at all: one that cannot (a NUL, a lone surrogate, a megabyte) is
    answered as unknown without asking the database, which might choke on it (PostgreSQL refuses NUL)."""
    return POSSIBLE_ID.fullmatch(text) is not None


@dataclass
class ImageRecord:
    """An image uploaded to a conversation: waiting to go with the next user message (`message_id` None),
    then that message's. Its bytes are stored beside it, read only to send or show it."""

    conversation_id: str
    owner: str
    name: str
    type: str  # image/png, image/jpeg or image/webp: what its bytes are, whatever its name says
    size: int  # bytes
    width: int
    height: int
    message_id: str | None = None
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)

    FIELDS = (
        "id", "conversation_id", "owner", "message_id", "name", "type", "size", "width", "height", "created_at",
    )  # fmt: skip
    WIRE = ("id", "name", "type", "size", "width", "height")  # what a client is told

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "ImageRecord":
        return cls(**{name: row[name] for name in cls.FIELDS})

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], conversation_id: str, owner: str, message_id: str) -> "ImageRecord":
        return cls(conversation_id, owner, message_id=message_id, **{name: wire[name] for name in cls.WIRE})

    def to_row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.WIRE}


@dataclass
class Message:
    role: Role
    content: str
    status: Status = "complete"
    turn_id: str | None = None
    id: str = field(default_factory=new_id)
    reasoning: str = ""
    error: str | None = None
    # The reply's model, usage, ttft_ms and tokens_per_second.
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    # A user message's images, in the order sent (stored in their own table, which names the message).
    images: list[ImageRecord] = field(default_factory=list)
    # The message before it on its path (None: a conversation's first). Versions of a message (a reply
    # answered again, an edited message) share their parent.
    parent_id: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Message":
        """A message as a database row holds it (SQLite's or PostgreSQL's; `meta` is JSON text, read back
        safe whatever wrote it: see `stored_json`)."""
        names = ("id", "turn_id", "role", "content", "reasoning", "status", "error", "created_at", "parent_id")
        return cls(**{name: row[name] for name in names}, meta=stored_json(row["meta"], {}))

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], conversation_id: str, owner: str) -> "Message":
        """A user message as `turn_start` carries it (a replica following a turn that runs elsewhere)."""
        images = [ImageRecord.from_wire(image, conversation_id, owner, wire["id"]) for image in wire.get("images", ())]
        names = ("id", "role", "content", "status")
        return cls(**{name: wire[name] for name in names}, images=images, parent_id=wire.get("parent_id"))

    def to_row(self, conversation_id: str) -> tuple[Any, ...]:
        """The message as both stores write it: (id, conversation_id, turn_id, role, content, reasoning,
        status, error, meta as JSON text, created_at, parent_id)."""
        return (
            self.id,
            conversation_id,
            self.turn_id,
            self.role,
            self.content,
            self.reasoning,
            self.status,
            self.error,
            json.dumps(self.meta),
            self.created_at,
            self.parent_id,
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "role": self.role, "content": self.content, "status": self.status}
        if self.reasoning:
            wire["reasoning"] = self.reasoning
        if self.error:
            wire["error"] = self.error
        if self.meta:
            wire["meta"] = self.meta
        if self.images:
            wire["images"] = [image.to_wire() for image in self.images]
        return wire


def with_images(messages: list[Message], images: Iterable[ImageRecord]) -> list[Message]:
    """`messages`, each given its images (as a store loads them: the images of the conversation's messages,
    in the order they were uploaded)."""
    by_id = {message.id: message for message in messages}
    for image in images:
        if (message := by_id.get(image.message_id or "")) is not None:
            message.images.append(image)
    return messages


# The range of each of a conversation's own sampling values, as a PATCH and an import check them (the
# reply's tokens: a bound on nonsense, well above any model's reply).
SAMPLING_RANGES = {"temperature": (0, 2), "top_p": (0, 1), "max_tokens": (1, 1_000_000)}

# The fields of a conversation's record that can be changed (PATCH), each written on its own.
RECORD_FIELDS = ("title", "model", "system_prompt", "tools_off", "sampling", "flow")
CONVERSATION_COLUMNS = (
    "id", "owner", "title", "model", "system_prompt", "created_at", "updated_at", "tools_off", "sampling", "flow",
)  # fmt: skip
JSON_COLUMNS = ("tools_off", "sampling")  # kept as JSON text in both databases


def read_json_columns(row: Mapping[str, Any]) -> dict[str, Any]:
    """A conversation's JSON_COLUMNS as read, safe whatever wrote them: the sources turned off (names), and
    the sampling values it knows (numbers, sent to the provider)."""
    tools_off = [name for name in stored_json(row["tools_off"], []) if isinstance(name, str)]
    sampling = {
        name: value
        for name, value in stored_json(row["sampling"], {}).items()
        if name in SAMPLING_RANGES and isinstance(value, int | float) and not isinstance(value, bool)
    }
    return {"tools_off": tools_off, "sampling": sampling}


@dataclass
class ConversationRecord:
    model: str
    system_prompt: str
    title: str | None = None
    owner: str = "local"  # who may see it: the one local user, or the user an authenticating proxy names
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    # The tool sources turned off in this conversation: "builtin", or an MCP server's name.
    tools_off: list[str] = field(default_factory=list)
    # The last message of the path shown (of the versions, those chosen); None: the latest message. Not
    # one of CONVERSATION_COLUMNS: a new conversation has none, and a switch writes it alone.
    leaf_id: str | None = None
    # Which write of the path (`leaf_id`) this copy shows, or is writing: a path write replaces the version
    # it names, and only that one (pocketchat/paths.py). Written with `leaf_id`, never on its own.
    path_version: int = 0
    # The conversation's own `temperature`, `top_p` and `max_tokens`: only those set (the provider's
    # default for the others, which are not sent).
    sampling: dict[str, float] = field(default_factory=dict)
    # The flow its turns run, by name in flow.py's FLOWS; "" for the deployment's own (--flow), whatever it is.
    flow: str = ""
    # Read, never written: an import is still writing it (as read when the conversation was loaded; see
    # Hub.check_changeable). Should the import fail, it goes with the rest.
    importing: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "ConversationRecord":
        values = {name: row[name] for name in CONVERSATION_COLUMNS}
        return cls(**values | read_json_columns(values), leaf_id=row["leaf_id"], path_version=row["path_version"])

    def to_row(self) -> tuple[Any, ...]:
        """The record as both stores write it, in the order of CONVERSATION_COLUMNS."""
        return tuple(self.column(name) for name in CONVERSATION_COLUMNS)

    def column(self, name: str) -> Any:
        """The field `name` as both stores write it (a list as JSON text)."""
        value = getattr(self, name)
        return json.dumps(value) if name in JSON_COLUMNS else value

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "model": self.model,
            "system_prompt": self.system_prompt,
            "tools_off": self.tools_off,
            "sampling": self.sampling,
            "flow": self.flow,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


# indexing: its passages are being read, cut and embedded; ready: it is searched; failed: `error` says why.
DocumentStatus = Literal["indexing", "ready", "failed"]


@dataclass
class DocumentRecord:
    """A file attached to a conversation, and how far its indexing went."""

    conversation_id: str
    owner: str
    name: str
    size: int  # bytes, as uploaded
    status: DocumentStatus = "indexing"
    error: str | None = None
    progress: float = 0.0  # of the indexing, from 0 to 1
    chunks: int = 0  # passages, once ready
    embedder: str = ""  # the embedding model of its vectors: another model's are not comparable
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)  # the indexing's last sign of life

    FIELDS = (
        "id", "conversation_id", "owner", "name", "size", "status", "error", "progress", "chunks", "embedder",
        "created_at", "updated_at",
    )  # fmt: skip

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "DocumentRecord":
        return cls(**{name: row[name] for name in cls.FIELDS})

    def to_row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "status": self.status,
            "progress": round(self.progress, 3),
            "chunks": self.chunks,
        }
        if self.error:
            wire["error"] = self.error
        return wire


@dataclass(frozen=True)
class MessageHit:
    """A message that a search of a user's conversations found."""

    conversation_id: str
    title: str | None
    role: Role
    content: str
    created_at: float


@dataclass(frozen=True)
class Passage:
    """A stored passage of a document, as retrieval returns it."""

    id: int
    document_id: str
    name: str  # the document's file name
    page: int | None
    text: str
    seq: int = 0  # its place in the document

    @property
    def source(self) -> str:
        """How a reply cites it: the file, and the page when it has pages."""
        return self.name if self.page is None else f"{self.name}, p. {self.page}"


@dataclass
class ShareRecord:
    """A live link to a conversation (revoking it deletes it); its token is never kept."""

    conversation_id: str
    owner: str
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at}
