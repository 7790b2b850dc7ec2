"""Replicas and their PostgreSQL under faults (issue 15, part B): a paused producer, a frozen replica
inside a transaction, a delete racing a first turn, a rename racing a mirror, a rolling restart through
nginx, a database that stalls or is cut. Real replicas, real PostgreSQL (through the tests' own fault
proxy where it fails), real nginx, real signals."""

# The replica fixtures come from tests/test_cluster.py: test arguments name them again.
# ruff: noqa: F811

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from tests.conftest import AppProcess, reply_text
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_cluster import (  # noqa: F401 (fixtures)
    another_replica,
    balancer,
    client,
    cookie,
    health,
    replicas,
    shared,
)
from tests.test_protocol import wait_for


def query(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Rows from the test's database, read straight from PostgreSQL (not through any replica)."""

    async def run() -> list[asyncpg.Record]:
        db = await asyncpg.connect(url, timeout=5)
        try:
            return await db.fetch(sql, *args)
        finally:
            await db.close()

    return asyncio.run(run())


def stored_reply(url: str, message_id: str) -> tuple[str, str] | None:
    rows = query(url, "SELECT content, status FROM messages WHERE id = $1", message_id)
    return (rows[0]["content"], rows[0]["status"]) if rows else None


@contextmanager
def frozen(app: AppProcess) -> Iterator[None]:
    """The replica's process paused (SIGSTOP) for the block, as a VM pause or a long GC would."""
    assert app.process is not None
    os.kill(app.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(app.process.pid, signal.SIGCONT)


def settled(app: AppProcess, cookie: str) -> None:
    """Wait until every write the replica queued so far has landed: its writer runs jobs in order, so
    a turn of its own that ends saved means the earlier ones are in."""
    assert client(app.ws_url, cookie).turn("a later turn, to flush the writer")[-1]["status"] == "complete"


# 4. A paused producer that wakes up overwrites nothing, and stops streaming to its own clients


def test_a_producer_paused_past_its_lease_wakes_fenced_its_clients_see_what_the_others_saw_and_postgres_keeps_it(
    replicas, cookie, fake: FakeOpenAI, shared
):
    a, b = replicas
    fake.queue(Reply(count=1500, pace=0.01))
    on_a, on_b = client(a.ws_url, cookie), client(b.ws_url, cookie)
    session = on_a.hello()["session_id"]
    on_b.hello(session)
    on_a.send("message", content="a long one, while A is paused")
    for _ in range(30):
        on_b.until("chunk")
    with frozen(a):
        # B notices A's heartbeat stop, ends the turn as its sockets saw it, and stores that.
        b_frames = on_b.until("turn_end", timeout=15)
        end = b_frames[-1]
        assert end["status"] == "interrupted"
        reply_id = end["message_id"]
        wait_for(lambda: (stored_reply(shared["POCKETCHAT_DATABASE_URL"], reply_id) or ("", ""))[1] == "interrupted")
    # A wakes with the provider's chunks queued up on its socket: its own clients must not get them.
    a_frames = on_a.until("turn_end", timeout=15)
    b_all = [f for f in on_b.frames if f.get("turn_id") == end["turn_id"]]
    a_all = [f for f in on_a.frames if f.get("turn_id") == end["turn_id"]]
    assert a_frames[-1]["status"] == "interrupted"
    assert len(reply_text(a_all)) == len(reply_text(b_all)), "A's clients got chunks B's never saw"
    assert a_all == b_all  # the same frames, byte for byte: chunks, the takeover's error, turn_end
    settled(a, cookie)
    assert stored_reply(shared["POCKETCHAT_DATABASE_URL"], reply_id) == (reply_text(b_all), "interrupted")
    # And a socket that opens the conversation on A now gets what PostgreSQL has.
    history = client(a.ws_url, cookie).hello(session)["history"]
    assert (history[-1]["content"], history[-1]["status"]) == (reply_text(b_all), "interrupted")
