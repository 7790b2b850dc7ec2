"""What both stores keep of a user's memory (the memory flow: memory_nodes.py, docs/memory.md): the facts
remembered about them, each with its vector, and whether they turned memory off. Every statement names the
owner: no fact is ever read or changed across users. The statements are in each store's SQL:
`sqlite_memory.py`, `postgres_memory.py`."""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

MOST_FACTS = 200  # a user's facts, at most: each turn of the memory flow reads them all
FACT_COLUMNS = ("id", "owner", "text", "vector", "embedder", "created_at", "updated_at")


@dataclass
class Fact:
    """A durable fact about its owner ("Prefers metric units"), with the vector it is recalled by. `embedder`
    names the model that made the vector: vectors of two models are not comparable (as a document's)."""

    owner: str
    text: str
    vector: bytes
    embedder: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def to_row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in FACT_COLUMNS)

    @classmethod
    def from_row(cls, row: Any) -> "Fact":
        return cls(**{name: row[name] for name in FACT_COLUMNS})

    def to_wire(self) -> dict[str, Any]:
        """As the API and the export show it: never its vector."""
        return {"id": self.id, "text": self.text, "created_at": self.created_at, "updated_at": self.updated_at}


@dataclass(frozen=True)
class Memory:
    """A user's memory as read: whether it is on, and (only then) their facts, oldest first."""

    on: bool
    facts: list[Fact]
