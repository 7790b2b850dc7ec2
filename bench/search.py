"""Search: query time and what the index costs the writes, in both storage modes, on 2 cores.

    .venv/bin/python -m bench.search

One database of each kind (a SQLite file; a PostgreSQL database of its own on the local server, the
tests' POCKETCHAT_TEST_POSTGRES) holds 10,000 conversations and 1,000,000 messages of 10 users (1,000
conversations and 100,000 messages each), synthetic text: words drawn from a Zipf distribution over a
vocabulary of common English words and 40,000 made-up ones (user messages of 5 to 35 words, replies of
30 to 130), titled by their first words. Loaded in bulk (executemany, COPY) without the index, which
is then built whole.

- inserts: a turn written as the app writes it (the user message and a streaming reply in one
  transaction, a checkpoint of the reply in another, then the finished reply), one turn after another,
  with the index and without it (SQLite: its triggers dropped; PostgreSQL: its trigger disabled, the GIN
  index then taking an empty entry a row), 7 (SQLite) or 3 rounds each way, alternated, in the same
  run: the median turn, its mean and (SQLite) its median CPU time, as statements alone and through the
  store (its write queue: what a turn of the app waits for), and the ratios;
- search: queries of one user through the store's `search` (what GET /api/search runs), 1 to 3 words
  taken from that user's messages (so that they match), a third of them with the last word cut to its
  first 4 to 6 letters as while typing: median and p95.

`--modes huge`: a 7 MB message found by 4 searches at once, in both modes (bench/search_huge.py).
"""

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import search_huge
from bench.search_corpus import Corpus
from pocketchat.records import Message
from pocketchat.search import parse_query
from pocketchat.store import postgres, sqlite
from pocketchat.store.postgres import PostgresStore
from pocketchat.store.sqlite import SqliteStore
from tests.services import fresh_database

TURNS = {"sqlite": 1000, "postgres": 200}  # turns written for the insert figures, each way and round
# Rounds each way: a SQLite turn takes a tenth of a millisecond, which the load of others on the machine
# swings by as much; more rounds steady its medians.
ROUNDS = {"sqlite": 7, "postgres": 3}


@dataclass
class Turns:
    """A round of turns, in milliseconds: the median and mean wall-clock time of a turn, and the median of
    this process's CPU time (all of SQLite's work, whichever thread: what the load of others leaves out;
    of PostgreSQL's only the client's, not reported)."""

    median: float
    mean: float
    cpu: float


def turns_of(times: list[tuple[float, float]]) -> Turns:
    """The round's figures from each turn's (wall clock, CPU) in milliseconds."""
    wall = [ms for ms, _ in times]
    return Turns(statistics.median(wall), statistics.mean(wall), statistics.median(cpu for _, cpu in times))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


USER_TEXT = "how do I keep the invoice budget within the deadline for the garden contract?"
REPLY_TEXT = "Split the invoice into monthly parts, agree the deadline in the contract, and " * 4


def turn_messages() -> tuple[Message, Message]:
    return Message("user", USER_TEXT), Message("assistant", "", status="streaming")


def checkpoint(reply: Message) -> None:
    reply.content = REPLY_TEXT[: len(REPLY_TEXT) // 2]


def finish(reply: Message) -> None:
    reply.content, reply.status = REPLY_TEXT, "complete"


async def store_turns(store: Any, conversation_ids: list[str], turns: int) -> Turns:
    """A turn's writes through the store, as the app makes them (the turn's opening, a checkpoint of the
    reply streaming, then the finished reply, each awaited)."""
    times = []
    for n in range(turns):
        conversation_id = conversation_ids[n % len(conversation_ids)]
        user, reply = turn_messages()
        started, cpu = time.perf_counter(), time.process_time()
        await store.open_turn(conversation_id, None, [user, reply])
        checkpoint(reply)
        await store.save_messages(conversation_id, [reply])
        finish(reply)
        await store.save_messages(conversation_id, [reply])
        times.append(((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
    return turns_of(times)


async def search_times(store: Any, queries: list[str]) -> tuple[list[tuple[str, float, float]], int]:
    """Each query's time in milliseconds through the store's `search`, wall clock and this process's CPU
    (all of SQLite's work, none of PostgreSQL's: on a machine others load, the part that is not waiting
    for a core), and how many queries found nothing."""
    for query in queries[:20]:  # warm the caches a real server has warm
        await store.search("user0", parse_query(query), 20)
    times, empty = [], 0
    for query in queries:
        started, cpu = time.perf_counter(), time.process_time()
        hits = await store.search("user0", parse_query(query), 20)
        times.append((query, (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
        empty += not hits
    return times, empty


# ---- SQLite ----------------------------------------------------------------------------------------


# Every message so far counts as indexed (the mark of the schema's step 14): the next turn's writes meet
# the index as the app's do, not the rows loaded or written without it. (Those rows are not in the index
# all the same: safe only because nothing here changes or deletes them again.)
INDEXED_UP_TO_HERE = "UPDATE messages_index_mark SET seq = (SELECT max(seq) FROM messages)"


def sqlite_turns(db: sqlite3.Connection, conversation_ids: list[str], turns: int) -> Turns:
    """A turn's three transactions (its opening, a checkpoint of the reply, the finished reply), statements only."""
    times = []
    for n in range(turns):
        conversation_id = conversation_ids[n % len(conversation_ids)]
        user, reply = turn_messages()
        started, cpu = time.perf_counter(), time.process_time()
        db.execute("BEGIN")
        db.executemany(sqlite.UPSERT_MESSAGE, [user.to_row(conversation_id), reply.to_row(conversation_id)])
        db.execute("COMMIT")
        for write in (checkpoint, finish):
            write(reply)
            db.execute("BEGIN")
            db.execute(sqlite.UPSERT_MESSAGE, reply.to_row(conversation_id))
            db.execute("COMMIT")
        times.append(((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
    return turns_of(times)


async def bench_sqlite(corpus: Corpus, queries: list[str], directory: Path) -> dict[str, Any]:
    path = directory / "search.db"
    store = SqliteStore(path)
    await store.open()
    await store.close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous = NORMAL")  # as the app's writer
    index = "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name GLOB '*s_text_*'"
    triggers = [row for row in db.execute(index) if row[0].split("_text_")[0] in ("messages", "conversations")]
    for name, _ in triggers:
        db.execute(f"DROP TRIGGER {name}")
    started = time.perf_counter()
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        corpus.conversations(),
    )
    db.executemany(
        "INSERT INTO messages (id, conversation_id, role, content, status, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        corpus.messages(),
    )
    db.execute("COMMIT")
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    db.execute("BEGIN")
    for _, sql in triggers:
        db.execute(sql)
    db.execute("INSERT INTO messages_text(messages_text) VALUES ('rebuild')")
    db.execute("INSERT INTO messages_text(messages_text) VALUES ('optimize')")  # as the schema's step 12 does
    db.execute(INDEXED_UP_TO_HERE)  # the index holds every message now (the schema's step 14)
    db.execute("INSERT INTO conversations_text(conversations_text) VALUES ('rebuild')")
    db.execute("COMMIT")
    indexed = time.perf_counter() - started
    store = SqliteStore(path)
    await store.open()
    try:
        times, empty = await search_times(store, queries)
        # Without and with the index in turns (its triggers dropped, then made again), in rounds: the
        # machine's load drifts; the rows written without it are simply not found.
        rounds: dict[str, list[Turns]] = {"raw": [], "raw_indexed": [], "store": [], "store_indexed": []}
        ids = corpus.conversation_ids
        for _ in range(ROUNDS["sqlite"]):
            rounds["raw_indexed"].append(sqlite_turns(db, ids, TURNS["sqlite"]))
            rounds["store_indexed"].append(await store_turns(store, ids, TURNS["sqlite"] // 4))
            for name, _ in triggers:
                db.execute(f"DROP TRIGGER {name}")
            rounds["raw"].append(sqlite_turns(db, ids, TURNS["sqlite"]))
            rounds["store"].append(await store_turns(store, ids, TURNS["sqlite"] // 4))
            db.execute(INDEXED_UP_TO_HERE)  # what was written without the index stays out of it
            for _, sql in triggers:
                db.execute(sql)
    finally:
        await store.close()
        db.close()
    turns = {name: statistics.median(turns.median for turns in values) for name, values in rounds.items()}
    means = {name: statistics.median(turns.mean for turns in values) for name, values in rounds.items()}
    cpu = {name: statistics.median(turns.cpu for turns in values) for name, values in rounds.items()}
    figures = report("SQLite", loaded, indexed, turns, means, times, empty, path.stat().st_size)
    cpu_figures = {
        "turn_cpu_ms": {name: round(value, 3) for name, value in cpu.items()},
        "insert_ratio_statements_cpu": round(cpu["raw_indexed"] / cpu["raw"], 2),
        "insert_ratio_store_cpu": round(cpu["store_indexed"] / cpu["store"], 2),
    }
    print(json.dumps(cpu_figures), flush=True)
    return figures | cpu_figures


# ---- PostgreSQL ------------------------------------------------------------------------------------


async def postgres_turns(db: asyncpg.Connection, conversation_ids: list[str], turns: int) -> Turns:
    times = []
    for n in range(turns):
        conversation_id = conversation_ids[n % len(conversation_ids)]
        user, reply = turn_messages()
        started, cpu = time.perf_counter(), time.process_time()
        async with db.transaction():
            await db.executemany(postgres.UPSERT_MESSAGE, [user.to_row(conversation_id), reply.to_row(conversation_id)])
        for write in (checkpoint, finish):
            write(reply)
            async with db.transaction():
                await db.execute(postgres.UPSERT_MESSAGE, *reply.to_row(conversation_id))
        times.append(((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
    return turns_of(times)


async def bench_postgres(corpus: Corpus, queries: list[str], url: str) -> dict[str, Any]:
    store = PostgresStore(url)
    await store.open()
    await store.close()
    db = await asyncpg.connect(url)
    store = PostgresStore(url)
    try:
        await db.execute("SET maintenance_work_mem = '256MB'")
        index = await db.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'messages_words'")
        await db.execute("DROP INDEX messages_words")
        await db.execute("ALTER TABLE messages DISABLE TRIGGER messages_words")
        started = time.perf_counter()
        columns = ["id", "owner", "title", "model", "system_prompt", "created_at", "updated_at"]
        await db.copy_records_to_table("conversations", records=list(corpus.conversations()), columns=columns)
        columns = ["id", "conversation_id", "role", "content", "status", "created_at"]
        await db.copy_records_to_table("messages", records=corpus.messages(), columns=columns)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        await db.execute("ALTER TABLE messages ENABLE TRIGGER messages_words")
        await db.execute("UPDATE messages SET status = status WHERE status != 'streaming'")  # the migration's way
        await db.execute(index)
        await db.execute("VACUUM ANALYZE")
        indexed = time.perf_counter() - started
        await store.open()
        times, empty = await search_times(store, queries)
        # With and without the index in turns (its trigger enabled, then disabled: the GIN index then
        # takes an empty entry a row), in rounds: the machine's load drifts.
        rounds: dict[str, list[Turns]] = {"raw": [], "raw_indexed": [], "store": [], "store_indexed": []}
        ids = corpus.conversation_ids
        for _ in range(ROUNDS["postgres"]):
            rounds["raw_indexed"].append(await postgres_turns(db, ids, TURNS["postgres"]))
            rounds["store_indexed"].append(await store_turns(store, ids, TURNS["postgres"]))
            await db.execute("ALTER TABLE messages DISABLE TRIGGER messages_words")
            rounds["raw"].append(await postgres_turns(db, ids, TURNS["postgres"]))
            rounds["store"].append(await store_turns(store, ids, TURNS["postgres"]))
            await db.execute("ALTER TABLE messages ENABLE TRIGGER messages_words")
        turns = {name: statistics.median(turns.median for turns in values) for name, values in rounds.items()}
        means = {name: statistics.median(turns.mean for turns in values) for name, values in rounds.items()}
        size = await db.fetchval("SELECT pg_database_size(current_database())")
    finally:
        await store.close()
        await db.close()
    return report("PostgreSQL", loaded, indexed, turns, means, times, empty, size)


def report(
    mode: str,
    loaded: float,
    indexed: float,
    turns: dict[str, float],
    means: dict[str, float],
    by_query: list[tuple[str, float]],
    empty: int,
    size: int,
) -> dict[str, Any]:
    times = [ms for _, ms, _ in by_query]
    cpu = [ms for _, _, ms in by_query]
    figures = {
        "mode": mode,
        "load_s": round(loaded, 1),
        "index_build_s": round(indexed, 1),
        "turn_ms": {name: round(value, 3) for name, value in turns.items()},
        "insert_ratio_statements": round(turns["raw_indexed"] / turns["raw"], 2),
        "insert_ratio_store": round(turns["store_indexed"] / turns["store"], 2),
        # The mean counts the rare turn that does more (SQLite's: the 64th message listed puts the listed
        # ones in the index), which the median leaves out.
        "turn_mean_ms": {name: round(value, 3) for name, value in means.items()},
        "insert_ratio_statements_mean": round(means["raw_indexed"] / means["raw"], 2),
        "insert_ratio_store_mean": round(means["store_indexed"] / means["store"], 2),
        "search_median_ms": round(statistics.median(times), 2),
        "search_p95_ms": round(percentile(times, 0.95), 2),
        "search_max_ms": round(max(times), 2),
        "search_cpu_median_ms": round(statistics.median(cpu), 2),
        "search_cpu_p95_ms": round(percentile(cpu, 0.95), 2),
        "queries": len(times),
        "queries_finding_nothing": empty,
        "slowest": [(query, round(ms, 1)) for query, ms, _ in sorted(by_query, key=lambda item: -item[1])[:5]],
        "load_average": os.getloadavg()[0],
        "database_mb": round(size / 1e6),
    }
    print(json.dumps(figures), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--modes", default="sqlite,postgres")
    args = parser.parse_args()
    if args.modes == "huge":
        search_huge.run(["sqlite", "postgres"], search_huge.ROUNDS)
        return
    started = time.perf_counter()
    corpus = Corpus(args.conversations, args.messages, args.users)
    queries = corpus.queries("user0", args.queries)
    print(f"corpus made in {time.perf_counter() - started:.0f} s", flush=True)
    runs: dict[str, Callable[[], Any]] = {}
    if "sqlite" in args.modes:
        runs["sqlite"] = lambda: sqlite_run(corpus, queries)
    if "postgres" in args.modes:
        runs["postgres"] = lambda: postgres_run(corpus, queries)
    for run in runs.values():
        run()


def sqlite_run(corpus: Corpus, queries: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(bench_sqlite(corpus, queries, Path(directory)))


def postgres_run(corpus: Corpus, queries: list[str]) -> None:
    with fresh_database() as url:
        asyncio.run(bench_postgres(corpus, queries, url))


if __name__ == "__main__":
    main()
