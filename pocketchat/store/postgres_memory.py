"""The statements of a user's memory in PostgreSQL: a part of `PostgresStore`, on its write queue and its
reads. Each names the owner (pocketchat/store/memory.py)."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from pocketchat.store.memory import FACT_COLUMNS, Fact, Memory
from pocketchat.store.postgres_attachments import rows_changed

FACTS = f"SELECT {', '.join(FACT_COLUMNS)} FROM facts WHERE owner = $1 ORDER BY created_at, id"
IS_OFF = "SELECT 1 FROM memory_off WHERE owner = $1"


class PostgresMemory:
    """The facts remembered about each user, and who turned memory off."""

    # PostgresStore's: queue a write (work, conversation id, retry) and run a read.
    _write: Callable[..., asyncio.Future[Any]]
    _read: Callable[[Callable[[asyncpg.Connection], Awaitable[Any]]], Awaitable[Any]]

    async def read_memory(self, owner: str, even_off: bool = False) -> Memory:
        async def work(db: asyncpg.Connection) -> Memory:
            on = await db.fetchval(IS_OFF, owner) is None
            if not on and not even_off:
                return Memory(False, [])  # off: the memory flow reads none of its facts
            return Memory(on, [Fact.from_row(row) for row in await db.fetch(FACTS, owner)])

        return await self._read(work)

    def add_facts(self, owner: str, facts: list[Fact], most: int) -> asyncio.Future[list[str]]:
        marks = ", ".join(f"${number}" for number in range(1, len(FACT_COLUMNS) + 1))
        insert = f"INSERT INTO facts ({', '.join(FACT_COLUMNS)}) VALUES ({marks})"

        async def work(db: asyncpg.Connection) -> list[str]:
            # Checked in the write: memory turned off, or filled, while the reply was written keeps nothing.
            # A lock on the owner's name holds off a concurrent add of theirs (another replica's) until this
            # one commits, so two cannot both pass the count.
            await db.execute("SELECT pg_advisory_xact_lock(hashtext('facts:' || $1))", owner)
            if await db.fetchval(IS_OFF, owner) is not None:
                return []
            room = most - await db.fetchval("SELECT count(*) FROM facts WHERE owner = $1", owner)
            kept = facts[: max(room, 0)]
            await db.executemany(insert, [fact.to_row() for fact in kept])
            return [fact.id for fact in kept]

        return self._write(work, None, retry=False)

    def change_fact(
        self, owner: str, fact_id: str, text: str, vector: bytes, embedder: str
    ) -> asyncio.Future[Fact | None]:
        query = (
            "UPDATE facts SET text = $1, vector = $2, embedder = $3, updated_at = $4 WHERE id = $5 AND owner = $6"
            f" RETURNING {', '.join(FACT_COLUMNS)}"
        )
        args = (text, vector, embedder, time.time(), fact_id, owner)

        async def work(db: asyncpg.Connection) -> Fact | None:
            row = await db.fetchrow(query, *args)
            return None if row is None else Fact.from_row(row)

        return self._write(work, None, retry=False)

    def delete_fact(self, owner: str, fact_id: str) -> asyncio.Future[bool]:
        query = "DELETE FROM facts WHERE id = $1 AND owner = $2"

        async def work(db: asyncpg.Connection) -> bool:
            return rows_changed(await db.execute(query, fact_id, owner)) > 0

        return self._write(work, None, retry=False)

    def forget_facts(self, owner: str) -> asyncio.Future[int]:
        async def work(db: asyncpg.Connection) -> int:
            return rows_changed(await db.execute("DELETE FROM facts WHERE owner = $1", owner))

        return self._write(work, None, retry=False)

    def turn_memory(self, owner: str, on: bool) -> asyncio.Future[Any]:
        off = "INSERT INTO memory_off (owner, since) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        query, args = ("DELETE FROM memory_off WHERE owner = $1", (owner,)) if on else (off, (owner, time.time()))

        async def work(db: asyncpg.Connection) -> None:
            await db.execute(query, *args)

        return self._write(work, None, retry=False)
