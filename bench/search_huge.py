"""Search when a message is huge (issue 30, row 10): what 4 searches at once cost, in both storage modes.

    .venv/bin/python -m bench.search --modes huge     (or: python -m bench.search_huge)

For each store (a SQLite file; a PostgreSQL database of its own on the tests' server) and each shape of
a 7 MB user message (one word over and over: a match at every word; distinct words: the most words an
index can take), a user whose one conversation holds it searches for a word near its start 4 times at
once, in rounds, while another user lists their conversations (what the issue's second user waited
33.5 s for on SQLite: every reader thread was busy). Reported, medians over the rounds: a search's
latency, a round's (the 4 together), the other user's list, and this process's peak RSS growth over
the rounds (all of SQLite's work; none of PostgreSQL's server). A message the database refuses to
store is reported as such (PostgreSQL, before its index was bounded: "string is too long for tsvector").
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pocketchat.records import ConversationRecord, Message
from pocketchat.search import parse_query
from pocketchat.store import Store
from pocketchat.store.postgres import PostgresStore
from pocketchat.store.sqlite import SqliteStore
from tests.services import fresh_database

SIZE = 7_000_000
SEARCHES = 4  # at once, as the issue's
ROUNDS = 5
LETTERS = "bcdfghjklmnpqrstvwxz"  # words of these are no English stop word, and no stem of another


def word(number: int) -> str:
    """The number-th distinct word."""
    letters = ""
    while True:
        number, digit = divmod(number, len(LETTERS))
        letters += LETTERS[digit]
        if number == 0:
            return "q" + letters


def shapes() -> dict[str, str]:
    """The messages, each `SIZE` characters with "aardvark" near its start."""
    words, length, number = ["intro", "aardvark"], 15, 0
    while length < SIZE:
        words.append(word(number))
        length += len(words[-1]) + 1
        number += 1
    return {"repeated": ("aardvark " * (SIZE // 9 + 1))[:SIZE], "distinct": " ".join(words)[:SIZE]}


def rss_mb(field: str) -> float:
    """This process's resident memory now (VmRSS) or at its peak since the last reset (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM starts again from VmRSS


async def timed(work: Any) -> float:
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000


async def rounds_of(db: Store, owner: str, count: int) -> dict[str, Any]:
    """`count` rounds of SEARCHES searches at once, and another user's list beside each."""
    searches: list[float] = []
    rounds: list[float] = []
    lists: list[float] = []
    hits: list[int] = []
    before = rss_mb("VmRSS")
    reset_peak()
    for _ in range(count):
        started = time.perf_counter()
        found = [asyncio.ensure_future(db.search(owner, parse_query("aardvark "), 20)) for _ in range(SEARCHES)]
        listed = asyncio.ensure_future(timed(db.list_conversations("bob")))
        searches += await asyncio.gather(*(timed(search) for search in found))
        rounds.append((time.perf_counter() - started) * 1000)
        lists.append(await listed)
        hits += [len(search.result()) for search in found]
    return {
        "search_median_ms": round(statistics.median(searches), 1),
        "search_max_ms": round(max(searches), 1),
        "round_median_ms": round(statistics.median(rounds), 1),
        "other_users_list_median_ms": round(statistics.median(lists), 1),
        "other_users_list_max_ms": round(max(lists), 1),
        "peak_rss_growth_mb": round(rss_mb("VmHWM") - before, 1),
        "hits": sorted(set(hits)),
    }


async def bench_store(mode: str, db: Store, count: int) -> list[dict[str, Any]]:
    results = []
    await db.open()
    try:
        bobs = ConversationRecord(model="m", system_prompt="", owner="bob")
        await db.open_turn(bobs.id, bobs, [])
        for shape, text in shapes().items():
            owner = f"alice-{shape}"
            record = ConversationRecord(model="m", system_prompt="", owner=owner)
            figures: dict[str, Any] = {"mode": mode, "shape": shape, "characters": len(text)}
            try:
                figures["write_ms"] = round(await timed(db.open_turn(record.id, record, [Message("user", text)])), 1)
            except Exception as error:  # the database refused it: the figure is that refusal
                figures["refused"] = str(error)[:120]
            else:
                figures |= await rounds_of(db, owner, count)
            print(json.dumps(figures), flush=True)
            results.append(figures)
    finally:
        await db.close()
    return results


def run(modes: list[str], count: int) -> list[dict[str, Any]]:
    results = []
    if "sqlite" in modes:
        with tempfile.TemporaryDirectory() as directory:
            results += asyncio.run(bench_store("SQLite", SqliteStore(Path(directory) / "huge.db"), count))
    if "postgres" in modes:
        with fresh_database() as url:
            results += asyncio.run(bench_store("PostgreSQL", PostgresStore(url), count))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    run(args.modes.split(","), args.rounds)


if __name__ == "__main__":
    main()
