"""PocketChat's own conversation file (docs/protocol.md, *Conversation files*): what the JSON export
writes and the import reads back, the whole tree of messages with every version.

    {"format": "pocketchat.conversation", "version": 1,
     "conversation": {id, title, model, system_prompt, tools_off, sampling, flow, created_at, updated_at, leaf_id},
     "messages": [{id, parent_id, role, content, reasoning, status, error, meta, created_at}]}
"""

from typing import Any

from pocketchat.records import SAMPLING_RANGES
from pocketchat.transfer.tree import ROLES, STATUSES, BadFile, ConversationTree, TreeMessage, check_tree, number, text

FORMAT = "pocketchat.conversation"
VERSION = 1
ID_CHARS = 200  # an id in a file: ours are 22 characters, other apps' longer; never a megabyte
TITLE_CHARS = 1_000
PROMPT_CHARS = 100_000
# Levels of lists and objects in a message's `meta` (ours: two). The reader's parser takes about 990, but
# the app parses the line again deeper in its stack (a meta 985 deep failed the import there, after the
# file was accepted), and the page's frames are encoded by orjson, which stops at 255.
META_DEPTH = 32


def to_file(tree: ConversationTree) -> dict[str, Any]:
    """The conversation as its file holds it."""
    conversation = {
        "id": tree.id,
        "title": tree.title,
        "model": tree.model,
        "system_prompt": tree.system_prompt,
        "tools_off": tree.tools_off,
        "sampling": tree.sampling,
        "flow": tree.flow,
        "created_at": tree.created_at,
        "updated_at": tree.updated_at,
        "leaf_id": tree.leaf_id,
    }
    messages = [
        {
            "id": m.id,
            "parent_id": m.parent_id,
            "role": m.role,
            "content": m.content,
            "reasoning": m.reasoning,
            "status": m.status,
            "error": m.error,
            "meta": m.meta,
            "created_at": m.created_at,
        }
        for m in tree.messages
    ]
    return {"format": FORMAT, "version": VERSION, "conversation": conversation, "messages": messages}


def is_native(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def from_file(data: dict[str, Any], where: str) -> ConversationTree:
    """A conversation of our own file, checked whole; BadFile naming the first thing wrong."""
    if data.get("version") != VERSION:
        raise BadFile(f"{where} is version {data.get('version')!r} of PocketChat's format; this app reads {VERSION}.")
    conversation = data.get("conversation")
    if not isinstance(conversation, dict):
        raise BadFile(f"{where}: `conversation` must be an object.")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise BadFile(f"{where}: `messages` must be a list.")
    tools_off = conversation.get("tools_off", [])
    if not isinstance(tools_off, list):
        raise BadFile(f"{where}: `tools_off` must be a list of names.")
    created = number(conversation.get("created_at"), f"{where}: `created_at`")
    tree = ConversationTree(
        title=text(conversation.get("title"), f"{where}: `title`", optional=True, limit=TITLE_CHARS),
        model=text(conversation.get("model"), f"{where}: `model`", optional=True, limit=TITLE_CHARS),
        system_prompt=text(
            conversation.get("system_prompt"), f"{where}: `system_prompt`", optional=True, limit=PROMPT_CHARS
        ),
        created_at=created or 0.0,
        updated_at=number(conversation.get("updated_at", created), f"{where}: `updated_at`") or 0.0,
        leaf_id=text(conversation.get("leaf_id"), f"{where}: `leaf_id`", optional=True, limit=ID_CHARS),
        messages=[_message(message, f"{where}, message {number_ + 1}") for number_, message in enumerate(messages)],
        tools_off=[str(text(name, f"{where}: a name in `tools_off`", limit=64)) for name in tools_off],
        sampling=_sampling(conversation.get("sampling", {}), where),
        # A flow the importing app does not offer runs its default: kept, not refused.
        flow=text(conversation.get("flow", ""), f"{where}: `flow`", limit=64) or "",
        id=text(conversation.get("id", ""), f"{where}: `id`", limit=ID_CHARS) or "",
    )
    tree.messages = check_tree(tree.messages, tree.leaf_id, where)
    return tree


def _sampling(data: Any, where: str) -> dict[str, float]:
    """A conversation's sampling as PATCH takes it (pocketchat/web/routes.py SamplingChanges), values set only."""
    if not isinstance(data, dict) or not set(data) <= set(SAMPLING_RANGES):
        raise BadFile(f"{where}: `sampling` must be an object of {', '.join(SAMPLING_RANGES)}.")
    for name, value in data.items():
        low, high = SAMPLING_RANGES[name]
        kind = int if name == "max_tokens" else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            raise BadFile(f"{where}: `sampling.{name}` must be a number from {low} to {high}.")
    return dict(data)


def _message(data: Any, where: str) -> TreeMessage:
    if not isinstance(data, dict):
        raise BadFile(f"{where} must be an object.")
    role = data.get("role")
    if role not in ROLES:
        raise BadFile(f"{where}: `role` must be one of {', '.join(ROLES)}.")
    status = data.get("status", "complete")
    if status == "streaming":
        status = "interrupted"  # exported while it streamed: what was written so far
    if status not in STATUSES:
        raise BadFile(f"{where}: `status` must be one of {', '.join(STATUSES)}.")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise BadFile(f"{where}: `meta` must be an object.")
    _check_values(meta, f"{where}: `meta`")
    return TreeMessage(
        id=str(text(data.get("id"), f"{where}: `id`", limit=ID_CHARS)),
        parent_id=text(data.get("parent_id"), f"{where}: `parent_id`", optional=True, limit=ID_CHARS),
        role=role,
        content=str(text(data.get("content"), f"{where}: `content`")),
        reasoning=str(text(data.get("reasoning", ""), f"{where}: `reasoning`")),
        status=status,
        error=text(data.get("error"), f"{where}: `error`", optional=True),
        meta=meta,
        created_at=number(data.get("created_at"), f"{where}: `created_at`") or 0.0,
    )


def _check_values(value: Any, where: str, depth: int = 0) -> None:
    """Every text inside a JSON value (keys too) must be storable, and the value no deeper than META_DEPTH."""
    if isinstance(value, dict | list) and depth == META_DEPTH:
        raise BadFile(f"{where} is nested over {META_DEPTH} levels deep.")
    if isinstance(value, str):
        text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            text(key, where)
            _check_values(item, where, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_values(item, where, depth + 1)
    elif isinstance(value, float):
        number(value, where)
