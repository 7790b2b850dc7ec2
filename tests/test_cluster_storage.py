"""Replicas and their PostgreSQL under faults (issue 15, part B): a paused producer, a frozen replica
inside a transaction, a delete racing a first turn, a rename racing a mirror, a rolling restart through
nginx, a database that stalls or is cut. Real replicas, real PostgreSQL (through the tests' own fault
proxy where it fails), real nginx, real signals."""

# The replica fixtures come from tests/test_cluster.py: test arguments name them again.
# ruff: noqa: F811

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pocketchat import protocol
from pocketchat.cluster.produced_log import Copier, ProducedLog
from pocketchat.cluster.redis_link import FRESH_SECONDS, Fenced, RedisLink, takeover_frames
from tests.cluster import Nginx, sign_in
from tests.conftest import NO_LIMITS, AppProcess, ChatClient, reply_text, stream_of
from tests.fake_openai import FakeOpenAI, Reply
from tests.services import FaultProxy, database_name
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
    # The same frames (the takeover's error, turn_end) and chunks, however each socket's were grouped:
    # a socket that fell behind for a moment gets several in one frame (a busy machine, A just woken).
    assert stream_of(a_all) == stream_of(b_all)
    settled(a, cookie)
    assert stored_reply(shared["POCKETCHAT_DATABASE_URL"], reply_id) == (reply_text(b_all), "interrupted")
    # And a socket that opens the conversation on A now gets what PostgreSQL has.
    history = client(a.ws_url, cookie).hello(session)["history"]
    assert (history[-1]["content"], history[-1]["status"]) == (reply_text(b_all), "interrupted")


# 5. A replica frozen inside a transaction costs the others seconds, not their one writer


def writers_waiting_on_a_lock(url: str) -> int:
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'pocketchat-writer'"
        " AND wait_event_type = 'Lock'"
    )
    return query(url, sql, database_name(url))[0][0]


def idle_in_transaction(url: str) -> int:
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state = 'idle in transaction'"
    return query(url, sql, database_name(url))[0][0]


def change(app: AppProcess, cookie: str, session: str, **fields: str) -> int:
    """PATCH the conversation through `app`; the answer's status."""
    request = urllib.request.Request(
        f"{app.url}/api/conversations/{session}",
        data=json.dumps(fields).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json", "Cookie": cookie},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as answer:
        answer.close()
        return answer.code


class Background:
    """A blocking call run on a thread of its own: `result()` waits for it."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=lambda: self._outcome.append(call()), daemon=True)
        self._thread.start()

    def result(self, timeout: float = 30) -> Any:
        self._thread.join(timeout)
        assert self._outcome, "the call did not return in time"
        return self._outcome[0]


def test_a_replica_frozen_inside_a_transaction_costs_the_others_seconds_not_their_writer(replicas, cookie, shared):
    a, b = replicas
    url = shared["POCKETCHAT_DATABASE_URL"]
    first = client(a.ws_url, cookie)
    session = first.hello()["session_id"]
    first.turn("a stored conversation, with a row both replicas will write")

    async def freeze_a_inside_a_transaction() -> None:
        # A's writer is made to wait on a lock held here, A is paused while it waits, and the lock is let
        # go: A's UPDATE then completes, and its transaction stays open, holding the row, for as long
        # as A is paused (as when SIGSTOP lands between two statements of a transaction).
        locker = await asyncpg.connect(url, timeout=5)
        try:
            async with locker.transaction():
                await locker.execute("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", session)
                renaming.append(Background(lambda: change(a, cookie, session, title="Renamed on A")))
                await asyncio.to_thread(wait_for, lambda: writers_waiting_on_a_lock(url) == 1)
                os.kill(a.process.pid, signal.SIGSTOP)
        finally:
            await locker.close()

    renaming: list[Background] = []
    asyncio.run(freeze_a_inside_a_transaction())
    try:
        wait_for(lambda: idle_in_transaction(url) == 1, timeout=2)
        healths: list[int] = []
        watching = Background(lambda: [healths.append(health(b)[0]) or time.sleep(0.02) for _ in range(150)])
        # B writes the same row (its writer waits behind A's lock), then serves an unrelated new chat.
        prompting = Background(lambda: change(b, cookie, session, system_prompt="Changed on B"))
        wait_for(lambda: writers_waiting_on_a_lock(url) == 1, timeout=5)
        unrelated = client(b.ws_url, cookie)
        unrelated.hello()
        started = time.monotonic()
        frames = unrelated.turn("nothing to do with the frozen replica")
        took = time.monotonic() - started
        assert took < 4, f"an unrelated turn on B took {took:.1f} s behind a frozen replica's lock"
        assert frames[-1]["status"] == "complete"
        assert not [f for f in frames if f["type"] == "error"], "its reply was not saved in time"
        # The server ends the frozen replica's session, and with it its locks.
        wait_for(lambda: idle_in_transaction(url) == 0, timeout=6)
        watching.result()
        assert 503 in healths, "B's /healthz said nothing while its writer waited on a lock"
        prompting.result()
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    renaming[0].result()
    wait_for(lambda: health(b)[0] == 200 and health(a)[0] == 200, timeout=20)
    reply_id = frames[-1]["message_id"]
    wait_for(lambda: stored_reply(url, reply_id) == (reply_text(frames), "complete"), timeout=10)


# 14. A PostgreSQL stall: /healthz says so within seconds, and turn_end does not wait for it


def timed_until(socket: ChatClient, kind: str, timeout: float = 30) -> list[tuple[float, dict]]:
    """Every frame up to the next one of `kind`, each with when it arrived."""
    seen = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1][1]["type"] != kind:
        frame = socket.recv(max(deadline - time.monotonic(), 0.01))
        seen.append((time.monotonic(), frame))
    return seen


def test_a_postgresql_stall_fails_healthz_within_seconds_and_turn_end_does_not_wait_for_the_database(
    another_replica, fake, fault_proxy, shared
):
    url = shared["POCKETCHAT_DATABASE_URL"]
    proxy: FaultProxy = fault_proxy(url)
    app = another_replica(POCKETCHAT_DATABASE_URL=proxy.url(url))
    socket = client(app.ws_url, sign_in(app.url))
    socket.hello()
    assert socket.turn("before the stall")[-1]["status"] == "complete"
    fake.queue(Reply(count=60, pace=0.02))
    socket.send("message", content="a reply that ends while PostgreSQL stalls")
    first = socket.until("chunk")
    proxy.stall()
    stalled = time.monotonic()
    wait_for(lambda: health(app)[0] == 503, timeout=15)
    noticed = time.monotonic() - stalled
    frames = timed_until(socket, "turn_end")
    last_chunk = max(at for at, frame in frames if frame["type"] == "chunk")
    waited = frames[-1][0] - last_chunk
    try:
        assert noticed < 3.5, f"/healthz said 200 for {noticed:.1f} s into the stall"
        assert waited < 3.5, f"turn_end came {waited:.1f} s after the last chunk"
        told = [frame for _, frame in frames if frame["type"] == "error"]
        assert [f["code"] for f in told] == ["storage_error"] and "will be saved" in told[0]["message"], told
        assert frames[-1][1]["status"] == "complete"
    finally:
        proxy.heal()
    wait_for(lambda: health(app)[0] == 200, timeout=30)
    reply = first + [frame for _, frame in frames]
    wait_for(lambda: stored_reply(url, reply[-1]["message_id"]) == (reply_text(reply), "complete"), timeout=10)


# 11. A PostgreSQL outage: hello for a conversation not in memory says `unavailable`, and the socket stays


def open_sockets(app: AppProcess) -> float:
    with urllib.request.urlopen(app.url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("pocketchat_open_sockets ")))


@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_hello_during_a_postgresql_outage_answers_unavailable_at_once_and_keeps_the_socket(
    another_replica, fault_proxy, shared, fault
):
    url = shared["POCKETCHAT_DATABASE_URL"]
    proxy: FaultProxy = fault_proxy(url)
    app = another_replica(POCKETCHAT_DATABASE_URL=proxy.url(url))
    cookie = sign_in(app.url)
    first = client(app.ws_url, cookie)
    session = first.hello()["session_id"]
    first.turn("stored, then out of memory")
    first.close()
    wait_for(lambda: open_sockets(app) == 0)  # its last socket gone: the conversation leaves memory
    socket = client(app.ws_url, cookie)  # signed in before the outage
    getattr(proxy, fault)()
    try:
        asked = time.monotonic()
        socket.send("hello", session_id=session)
        answer = socket.recv(15)
        took = time.monotonic() - asked
        assert (answer["type"], answer.get("code")) == ("error", "unavailable"), answer
        assert took < 5, f"answered after {took:.1f} s"
        assert socket.hello()["type"] == "ready"  # the same socket, still served: a new chat needs no database
    finally:
        proxy.heal()
    assert socket.hello(session)["history"][0]["content"] == "stored, then out of memory"


# 8. A rename made while a turn streams is not undone by the other replica's copy of that turn


def stored_record(url: str, session: str) -> tuple[str, str, str]:
    row = query(url, "SELECT title, model, system_prompt FROM conversations WHERE id = $1", session)[0]
    return row["title"], row["model"], row["system_prompt"]


def test_a_rename_made_while_a_turn_streams_survives_the_other_replica_and_its_changes(replicas, cookie, fake, shared):
    a, b = replicas
    url = shared["POCKETCHAT_DATABASE_URL"]
    fake.queue(Reply(count=300, pace=0.02))
    on_a = client(a.ws_url, cookie)
    session = on_a.hello()["session_id"]
    on_a.send("message", content="the first message names the conversation")
    assert on_a.until("conversation")[-1]["title"] == "the first message names the conversation"
    assert change(a, cookie, session, title="Renamed on A") == 200
    assert on_a.until("conversation")[-1]["title"] == "Renamed on A"
    # New sockets on B, while A's turn (whose log opens with the old name) still streams.
    for _ in range(3):
        assert client(b.ws_url, cookie).hello(session)["title"] == "Renamed on A"
    assert change(b, cookie, session, model="fake-model-large") == 200
    told = on_a.until("conversation")[-1]
    assert (told["title"], told["model"]) == ("Renamed on A", "fake-model-large")
    assert stored_record(url, session)[:2] == ("Renamed on A", "fake-model-large")
    assert on_a.until("turn_end", timeout=30)[-1]["status"] == "complete"
    assert client(b.ws_url, cookie).hello(session)["title"] == "Renamed on A"
    assert stored_record(url, session)[:2] == ("Renamed on A", "fake-model-large")


# 7. A delete wins over a first turn that starts on another replica at the same moment


def delete(app: AppProcess, cookie: str, session: str) -> int:
    request = urllib.request.Request(
        f"{app.url}/api/conversations/{session}", method="DELETE", headers={"Cookie": cookie}
    )
    try:
        with urllib.request.urlopen(request, timeout=40) as answer:
            return answer.status
    except urllib.error.HTTPError as answer:
        answer.close()
        return answer.code


def listed(app: AppProcess, cookie: str) -> set[str]:
    request = urllib.request.Request(f"{app.url}/api/conversations", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return {c["id"] for c in json.loads(answer.read())["conversations"]}


def test_a_delete_on_one_replica_just_after_a_first_message_on_the_other_wins(replicas, cookie, fake, shared):
    a, b = replicas
    url = shared["POCKETCHAT_DATABASE_URL"]
    deleted: list[str] = []
    for attempt in range(15):
        fake.queue(Reply(count=100, pace=0.01))
        on_a = client(a.ws_url, cookie)
        session = on_a.hello()["session_id"]
        on_a.send("message", content=f"a first message, deleted at once ({attempt})")
        time.sleep(0.005)
        assert delete(b, cookie, session) == 204
        assert on_a.until("deleted", timeout=30)[-1]["session_id"] == session
        deleted.append(session)
        on_a.close()
    for app in (a, b):
        settled(app, cookie)  # whatever either replica queued for those conversations has landed
    assert query(url, "SELECT id FROM conversations WHERE id = ANY($1)", deleted) == []
    assert query(url, "SELECT id FROM messages WHERE conversation_id = ANY($1)", deleted) == []
    assert not (listed(a, cookie) | listed(b, cookie)) & set(deleted)


def test_a_delete_while_a_turn_followed_on_the_deleting_replica_runs_writes_nothing_back(
    replicas, cookie, fake, shared
):
    # The delete takes the conversation's lease, which ends the turn on the replica that follows it as
    # a taken-over one: that replica must not store the turn (its conversation is gone), nor fail trying.
    a, b = replicas
    url = shared["POCKETCHAT_DATABASE_URL"]
    fake.queue(Reply(count=200, pace=0.02))
    on_a = client(a.ws_url, cookie)
    session = on_a.hello()["session_id"]
    on_b = client(b.ws_url, cookie)
    on_b.hello(session)
    on_a.send("message", content="deleted while its reply runs")
    on_b.until("chunk")
    assert delete(b, cookie, session) == 204
    on_b.until("deleted", timeout=30)
    time.sleep(2)  # a watchdog round or two, and its write, if it makes one
    for app in (a, b):
        settled(app, cookie)
    assert query(url, "SELECT id FROM conversations WHERE id = $1", session) == []
    assert query(url, "SELECT id FROM messages WHERE conversation_id = $1", session) == []
    assert "database write failed" not in b.logs()


def test_a_delete_wins_even_when_the_other_replicas_first_write_lands_after_it(
    another_replica, fake, fault_proxy, shared
):
    url = shared["POCKETCHAT_DATABASE_URL"]
    proxy: FaultProxy = fault_proxy(url)
    a, b = another_replica(POCKETCHAT_DATABASE_URL=proxy.url(url)), another_replica()
    cookie = sign_in(b.url)
    on_a = client(a.ws_url, cookie)
    session = on_a.hello()["session_id"]
    proxy.stall()  # A's writes wait: its first turn's opening write lands only after B's delete
    try:
        fake.queue(Reply(count=50, pace=0.01))
        on_a.send("message", content="stored by A only after B deleted it")
        on_a.until("turn_start")
        assert delete(b, cookie, session) == 204
        on_a.until("deleted", timeout=30)
    finally:
        proxy.heal()
    wait_for(lambda: health(a)[0] == 200, timeout=30)
    settled(a, cookie)
    assert query(url, "SELECT id FROM conversations WHERE id = $1", session) == []
    assert query(url, "SELECT id FROM messages WHERE conversation_id = $1", session) == []


# 9. A rolling restart through deploy/nginx.conf keeps the service reachable, and replies whole


def restart(app: AppProcess) -> None:
    """Start the same replica again: the same port (nginx's upstream), settings and log."""
    app.process, app.clients = None, []
    app.start()


def stop_gracefully(app: AppProcess) -> None:
    """SIGTERM, as an orchestrator stops a replica, and wait for it to drain and exit."""
    assert app.process is not None
    app.process.send_signal(signal.SIGTERM)
    app.wait_exit(40)


class Reconnecting:
    """Pages reconnecting through the balancer all along: a WebSocket handshake and a hello each time.
    `failures` holds when each one failed, and how."""

    def __init__(self, ws_url: str, cookie: str, session: str) -> None:
        self.ws_url, self.cookie, self.session = ws_url, cookie, session
        self.attempts = 0
        self.failures: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.attempts += 1
            try:
                with connect(self.ws_url, additional_headers={"Cookie": self.cookie}, open_timeout=5) as socket:
                    socket.send(json.dumps({"type": "hello", "conversation_id": self.session}))
                    assert json.loads(socket.recv(5))["type"] == "ready"
            except ConnectionClosed as closed:
                # 1012: the handshake reached a replica as it began to stop, which says so; the page
                # reconnects at once, as it does after any 1012 (docs/protocol.md). Anything else failed.
                if closed.rcvd is None or closed.rcvd.code != 1012:
                    self.failures.append((time.monotonic(), f"{type(closed).__name__}: {closed}"))
            except Exception as error:  # a refused handshake (502), a socket cut: a page that saw nothing
                self.failures.append((time.monotonic(), f"{type(error).__name__}: {error}"))
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def follow_through_a_restart(
    socket: ChatClient, balancer_ws: str, cookie: str, session: str, failures: list[str]
) -> tuple[str, str]:
    """A page whose reply runs on the replica being restarted: it reads until its socket is closed (1012),
    reconnects through the balancer (again and again, as the page does; each failure is noted), and
    reads the reply to its end. The reply's text and status."""
    text = ""
    try:
        frames = socket.until("turn_end", timeout=30)
        return reply_text(frames), frames[-1]["status"]
    except ConnectionClosed:
        text = reply_text(socket.frames)
    deadline = time.monotonic() + 30
    while True:
        try:
            again = client(balancer_ws, cookie)
            break
        except Exception as error:
            failures.append(f"{type(error).__name__}: {error}")
            assert time.monotonic() < deadline, failures[-1]
            time.sleep(0.1)
    ready = again.hello(session)
    if (running := ready.get("running")) is None:
        return ready["history"][-1]["content"], ready["history"][-1]["status"]
    assert running["content"].startswith(text) or text.startswith(running["content"])
    frames = again.until("turn_end", timeout=30)
    return running["content"] + reply_text(frames), frames[-1]["status"]


def test_a_rolling_restart_through_nginx_keeps_the_service_reachable_and_every_reply_whole(
    another_replica, tmp_path, fake, shared
):
    a, b = another_replica(*NO_LIMITS), another_replica(*NO_LIMITS)
    balancer = Nginx(tmp_path / "nginx", [a.port, b.port]).start()
    cookie = sign_in(balancer.url)
    reconnecting = Reconnecting(balancer.ws_url, cookie, client(balancer.ws_url, cookie).hello()["session_id"])
    try:
        wait_for(lambda: reconnecting.attempts > 10)
        # The rolling restart of docs/deploy.md: one replica at a time, the next once this one is back.
        stop_gracefully(a)
        restart(a)
        # Replies running on B as it stops, ending one after another while their pages reconnect.
        count = 30
        fake.queue(*(Reply(count=40 + 3 * i, pace=0.025) for i in range(count)))
        pages = []
        for i in range(count):
            page = client(b.ws_url, cookie)
            session = page.hello()["session_id"]
            page.send("message", content=f"a reply that ends as B restarts ({i})")
            page.until("turn_start")
            pages.append((page, session))
        time.sleep(0.9)
        b.process.send_signal(signal.SIGTERM)
        failed: list[str] = []
        ends = [follow_through_a_restart(page, balancer.ws_url, cookie, session, failed) for page, session in pages]
        b.wait_exit(40)
        restart(b)
        time.sleep(0.5)
    finally:
        reconnecting.stop()
        balancer.stop()
    assert not failed, f"{len(failed)} reconnects of pages whose replies ran on B failed: {failed[0]}"
    assert not reconnecting.failures, (
        f"{len(reconnecting.failures)} of {reconnecting.attempts} reconnects failed, "
        f"over {reconnecting.failures[-1][0] - reconnecting.failures[0][0]:.1f} s: {reconnecting.failures[0][1]}"
    )
    expected = ["".join(f"tok{t} " for t in range(1, 41 + 3 * i)) for i in range(count)]
    assert [status for _, status in ends] == ["complete"] * count
    # Each page has one of the replies whole, and each reply went to one page. Which one a page got is
    # the order its provider request reached the fake (requests on pooled and new connections can pass
    # each other), not the order the pages sent their messages.
    assert sorted((text for text, _ in ends), key=len) == expected
    sessions = [session for _, session in pages]
    stored = query(
        shared["POCKETCHAT_DATABASE_URL"],
        "SELECT conversation_id, content, status FROM messages WHERE role = 'assistant' AND conversation_id = ANY($1)",
        sessions,
    )
    assert {row["conversation_id"]: (row["content"], row["status"]) for row in stored} == {
        session: (text, "complete") for session, (text, _) in zip(sessions, ends, strict=True)
    }


def test_a_reply_that_ended_elsewhere_before_its_save_landed_opens_complete_not_interrupted(
    another_replica, fake, fault_proxy, shared
):
    """A turn's end (and its lease's release) is in Redis before its final save is in PostgreSQL: a
    page that opens the conversation on another replica in between, reconnecting as the reply ends,
    must get the reply as it ended, not `interrupted`."""
    url = shared["POCKETCHAT_DATABASE_URL"]
    proxy: FaultProxy = fault_proxy(url)
    a, b = another_replica(), another_replica(POCKETCHAT_DATABASE_URL=proxy.url(url))
    cookie = sign_in(a.url)
    on_b = client(b.ws_url, cookie)
    session = on_b.hello()["session_id"]
    assert on_b.turn("stored before the stall")[-1]["status"] == "complete"
    fake.queue(Reply(count=30, pace=0.02))
    on_b.send("message", content="ends while B's database stalls")
    first = on_b.until("chunk")
    proxy.stall()  # B's final save waits; its turn_end does not
    try:
        frames = first + on_b.until("turn_end", timeout=15)
        assert frames[-1]["status"] == "complete"
        assert (stored_reply(url, frames[-1]["message_id"]) or ("", "not there"))[1] != "complete"  # not saved yet
        reply = client(a.ws_url, cookie).hello(session)["history"][-1]
        assert (reply["content"], reply["status"]) == (reply_text(frames), "complete")
    finally:
        proxy.heal()
    wait_for(lambda: stored_reply(url, frames[-1]["message_id"]) == (reply_text(frames), "complete"), timeout=30)


def test_a_produced_log_holds_back_what_comes_after_a_silence_and_ends_as_the_takeover_ended_it(
    redis_server, redis_prefix
):
    """The producer's own log, as a paused producer wakes: what it appends is held back from its own
    sockets until a copy confirms the lease; the copy is refused (the turn was taken over), so the held
    chunk is dropped and the log ends as the stream does."""

    async def scenario() -> tuple[list[str], list[str], list[str], list[Exception]]:
        producer, other = RedisLink(redis_server, redis_prefix, "producer"), RedisLink(redis_server, redis_prefix, "b")
        lease = "t1 r1 producer"
        await producer.client.set(producer.lease("c1"), lease)
        failures: list[Exception] = []
        log = ProducedLog("t1", "c1", lease, Copier(producer, lambda _, error: failures.append(error)))
        log.append(
            protocol.turn_start("t1", {"id": "u1", "role": "user", "content": "q", "status": "complete"}, {"id": "r1"})
        )
        log.append_chunk("one ")
        await log.copied()
        seen: list[str] = []
        follower = asyncio.create_task(_collect(log, seen))
        await asyncio.sleep(FRESH_SECONDS + 0.1)  # paused: no copy confirms the lease meanwhile
        # Its heartbeat never beat: the other replica ends the turn.
        assert await other.take_over("t1", "c1", "producer", *takeover_frames("t1", "r1")) is not None
        log.append_chunk("two ")  # read from the provider's socket on waking
        await asyncio.sleep(0)
        held = list(seen)
        await log.copied()  # refused: fenced
        log.append(protocol.turn_end("t1", "stopped", "r1", {}))  # what the waking turn would add: dropped
        log.close()
        await follower
        stream = [text for _, text in await other.entries("t1")]
        await producer.aclose()
        await other.aclose()
        return held, seen, stream, failures

    held, seen, stream, failures = asyncio.run(scenario())
    assert [json.loads(text)["type"] for text in held] == ["turn_start", "chunk"]  # not chunk two
    assert seen == stream  # byte for byte: turn_start, chunk one, the takeover's error and turn_end
    assert [json.loads(text)["type"] for text in seen] == ["turn_start", "chunk", "error", "turn_end"]
    assert [type(error) for error in failures] == [Fenced]


async def _collect(log: ProducedLog, into: list[str]) -> None:
    async for text in log.follow(0):
        into.append(text)
