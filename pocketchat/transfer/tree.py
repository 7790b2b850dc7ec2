"""A conversation's whole tree of messages, as a file holds it and as the store writes and reads it, and
the checks every imported tree passes before anything is stored."""

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pocketchat.records import new_id

ROLES = ("user", "assistant")
STATUSES = ("complete", "stopped", "error", "interrupted")  # a reply left streaming is imported interrupted
MAX_MESSAGES = 100_000  # of one conversation
MAX_CONVERSATIONS = 100_000  # of one file


class BadFile(Exception):
    """A file that cannot be imported; `message` says where and why (never echoing its text)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class TreeMessage:
    id: str
    parent_id: str | None  # the message before it on its path; None for a first message
    role: str
    content: str
    reasoning: str = ""
    status: str = "complete"
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0


@dataclass
class ConversationTree:
    """One conversation with every message of every branch, parents before their children. `model` and
    `system_prompt` are None when the file has none: the importing app's defaults are taken."""

    title: str | None
    model: str | None
    system_prompt: str | None
    created_at: float
    updated_at: float
    leaf_id: str | None  # the last message of the chosen path; None: the latest message
    messages: list[TreeMessage]
    tools_off: list[str] = field(default_factory=list)
    sampling: dict[str, float] = field(default_factory=dict)  # temperature, top_p, max_tokens: those set
    flow: str = ""  # the flow its turns run ("": the importing app's default)
    id: str = ""  # as the file or the store names it
    # What the file held that was left out, by kind (ChatGPT's tool calls, hidden messages, images...).
    dropped: dict[str, int] = field(default_factory=dict)

    def with_new_ids(self) -> "ConversationTree":
        """The same tree under ids of its own: an import never writes over a stored conversation."""
        ids = {message.id: new_id() for message in self.messages}
        messages = [
            replace(message, id=ids[message.id], parent_id=ids.get(message.parent_id or ""))
            for message in self.messages
        ]
        return replace(self, id=new_id(), messages=messages, leaf_id=ids.get(self.leaf_id or ""))


def text(value: Any, where: str, *, optional: bool = False, limit: int | None = None) -> str | None:
    """`value` if it is text that both databases can store (no lone surrogate, no NUL); else BadFile."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise BadFile(f"{where} must be text{' or null' if optional else ''}.")
    if "\x00" in value:
        raise BadFile(f"{where} holds a NUL character, which cannot be stored.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadFile(f"{where} holds a lone surrogate (half of a character), which is not valid Unicode.") from None
    if limit is not None and len(value) > limit:
        raise BadFile(f"{where} is over {limit:,} characters.")
    return value


def number(value: Any, where: str, *, optional: bool = False) -> float | None:
    """`value` as a finite number of seconds (a time); else BadFile."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadFile(f"{where} must be a number{' or null' if optional else ''}.")
    return float(value)


def check_tree(messages: list[TreeMessage], leaf_id: str | None, where: str) -> list[TreeMessage]:
    """The messages with every parent before its children (otherwise in their order), once their ids are
    unique, every parent is one of them and no message is its own ancestor; `leaf_id`, if any, must be
    one of them."""
    if len(messages) > MAX_MESSAGES:
        raise BadFile(f"{where} has over {MAX_MESSAGES:,} messages.")
    ids: set[str] = set()
    for message in messages:
        if message.id in ids:
            raise BadFile(f"{where}: two messages have the id {message.id!r}.")
        ids.add(message.id)
    ordered: list[TreeMessage] = []
    placed: set[str | None] = {None}
    waiting: dict[str, list[TreeMessage]] = {}  # by the parent they wait for
    for message in messages:
        if message.parent_id is not None and message.parent_id not in ids:
            raise BadFile(f"{where}, message {message.id!r}: its parent {message.parent_id!r} is not in the file.")
        if message.parent_id not in placed:
            waiting.setdefault(message.parent_id or "", []).append(message)
            continue
        now = [message]
        while now:  # a message placed lets the children that waited for it follow
            ready = now.pop()
            ordered.append(ready)
            placed.add(ready.id)
            now.extend(reversed(waiting.pop(ready.id, [])))
    if waiting:  # only messages whose ancestors go round in a cycle are never placed
        stuck = next(iter(waiting.values()))[0].id
        raise BadFile(f"{where}, message {stuck!r}: its parents go round in a cycle.")
    if leaf_id is not None and leaf_id not in ids:
        raise BadFile(f"{where}: the chosen message {leaf_id!r} is not in the file.")
    return ordered
