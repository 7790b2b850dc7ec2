"""The statements of a user's memory in SQLite: a part of `SqliteStore`, on its write queue and its reads.
Each names the owner (pocketchat/store/memory.py)."""

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat.store.memory import FACT_COLUMNS, Fact, Memory

FACTS = f"SELECT {', '.join(FACT_COLUMNS)} FROM facts WHERE owner = ? ORDER BY created_at, id"
IS_OFF = "SELECT 1 FROM memory_off WHERE owner = ?"


class SqliteMemory:
    """The facts remembered about each user, and who turned memory off."""

    # SqliteStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

    async def read_memory(self, owner: str, even_off: bool = False) -> Memory:
        def work(db: sqlite3.Connection) -> Memory:
            on = db.execute(IS_OFF, (owner,)).fetchone() is None
            if not on and not even_off:
                return Memory(False, [])  # off: the memory flow reads none of its facts
            return Memory(on, [Fact.from_row(row) for row in db.execute(FACTS, (owner,))])

        return await self._read(work)

    def add_facts(self, owner: str, facts: list[Fact], most: int) -> asyncio.Future[list[str]]:
        insert = f"INSERT INTO facts ({', '.join(FACT_COLUMNS)}) VALUES ({', '.join('?' * len(FACT_COLUMNS))})"

        def work(db: sqlite3.Connection) -> list[str]:
            # Checked in the write: memory turned off, or filled, while the reply was written keeps nothing.
            if db.execute(IS_OFF, (owner,)).fetchone() is not None:
                return []
            room = most - db.execute("SELECT count(*) FROM facts WHERE owner = ?", (owner,)).fetchone()[0]
            kept = facts[: max(room, 0)]
            db.executemany(insert, [fact.to_row() for fact in kept])
            return [fact.id for fact in kept]

        return self._write(work, None, retry=False)

    def change_fact(
        self, owner: str, fact_id: str, text: str, vector: bytes, embedder: str
    ) -> asyncio.Future[Fact | None]:
        query = (
            "UPDATE facts SET text = ?, vector = ?, embedder = ?, updated_at = ? WHERE id = ? AND owner = ?"
            f" RETURNING {', '.join(FACT_COLUMNS)}"
        )
        args = (text, vector, embedder, time.time(), fact_id, owner)

        def work(db: sqlite3.Connection) -> Fact | None:
            row = db.execute(query, args).fetchone()
            return None if row is None else Fact.from_row(row)

        return self._write(work, None, retry=False)

    def delete_fact(self, owner: str, fact_id: str) -> asyncio.Future[bool]:
        query = "DELETE FROM facts WHERE id = ? AND owner = ?"
        return self._write(lambda db: db.execute(query, (fact_id, owner)).rowcount > 0, None, retry=False)

    def forget_facts(self, owner: str) -> asyncio.Future[int]:
        return self._write(lambda db: db.execute("DELETE FROM facts WHERE owner = ?", (owner,)).rowcount, None, False)

    def turn_memory(self, owner: str, on: bool) -> asyncio.Future[Any]:
        if on:
            return self._write(lambda db: db.execute("DELETE FROM memory_off WHERE owner = ?", (owner,)), None, False)
        query = "INSERT OR IGNORE INTO memory_off (owner, since) VALUES (?, ?)"
        return self._write(lambda db: db.execute(query, (owner, time.time())), None, retry=False)
