"""Every replica agrees (issue 31, items 2, 4, 5 and 9): a tool call's record outlives the replica that ran
it; a path written late, or chosen on a copy that had not read the last turn, is refused, and the refused
replica reloads and tells its pages what is stored; "one import at a time" and an import's status hold
when Redis restarts empty. Real replicas under uvicorn, real PostgreSQL (through the tests' fault proxy
where it stalls), a private redis-server, replicas paused with SIGSTOP."""

# The replica fixture comes from tests/test_cluster_faults.py: test arguments name it again.
# ruff: noqa: F811

import json
import time
from typing import Any

from pocketchat.turns import CHECKPOINT_SECONDS
from tests.cluster import sign_in
from tests.conftest import AppProcess, ChatClient
from tests.fake_openai import Call, Reply
from tests.services import FaultProxy, PrivateRedis
from tests.test_cluster import client, health
from tests.test_cluster_faults import on_both, replica  # noqa: F401 (a fixture)
from tests.test_cluster_storage import frozen, open_sockets, query
from tests.test_documents import call
from tests.test_import import post_import, trips
from tests.test_protocol import wait_for
from tests.test_tools import LOOKUP, declaring_client


def stored_path(url: str, conversation: str) -> list[str]:
    """The texts of the path PostgreSQL holds for the conversation: to its `leaf_id`, else to its newest message."""
    (row,) = query(url, "SELECT leaf_id FROM conversations WHERE id = $1", conversation)
    sql = "SELECT id, parent_id, content FROM messages WHERE conversation_id = $1 ORDER BY seq"
    messages = query(url, sql, conversation)
    by_id = {message["id"]: message for message in messages}
    path, at = [], row["leaf_id"] or messages[-1]["id"]
    while at is not None:
        path.append(by_id[at]["content"])
        at = by_id[at]["parent_id"]
    return path[::-1]


def shown(app: AppProcess, cookie: str, conversation: str) -> list[str]:
    """The texts of the path a page that opens the conversation on `app` is shown."""
    return [message["content"] for message in client(app.ws_url, cookie).hello(conversation)["history"]]


def drained(socket: ChatClient, quiet: float = 0.5) -> list[dict[str, Any]]:
    """The frames the socket gets until none comes for `quiet` seconds."""
    seen = []
    while True:
        try:
            seen.append(socket.recv(quiet))
        except TimeoutError:
            return seen


def last_path(frames: list[dict[str, Any]]) -> list[str] | None:
    """What a page shows after these frames, if they change it: the last `path` frame's texts (None if a
    turn's end came after it: the page then shows that turn)."""
    for frame in reversed(frames):
        if frame["type"] == "turn_end":
            return None
        if frame["type"] == "path":
            return [message["content"] for message in frame["history"]]
    return None


def agreed(url: str, cookie: str, conversation: str, *apps: AppProcess, timeout: float = 10) -> list[str]:
    """The stored path, once every replica shows it (each replica's pages, as a page that opens it there):
    a write still landing, or a copy still being read again, is waited for (on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        stored = stored_path(url, conversation)
        shown_by = [shown(app, cookie, conversation) for app in apps]
        if all(path == stored for path in shown_by):
            return stored
        assert time.monotonic() < deadline, f"stored {stored}, shown {shown_by}"
        time.sleep(0.1)


# Item 4: a switch on a replica whose copy has not read the turn that just ended elsewhere


def test_a_switch_on_a_replica_that_has_not_read_the_last_turn_yet_ends_where_postgres_and_every_page_agree(
    replica, fake, fresh_postgres_url
):
    a, b = replica(), replica()
    cookie, on_a, conversation, on_b = on_both(a, b)
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]))
    first = on_a.turn("question")[-1]["message_id"]
    on_a.send("regenerate")
    on_a.until("turn_end")
    on_b.until("turn_end")
    on_b.until("turn_end")
    for round in range(3):  # B reads its socket before Redis after a pause most of the time, not always
        fake.queue(Reply(tokens=[f"again {round}"]))
        with frozen(b):
            # A's regenerate ends and lets the lease go while B, paused, has read none of it; B's page,
            # which still shows the versions it had, switches to the first one.
            on_a.send("regenerate")
            on_a.until("turn_end")
            on_b.send("switch", message_id=first)
            time.sleep(0.3)
        told = drained(on_b)  # its page is told until nothing more comes for 0.5 s
        stored = agreed(fresh_postgres_url, cookie, conversation, a, b)
        assert last_path(told + drained(on_b)) in (None, stored), f"B's page was last told {last_path(told)}"
        assert stored == ["question", "first"], "the switch, chosen after the regenerate, was lost"


# Item 5: path writes that land late, out of order, under a PostgreSQL stall


def test_a_switch_whose_write_lands_after_a_later_regenerate_on_another_replica_is_refused(
    replica, fake, fault_proxy, fresh_postgres_url
):
    database: FaultProxy = fault_proxy(fresh_postgres_url)
    a, b = replica(), replica(POCKETCHAT_DATABASE_URL=database.url(fresh_postgres_url))
    cookie, on_a, conversation, on_b = on_both(a, b)
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]), Reply(tokens=["third"]))
    first = on_a.turn("question")[-1]["message_id"]
    on_a.send("regenerate")
    on_a.until("turn_end")
    on_b.until("turn_end")
    on_b.until("turn_end")
    database.stall()  # B's writes wait from here
    try:
        on_b.send("switch", message_id=first)
        assert on_b.until("path")[-1]["history"][-1]["content"] == "first"
        time.sleep(2.5)  # B lets the conversation go after 2 s, its write still waiting
        on_a.send("regenerate")
        assert on_a.until("turn_end", timeout=20)[-1]["status"] == "complete"
        on_b.until("turn_end")
    finally:
        database.heal()
    wait_for(lambda: health(b)[0] == 200, timeout=30)
    time.sleep(1)  # B's switch lands, or is refused
    assert agreed(fresh_postgres_url, cookie, conversation, a, b) == ["question", "third"]


def test_a_turns_opening_write_that_lands_after_a_switch_on_another_replica_is_refused(
    replica, fake, fault_proxy, fresh_postgres_url
):
    database: FaultProxy = fault_proxy(fresh_postgres_url)
    a, b = replica(POCKETCHAT_DATABASE_URL=database.url(fresh_postgres_url)), replica()
    cookie, on_a, conversation, on_b = on_both(a, b)
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]), Reply(tokens=["third"]))
    first = on_a.turn("question")[-1]["message_id"]
    on_a.send("regenerate")
    on_a.until("turn_end")
    on_b.until("turn_end")
    on_b.until("turn_end")
    database.stall()  # A's writes wait from here: its next turn's opening write (the path: the latest) too
    try:
        on_a.send("message", content="and then?")
        assert on_a.until("turn_end", timeout=20)[-1]["status"] == "complete"
        on_b.until("turn_end")
        on_b.send("switch", message_id=first)
        assert on_b.until("path")[-1]["history"][-1]["content"] == "first"
        assert on_a.until("path")[-1]["history"][-1]["content"] == "first"
    finally:
        database.heal()
    wait_for(lambda: health(a)[0] == 200, timeout=30)
    time.sleep(1)  # A's opening write lands, or is refused
    assert agreed(fresh_postgres_url, cookie, conversation, a, b) == ["question", "first"]


# Item 2: a tool call's record outlives the replica (or the process) running it


def test_a_tool_call_running_on_a_replica_that_dies_is_stored_with_its_interrupted_reply(
    replica, fake, fresh_postgres_url
):
    a, b = replica(), replica()
    cookie = sign_in(a.url)
    on_a = client(a.ws_url, cookie)
    on_a.send("hello", tools=[LOOKUP])
    conversation = on_a.until("ready")[-1]["conversation_id"]
    on_b = client(b.ws_url, cookie)
    on_b.hello(conversation)
    fake.queue(Reply(tokens=["Looking it up. "], calls=[Call("client__lookup", {"word": "pocket"})]))
    on_a.send("message", content="what is a pocket?")
    on_a.until("tool_call")  # never answered: the call runs until A dies
    assert on_b.until("step")[-1]["kind"] == "tool_call"
    a.kill()
    assert on_b.until("turn_end", timeout=15)[-1]["status"] == "interrupted"
    reply_id = on_b.frames[-1]["message_id"]

    def stored_steps() -> list[str] | None:
        rows = query(fresh_postgres_url, "SELECT status, meta FROM messages WHERE id = $1", reply_id)
        if not rows or rows[0]["status"] != "interrupted":
            return None
        return [step["kind"] for step in json.loads(rows[0]["meta"]).get("steps", [])]

    wait_for(lambda: stored_steps() is not None, timeout=10)
    assert stored_steps() == ["tool_call"]
    on_b.close()
    wait_for(lambda: open_sockets(b) == 0)  # B lets the conversation go: a reload reads PostgreSQL
    reply = client(b.ws_url, cookie).hello(conversation)["history"][-1]
    assert (reply["status"], reply["content"]) == ("interrupted", "Looking it up. ")
    assert [step["kind"] for step in reply["meta"]["steps"]] == ["tool_call"]


def test_a_tool_call_running_when_the_process_dies_is_kept_by_a_checkpoint(start_app, fake):
    # One process on SQLite: what a crash leaves is the last checkpoint. A tool call sends no chunk.
    app = start_app("--tool-timeout", "60")
    fake.queue(Reply(calls=[Call("client__lookup", {"word": "pocket"})]))
    socket, conversation = declaring_client(app)
    socket.send("message", content="what is a pocket?")
    socket.until("tool_call")
    time.sleep(CHECKPOINT_SECONDS + 1)  # a checkpoint is due meanwhile
    app.kill()
    app.start()
    reply = app.client().hello(conversation)["history"][-1]
    assert reply["status"] == "interrupted"
    assert [step["kind"] for step in reply["meta"].get("steps", [])] == ["tool_call"]


# Item 9: imports, when Redis restarts empty


def test_one_import_at_a_time_and_its_status_hold_on_every_replica_when_redis_restarts_empty(
    replica, private_redis: PrivateRedis
):
    a, b = replica(POCKETCHAT_REDIS_URL=private_redis.url), replica(POCKETCHAT_REDIS_URL=private_redis.url)
    cookie = sign_in(a.url)
    # 800 conversations: 32 batches, each followed by a pause of 0.1 s: it runs 3 s at least.
    status, job = post_import(a, trips(800), Cookie=cookie)
    assert status == 202, job
    private_redis.stop()
    private_redis.start()  # empty
    status, answer = post_import(b, trips(1), Cookie=cookie)
    assert status == 409 and "under way already" in answer["detail"], answer
    path = f"/api/imports/{job['id']}"
    deadline = time.monotonic() + 120
    while (done := call(a, "GET", path, Cookie=cookie))[1]["status"] == "importing":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert done[0] == 200 and done[1]["status"] == "done" and done[1]["imported"] == 800
    private_redis.stop()
    private_redis.start()  # empty again: what A told the other replicas is gone
    assert call(b, "GET", path, Cookie=cookie) == done
    assert post_import(b, trips(1), Cookie=cookie)[0] == 202  # it ended: the next may start
