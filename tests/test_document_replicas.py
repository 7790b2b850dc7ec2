"""A document's indexing across replicas (issue 31, items 6 to 8): a replica killed while its embedder is
silent, a replica paused past the sweep, a document or its conversation removed on the other replica.
Real replicas under uvicorn on a PostgreSQL database and a Redis prefix of the test's own, real sockets,
the tests' fault proxy in front of the provider, SIGSTOP for a pause. Then the rule under them, on both
stores: an indexing write lands only while its document is still `indexing`."""

import asyncio
import os
import re
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest

from pocketchat.documents import failure_message
from pocketchat.errors import ProviderError
from pocketchat.jobs import OverBudget
from pocketchat.records import ConversationRecord, DocumentRecord
from pocketchat.store.postgres import PostgresStore
from pocketchat.store.sqlite import SqliteStore
from tests.cluster import TOKEN, start_replica
from tests.conftest import NO_LIMITS, AppProcess, ChatClient
from tests.fake_openai import FakeOpenAI
from tests.test_cluster import client
from tests.test_cluster_faults import on_both
from tests.test_documents import call, documents, upload
from tests.test_protocol import wait_for
from tests.test_store import Stores, opened
from utils.embeddings import to_bytes


def long_document(paragraphs: int) -> bytes:
    """About one passage a paragraph: a few hundred take the local model seconds to embed."""
    text = "\n\n".join(f"Paragraph {i} tells of the {i}th lantern of the old bridge. " * 8 for i in range(paragraphs))
    return text.encode()


@pytest.fixture
def replica(
    tmp_path: Path, fake: FakeOpenAI, fresh_postgres_url: str, redis_server: str, redis_prefix: str
) -> Iterator[Callable[..., AppProcess]]:
    """Start a replica on the test's own database and Redis prefix, its provider at `provider_port` (the
    fake, or a proxy in front of it), with flags of its own; every one is killed at the end."""
    shared = {
        "POCKETCHAT_DATABASE_URL": fresh_postgres_url,
        "POCKETCHAT_REDIS_URL": redis_server,
        "POCKETCHAT_REDIS_PREFIX": redis_prefix,
        "POCKETCHAT_TOKEN": TOKEN,
    }
    started: list[AppProcess] = []

    def start(*flags: str, provider_port: int | None = None) -> AppProcess:
        started.append(start_replica(tmp_path, provider_port or fake.port, shared, *NO_LIMITS, *flags))
        return started[-1]

    yield start
    for app in started:
        if app.process is not None and app.process.poll() is None:
            os.kill(app.process.pid, signal.SIGCONT)  # a test that failed while it was paused
        app.kill()


def told(socket: ChatClient, document_id: str) -> list[dict[str, Any]]:
    """The document's states the socket was told so far, in order (frames read up to now)."""
    return [f["document"] for f in socket.frames if f["type"] == "document" and f["document"]["id"] == document_id]


def read_for(socket: ChatClient, seconds: float) -> None:
    """Read whatever frames come for `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            socket.recv(left)
        except TimeoutError:
            return


def until_told(socket: ChatClient, document_id: str, status: str, timeout: float) -> float:
    """Read until the socket is told the document is `status`; when (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while not any(state["status"] == status for state in told(socket, document_id)):
        socket.recv(max(deadline - time.monotonic(), 0.01))
    return time.monotonic()


def until_progress(socket: ChatClient, document_id: str, beyond: float) -> None:
    """Read until the document's indexing got past `beyond`."""
    while not any(state.get("progress", 0) > beyond for state in told(socket, document_id)):
        socket.recv(60)


def moved_back(states: list[dict[str, Any]]) -> list[str]:
    """The statuses told after the first final one (failed, ready, removed) that are not final: a page
    shown a document failed, or gone, and then indexing again."""
    final = next((i for i, state in enumerate(states) if state["status"] != "indexing"), len(states))
    return [state["status"] for state in states[final:] if state["status"] == "indexing"]


def database_rows(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    async def fetch() -> list[tuple[Any, ...]]:
        db = await asyncpg.connect(url, timeout=5)
        try:
            return [tuple(row) for row in await db.fetch(query, *args)]
        finally:
            await db.close()

    return asyncio.run(fetch())


def log_line(app: AppProcess, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, app.logs())


def test_a_document_attached_on_one_replica_is_listed_on_the_other_which_opened_the_conversation_new(replica):
    """B opened the conversation before it was stored (a new chat made on A); A's upload stored it."""
    a, b = replica(), replica()
    cookie, _, conversation, on_b = on_both(a, b)
    status, document = upload(a, conversation, "notes.md", b"The lantern is lit at dusk.", Cookie=cookie)
    assert status == 201
    until_told(on_b, document["id"], "ready", timeout=30)
    assert [d["id"] for d in documents(b, conversation, Cookie=cookie)] == [document["id"]]


def test_a_document_whose_replica_dies_while_its_embedder_is_silent_fails_within_about_20_s(
    replica, fake, fault_proxy, fresh_postgres_url
):
    """The replica waits on the provider's embeddings (silent: up to --idle-limit, 30 s) and shows no
    progress: its heartbeat keeps the document from being swept. Killed, the document is failed by the
    other replica within about 20 s, whatever --idle-limit (it took 61-65 s with the default 30)."""
    provider = fault_proxy(f"http://127.0.0.1:{fake.port}")
    a = replica("--embedding-model", "fake-embedder", provider_port=provider.port)
    b = replica()
    cookie, _, conversation, on_b = on_both(a, b)
    provider.stall()  # every embedding request waits, as a provider that says nothing
    status, document = upload(a, conversation, "long.md", long_document(50), Cookie=cookie)
    assert status == 201
    until_progress(on_b, document["id"], 0)  # cut into passages: the embedder is awaited from now on
    read_for(on_b, 23)  # past the 20 s a silent indexing is given
    [listed] = documents(b, conversation, Cookie=cookie)
    assert listed["status"] == "indexing", listed
    killed = time.monotonic()
    a.kill()
    failed = until_told(on_b, document["id"], "failed", timeout=60)
    print(f"failed {failed - killed:.1f} s after its replica was killed")
    assert failed - killed < 30
    assert "cut short" in told(on_b, document["id"])[-1]["error"]
    assert database_rows(fresh_postgres_url, "SELECT count(*) FROM chunks") == [(0,)]


def test_a_replica_paused_past_the_sweep_writes_nothing_for_its_document_when_it_wakes(replica, fresh_postgres_url):
    """A is frozen while it indexes; B marks the document failed; A wakes with all its passages to go:
    it stops, storing none, and no page is told the document is indexing again."""
    # --idle-limit 5: the sweep's cutoff was 2 x --idle-limit, so without the fix this tests the wake alone.
    a, b = replica("--idle-limit", "5"), replica("--idle-limit", "5")
    cookie, on_a, conversation, on_b = on_both(a, b)
    status, document = upload(a, conversation, "long.md", long_document(300), Cookie=cookie)
    assert status == 201
    until_progress(on_a, document["id"], 0.05)
    assert a.process is not None
    os.kill(a.process.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        failed = until_told(on_b, document["id"], "failed", timeout=40)
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    woke = time.monotonic()
    # A's indexing ends: stopped as it wakes (or, before the fix, after it wrote every passage).
    ended = rf"document {document['id'][:6]}… (no longer indexed here|conversation .* status=)"
    wait_for(lambda: log_line(a, ended) is not None, timeout=60)
    print(f"B marked it failed {failed - paused:.1f} s into A's pause; A stopped {time.monotonic() - woke:.2f} s after")
    read_for(on_a, 1)
    read_for(on_b, 1)
    query = "SELECT count(*) FROM chunks WHERE document_id = $1"
    assert database_rows(fresh_postgres_url, query, document["id"]) == [(0,)]
    assert [d["status"] for d in documents(a, conversation, Cookie=cookie)] == ["failed"]
    for socket in (on_a, on_b):
        assert moved_back(told(socket, document["id"])) == []
    assert log_line(a, rf"document {document['id'][:6]}… no longer indexed here"), a.logs()[-3000:]


@pytest.mark.parametrize("removed", ["document", "conversation"])
def test_removing_a_document_or_its_conversation_on_one_replica_stops_its_indexing_on_the_other(
    replica, fresh_postgres_url, removed
):
    """B's removal reaches A (through Redis): A stops embedding at once, writes nothing more, and no page
    is told of the document again, let alone of a raw database error."""
    a, b = replica(), replica()
    cookie, on_a, conversation, on_b = on_both(a, b)
    status, document = upload(a, conversation, "long.md", long_document(400), Cookie=cookie)
    assert status == 201
    until_progress(on_a, document["id"], 0.05)
    path = f"/api/conversations/{conversation}" + (f"/documents/{document['id']}" if removed == "document" else "")
    assert call(b, "DELETE", path, Cookie=cookie)[0] == 204
    deleted = time.monotonic()
    ended = rf"document {document['id'][:6]}… (no longer indexed here|failed to index|conversation .* status=)"
    wait_for(lambda: log_line(a, ended) is not None, timeout=60)
    stopped = time.monotonic() - deleted
    read_for(on_a, 1)
    read_for(on_b, 1)
    for socket in (on_a, on_b):
        states = told(socket, document["id"])
        if removed == "document":
            assert states[-1]["status"] == "removed" and [s["status"] for s in states].count("removed") == 1
            assert moved_back(states) == [] and not any("error" in state for state in states), states[-3:]
        else:
            assert any(f["type"] == "deleted" for f in socket.frames)
    assert log_line(a, rf"document {document['id'][:6]}… no longer indexed here"), a.logs()[-3000:]
    print(f"A stopped indexing {stopped:.2f} s after the removal on B")
    assert stopped < 5
    assert database_rows(fresh_postgres_url, "SELECT count(*) FROM chunks") == [(0,)]
    assert database_rows(fresh_postgres_url, "SELECT count(*) FROM documents") == [(0,)]
    # The replicas go on serving the conversation's user.
    fresh = client(a.ws_url, cookie)
    fresh.hello()
    assert fresh.turn("Still there?")[-1]["status"] == "complete"


def test_a_removal_the_indexing_replica_hears_of_late_stops_it_and_its_late_frames_show_nothing_again(
    replica, fault_proxy, redis_server, fresh_postgres_url
):
    """A's Redis stalls: A hears nothing of B's removal, and its last progress frames wait to cross. Its
    next progress write is refused (the document is gone), which stops it; once Redis flows again, those
    late frames reach B's page after the removal, and must not bring the document back."""
    redis = fault_proxy(redis_server)
    a, b = replica("--redis-url", redis.url(redis_server)), replica()
    cookie, on_a, conversation, on_b = on_both(a, b)
    status, document = upload(a, conversation, "long.md", long_document(400), Cookie=cookie)
    assert status == 201
    until_progress(on_b, document["id"], 0.05)
    redis.stall()
    try:
        read_for(on_a, 1.2)  # progress told on A, its copies for B held up
        assert (
            call(b, "DELETE", f"/api/conversations/{conversation}/documents/{document['id']}", Cookie=cookie)[0] == 204
        )
        wait_for(lambda: log_line(a, rf"document {document['id'][:6]}… no longer indexed here") is not None, 5)
    finally:
        redis.heal()
    read_for(on_a, 2)
    read_for(on_b, 2)
    for socket in (on_a, on_b):
        states = told(socket, document["id"])
        assert states[-1]["status"] == "removed" and moved_back(states) == [], [s["status"] for s in states][-5:]
    assert database_rows(fresh_postgres_url, "SELECT count(*) FROM chunks") == [(0,)]


# ---- the rule under them, on both stores ----------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request, tmp_path) -> Stores:
    if request.param == "sqlite":
        return Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))
    url = request.getfixturevalue("fresh_postgres_url")
    return Stores("postgres", lambda: PostgresStore(url))


def test_an_indexing_write_lands_only_while_its_document_is_indexing(stores):
    passage = [(0, None, "The lantern of the old bridge.", to_bytes(np.zeros(384)))]

    async def scenario() -> None:
        async with opened(stores) as db:
            record = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(record)
            swept = DocumentRecord(record.id, record.owner, "swept.md", 30)
            await db.add_document(swept)
            assert await db.add_chunks(swept, passage) is True
            assert await db.document_progress(swept) is True
            assert [d.id for d in await db.sweep_documents(time.time() + 1)] == [swept.id]  # its replica "died"
            # The replica wakes: none of its writes lands, and each says so.
            assert await db.document_progress(swept) is False
            assert await db.add_chunks(swept, passage) is False
            swept.status, swept.chunks = "ready", 1
            assert await db.finish_document(swept) is False
            assert await db.document_vectors(swept.id) == ([], [])
            [listed] = await db.list_documents(record.id, record.owner)
            assert listed.status == "failed"
            # Removed while it indexed: refused too, with no database error.
            removed = DocumentRecord(record.id, record.owner, "removed.md", 30)
            await db.add_document(removed)
            assert await db.delete_document(record.id, removed.id) is True
            assert await db.add_chunks(removed, passage) is False
            assert await db.document_progress(removed) is False
            assert await db.document_vectors(removed.id) == ([], [])

    asyncio.run(scenario())


def test_a_failed_indexing_says_why_in_a_job_or_the_providers_words_and_never_in_the_databases():
    foreign_key = 'insert or update on table "chunks" violates foreign key constraint "chunks_document_id_fkey"'
    for error in (asyncpg.ForeignKeyViolationError(foreign_key), sqlite3.IntegrityError(foreign_key), KeyError("bug")):
        message = failure_message(error)
        assert "chunks" not in message and "bug" not in message and "attach it again" in message
    slow = OverBudget("It took longer than the 30 s a job may take, and was stopped.", "time")
    assert failure_message(slow) == f"Indexing failed: {slow.message}"
    refused = ProviderError("The provider at http://127.0.0.1/v1 sent nothing for 30 s.")
    assert failure_message(refused) == f"Indexing failed: {refused.message}"
