"""What both stores write for an import and read for a JSON export: a conversation's whole tree, as rows.

The columns `messages.parent_id` and `conversations.leaf_id` hold the tree (the schema's versions step);
an import writes them as the file gives them, under new ids. The statements are in each store's SQL:
`sqlite_transfer.py`, `postgres_transfer.py`.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pocketchat.records import read_json_columns
from pocketchat.transfer.tree import ConversationTree, TreeMessage
from utils.clean import stored_json

CONVERSATION_COLUMNS = (
    "id", "owner", "title", "model", "system_prompt", "created_at", "updated_at", "tools_off", "leaf_id",
    "sampling", "flow",
)  # fmt: skip
MESSAGE_COLUMNS = (
    "id", "conversation_id", "parent_id", "role", "content", "reasoning", "status", "error", "meta", "created_at",
)  # fmt: skip


UNFINISHED_COLUMNS = ("conversation_id", "import_id", "partial")
# The conversations an import is still writing in parts (a long one): no one lists, opens or finds them.
PARTIAL = "(SELECT conversation_id FROM unfinished_imports WHERE partial)"
# Whether a conversation read is one an import is still writing (it changes nothing until that ends).
IMPORTING = (
    "EXISTS (SELECT 1 FROM unfinished_imports WHERE unfinished_imports.conversation_id = conversations.id) AS importing"
)
# What became of a conversation loaded while its import ran (Store.import_state).
ImportState = Literal["importing", "kept", "gone"]


def import_state(importing: bool, there: bool) -> ImportState:
    """A conversation an import wrote: still being written, kept (the import ended), or gone (it failed)."""
    return "importing" if importing else "kept" if there else "gone"


class ImportStopped(Exception):
    """The import is no longer running: it was found stopped (its replica seemed gone) and undone."""


KEEP_SECONDS = 3600  # how long an ended import's status can be asked for


@dataclass(frozen=True)
class StoredImport:
    """An import as the database has it, for whichever replica is asked how it goes."""

    owner: str
    wire: dict[str, Any]  # what `GET /api/imports/{id}` says (ImportJob.to_wire)
    replica: str | None  # the replica writing it, while it runs
    told_at: float  # when its last batch landed, or when it ended

    @classmethod
    def from_row(cls, import_id: str, row: Mapping[str, Any]) -> "StoredImport":
        wire = {"id": import_id, "status": row["status"], "total": row["total"], "imported": row["imported"]}
        wire["dropped"] = json.loads(row["dropped"])
        return cls(
            row["owner"], wire | ({"error": row["error"]} if row["error"] else {}), row["replica"], row["told_at"]
        )


def conversation_rows(owner: str, trees: list[ConversationTree]) -> list[tuple[Any, ...]]:
    return [
        (
            *(t.id, owner, t.title, t.model, t.system_prompt, t.created_at, t.updated_at),
            *(json.dumps(t.tools_off), t.leaf_id, json.dumps(t.sampling), t.flow),
        )
        for t in trees
    ]


def message_rows(trees: list[ConversationTree]) -> list[tuple[Any, ...]]:
    """Every message of the trees, parents before their children (the order `seq` keeps)."""
    return [row for tree in trees for row in rows_of(tree.id, tree.messages)]


def rows_of(conversation_id: str, messages: list[TreeMessage]) -> list[tuple[Any, ...]]:
    """These messages of a conversation, in the order given."""
    return [
        (
            *(m.id, conversation_id, m.parent_id, m.role, m.content, m.reasoning, m.status, m.error),
            *(json.dumps(m.meta), m.created_at),
        )
        for m in messages
    ]


def tree_from_rows(conversation: Mapping[str, Any], messages: list[Mapping[str, Any]]) -> ConversationTree:
    return ConversationTree(
        id=conversation["id"],
        title=conversation["title"],
        model=conversation["model"],
        system_prompt=conversation["system_prompt"],
        created_at=conversation["created_at"],
        updated_at=conversation["updated_at"],
        leaf_id=conversation["leaf_id"],
        flow=conversation["flow"],
        **read_json_columns(conversation),
        messages=[
            TreeMessage(
                id=row["id"],
                parent_id=row["parent_id"],
                role=row["role"],
                content=row["content"],
                reasoning=row["reasoning"],
                status=row["status"],
                error=row["error"],
                meta=stored_json(row["meta"], {}),
                created_at=row["created_at"],
            )
            for row in messages
        ],
    )
