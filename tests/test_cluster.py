"""Two replicas on one PostgreSQL and one Redis, behind a real nginx (deploy/): each rule of issue 10's
"Behaviour with several replicas", against the real servers."""

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.cluster import TOKEN, Nginx, post, sign_in, start_replica
from tests.conftest import NO_LIMITS, AppProcess, ChatClient, chunk_seqs, reply_text, stream_of
from tests.fake_openai import FakeOpenAI, Reply
from tests.services import PrivateRedis
from tests.test_documents import sources_of, system_prompt, upload, wait_indexed
from tests.test_protocol import wait_for


@pytest.fixture
def shared(fresh_postgres_url: str, redis_server: str, redis_prefix: str) -> dict[str, str]:
    """What the replicas of one test share: a database and a Redis key prefix of its own, the token."""
    return {
        "POCKETCHAT_DATABASE_URL": fresh_postgres_url,
        "POCKETCHAT_REDIS_URL": redis_server,
        "POCKETCHAT_REDIS_PREFIX": redis_prefix,
        "POCKETCHAT_TOKEN": TOKEN,
    }


@pytest.fixture
def replicas(tmp_path: Path, fake: FakeOpenAI, shared: dict[str, str]) -> Iterator[list[AppProcess]]:
    apps = [start_replica(tmp_path, fake.port, shared) for _ in range(2)]
    yield apps
    for app in apps:
        app.kill()


@pytest.fixture
def another_replica(tmp_path: Path, fake: FakeOpenAI, shared: dict[str, str]) -> Iterator[Callable[..., AppProcess]]:
    """Start a replica with settings of its own (killed at the end, whatever happened)."""
    started: list[AppProcess] = []

    def start(*args: str, **settings: str) -> AppProcess:
        started.append(start_replica(tmp_path, fake.port, {**shared, **settings}, *args))
        return started[-1]

    yield start
    for app in started:
        app.kill()


@pytest.fixture
def balancer(tmp_path: Path, replicas: list[AppProcess]) -> Iterator[Nginx]:
    nginx = Nginx(tmp_path / "nginx", [app.port for app in replicas]).start()
    yield nginx
    nginx.stop()


def health(app: AppProcess) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(app.url + "/healthz", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code, json.loads(answer.read())


@pytest.fixture
def cookie(replicas: list[AppProcess]) -> str:
    return sign_in(replicas[0].url)


def client(ws_url: str, cookie: str) -> ChatClient:
    return ChatClient(
        connect(ws_url, additional_headers={"Cookie": cookie}, close_timeout=1, max_size=None, legacy=True)
    )


def tabs_on_both_replicas(balancer: Nginx, replicas: list[AppProcess], cookie: str) -> tuple[ChatClient, ChatClient]:
    """Two tabs through nginx, as a browser's would come: round-robin puts them on different replicas.
    The first is the one on replicas[0]."""

    def accepted() -> list[int]:
        return [app.logs().count('"WebSocket /ws" [accepted]') for app in replicas]

    first = client(balancer.ws_url, cookie)
    wait_for(lambda: sum(accepted()) == 1, timeout=5)
    first_on_a = accepted()[0] == 1
    second = client(balancer.ws_url, cookie)
    wait_for(lambda: accepted() == [1, 1], timeout=5)
    return (first, second) if first_on_a else (second, first)


# 1. Any replica serves any conversation


def test_two_tabs_on_two_replicas_see_one_stream_byte_for_byte(replicas, balancer, cookie, fake):
    fake.queue(Reply(count=30, pace=0.01))
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]  # new, not stored yet: B finds it all the same
    assert on_b.hello(session)["conversation_id"] == session
    on_a.send("message", content="hello both replicas")
    a_frames, b_frames = on_a.until("turn_end"), on_b.until("turn_end")
    assert stream_of(a_frames) == stream_of(b_frames) and chunk_seqs(a_frames) == list(range(1, 31))
    # and the other way round: a turn started on B reaches A
    fake.queue(Reply(tokens=["back"]))
    on_b.send("message", content="from B")
    assert on_a.until("turn_end") == on_b.until("turn_end")
    history = client(replicas[0].ws_url, cookie).hello(session)["history"]
    assert [m["content"] for m in history] == ["hello both replicas", reply_text(a_frames), "from B", "back"]


def test_a_client_hopping_replicas_every_few_chunks_ends_with_a_byte_identical_transcript(
    replicas, balancer, cookie, fake
):
    fake.queue(Reply(count=120, pace=0.02))
    watcher = client(replicas[0].ws_url, cookie)
    session = watcher.hello()["conversation_id"]
    watcher.send("message", content="a long answer, read from everywhere")
    undisturbed = watcher.until("chunk")
    text, hops, ended = "", 0, False
    while not ended:
        hopper = client(balancer.ws_url, cookie)  # round-robin: each hop lands on the other replica
        ready = hopper.hello(session)
        running = ready.get("running")
        snapshot = running["content"] if running else ready["history"][-1]["content"]
        # A follower's copy may be a chunk behind what the producer had sent: the client resumes from
        # the snapshot, which agrees with what it had, one way or the other.
        assert snapshot.startswith(text) or text.startswith(snapshot), "a hop lost or changed what the client had"
        text, hops = snapshot, hops + 1
        if running is None:
            break
        seq = running["seq"]
        for _ in range(7):
            frame = hopper.recv()
            if frame["type"] == "chunk":
                assert frame.get("first_seq", frame["seq"]) == seq + 1  # nothing skipped, nothing twice
                seq, text = frame["seq"], text + frame["content"]
            ended = frame["type"] == "turn_end"
            if ended:
                break
        hopper.close()
    undisturbed += watcher.until("turn_end")
    assert text == reply_text(undisturbed) == "".join(f"tok{i} " for i in range(1, 121))
    assert hops >= 6
    for replica in replicas:  # both served the hopper
        assert replica.logs().count('"WebSocket /ws" [accepted]') >= 3


def test_a_new_conversation_opens_on_the_other_replica_as_soon_as_its_ready_arrives(another_replica, private_redis):
    # Redis holds every write for 2 s, and answers reads: however late A's write of the new
    # conversation lands, its id must not reach the page before B can find it.
    a, b = (another_replica(*NO_LIMITS, POCKETCHAT_REDIS_URL=private_redis.url) for _ in range(2))
    cookie = sign_in(a.url)
    on_a, on_b = client(a.ws_url, cookie), client(b.ws_url, cookie)
    with redis.Redis.from_url(private_redis.url) as pausing:
        pausing.client_pause(2000, all=False)
    session = on_a.hello()["conversation_id"]
    on_b.send("hello", conversation_id=session)
    answer = on_b.recv()
    assert (answer["type"], answer.get("conversation_id")) == ("ready", session), answer


# 2. One running turn per conversation, across replicas


def test_a_message_on_b_while_a_turn_runs_on_a_is_turn_in_progress(replicas, balancer, cookie, fake):
    fake.queue(Reply(count=40, pace=0.02))
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]
    on_b.hello(session)
    on_a.send("message", content="first")
    on_b.until("chunk")
    on_b.send("message", content="second, elsewhere")
    refused = [f for f in on_b.until("error") if f["type"] == "error"][-1]
    assert refused["code"] == "turn_in_progress"
    assert on_a.until("turn_end")[-1]["status"] == "complete"
    assert len(fake.chat_requests) == 1


# 3. Stop from anywhere


def test_a_stop_sent_to_b_ends_the_turn_on_a_and_the_provider_sees_its_connection_close(
    replicas, balancer, cookie, fake
):
    fake.queue(Reply(count=500, pace=0.02))
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]
    on_b.hello(session)
    on_a.send("message", content="go on and on")
    turn_id = on_a.until("turn_start")[-1]["turn_id"]
    on_b.until("chunk")
    sent = time.monotonic()
    on_b.send("stop", turn_id=turn_id)
    end = on_a.until("turn_end")[-1]
    took = time.monotonic() - sent
    assert end["status"] == "stopped"
    assert took < 1.0, f"the stop took {took:.3f} s"  # within 200 ms on a quiet machine; see the README
    wait_for(lambda: fake.hangups == 1, timeout=2)
    assert on_b.until("turn_end")[-1]["status"] == "stopped"


# 4. Conversation events reach every replica


def test_a_rename_a_model_change_and_a_delete_on_one_replica_reach_the_sockets_of_both(replicas, balancer, cookie):
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]
    on_a.turn("something to keep")
    on_b.hello(session)
    changes = json.dumps({"title": "Renamed on B", "model": "fake-model-large", "system_prompt": "Be terse."})
    patch = urllib.request.Request(
        f"{balancer.url}/api/conversations/{session}",  # on one replica or the other: both must hear of it
        data=changes.encode(),
        method="PATCH",
        headers={"Content-Type": "application/json", "Cookie": cookie},
    )
    urllib.request.urlopen(patch, timeout=10).close()
    for socket in (on_a, on_b):
        told = socket.until("conversation")[-1]
        assert (told["title"], told["model"], told["system_prompt"]) == (
            "Renamed on B",
            "fake-model-large",
            "Be terse.",
        )
    delete = urllib.request.Request(
        f"{balancer.url}/api/conversations/{session}", method="DELETE", headers={"Cookie": cookie}
    )
    urllib.request.urlopen(delete, timeout=10).close()
    for socket in (on_a, on_b):
        assert socket.until("deleted")[-1]["conversation_id"] == session
    on_b.send("hello", conversation_id=session)
    assert on_b.recv()["code"] == "unknown_conversation"


def test_a_document_added_through_one_replica_is_read_by_the_next_turn_on_the_other(replicas, cookie, fake):
    # B's turns skip reading the documents of a conversation they know to have none; A's document
    # frames, through Redis, must undo that.
    on_b = client(replicas[1].ws_url, cookie)
    conversation_id = on_b.hello()["conversation_id"]
    assert sources_of(on_b.turn("Before any document")) == []
    text = "Alpha station opens at dawn.\n\nBeta station closes at dusk."
    assert upload(replicas[0], conversation_id, "stations.txt", text.encode(), Cookie=cookie)[0] == 201
    wait_indexed(replicas[0], conversation_id, Cookie=cookie)
    on_b.until("document")  # B's socket heard of it through Redis
    frames = on_b.turn("Anything about trains?")
    assert [source["source"] for source in sources_of(frames)] == ["stations.txt"]
    assert "Alpha station opens at dawn." in system_prompt(fake)


# 5. A replica that dies mid-turn is noticed


def test_after_sigkill_of_the_producer_the_other_replica_ends_the_turn_interrupted_and_stores_it(
    replicas, balancer, cookie, fake
):
    fake.queue(Reply(count=500, pace=0.02))
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]
    on_b.hello(session)
    on_a.send("message", content="this replica will die")
    seen = []
    for _ in range(20):
        seen += on_b.until("chunk")
    os.kill(replicas[0].process.pid, signal.SIGKILL)
    killed = time.monotonic()
    rest = on_b.until("turn_end", timeout=10)
    noticed = time.monotonic() - killed
    assert rest[-1]["status"] == "interrupted"
    assert noticed < 5, f"noticed after {noticed:.1f} s"
    streamed = reply_text(seen + rest)
    reply = client(balancer.ws_url, cookie).hello(session)["history"][-1]  # nginx passes the dead one by
    assert reply["status"] == "interrupted" and reply["content"] == streamed and len(streamed) > 0


# 6. Rolling restarts


def test_sigterm_closes_the_sockets_with_1012_and_the_running_reply_finishes_and_is_stored(
    replicas, balancer, cookie, fake
):
    fake.queue(Reply(count=100, pace=0.03))
    on_a, on_b = tabs_on_both_replicas(balancer, replicas, cookie)
    session = on_a.hello()["conversation_id"]
    on_b.hello(session)
    on_a.send("message", content="finish me while you restart")
    on_a.until("chunk")
    replicas[0].process.send_signal(signal.SIGTERM)
    with pytest.raises(ConnectionClosed) as closed:
        on_a.until("turn_end")
    assert closed.value.rcvd.code == 1012
    # The page reconnects through the balancer, which finds the other replica, and follows the reply to its end.
    back = client(balancer.ws_url, cookie)
    ready = back.hello(session)
    frames = back.until("turn_end", timeout=30)
    assert frames[-1]["status"] == "complete"
    so_far = ready["running"]["content"] if "running" in ready else ""
    assert so_far + reply_text(frames) == "".join(f"tok{i} " for i in range(1, 101))
    assert on_b.until("turn_end", timeout=30)[-1]["status"] == "complete"
    replicas[0].wait_exit(30)  # it exits once the reply is done
    stored = client(balancer.ws_url, cookie).hello(session)["history"][-1]
    assert stored["status"] == "complete" and stored["content"].endswith("tok100 ")


def test_a_reply_longer_than_the_drain_timeout_is_stopped_and_stored(another_replica, fake, cookie, replicas):
    draining = another_replica("--drain-timeout", "1")
    fake.queue(Reply(count=500, pace=0.02))
    on_d, on_b = client(draining.ws_url, cookie), client(replicas[1].ws_url, cookie)
    session = on_d.hello()["conversation_id"]
    on_b.hello(session)
    on_d.send("message", content="too long to wait for")
    on_d.until("chunk")
    draining.process.send_signal(signal.SIGTERM)
    assert on_b.until("turn_end", timeout=30)[-1]["status"] == "stopped"
    draining.wait_exit(30)
    stored = client(replicas[1].ws_url, cookie).hello(session)["history"][-1]
    assert stored["status"] == "stopped" and stored["content"]


# 7. Redis outages


def test_a_redis_outage_ends_the_running_turn_with_an_error_refuses_new_ones_then_works_again(
    another_replica, fake, private_redis: PrivateRedis
):
    app = another_replica(POCKETCHAT_REDIS_URL=private_redis.url)
    socket = client(app.ws_url, sign_in(app.url))
    session = socket.hello()["conversation_id"]
    assert socket.turn("before the outage")[-1]["status"] == "complete"
    fake.queue(Reply(count=500, pace=0.02))
    socket.send("message", content="during the outage")
    socket.until("chunk")
    private_redis.stop()
    frames = socket.until("turn_end", timeout=30)
    error = next(f for f in frames if f["type"] == "error")
    assert "Redis" in error["message"] and frames[-1]["status"] == "error"
    socket.send("message", content="while Redis is down")
    refused = socket.until("error")[-1]
    assert refused["code"] == "unavailable" and "Redis" in refused["message"]
    status, body = health(app)
    assert status == 503 and body["redis"].startswith("failing")
    private_redis.start()  # back, on the same port
    wait_for(lambda: health(app)[0] == 200, timeout=20)
    after = socket.turn("after the outage")
    assert after[-1]["status"] == "complete", [f for f in after if f["type"] == "error"]
    history = socket.hello(session)["history"]
    assert [m["content"] for m in history if m["role"] == "user"] == [
        "before the outage",
        "during the outage",
        "after the outage",
    ]
    assert history[3]["status"] == "error" and history[3]["content"]  # what streamed before is kept


# 8. Shared sessions and limits


def test_a_users_limits_hold_across_replicas(another_replica):
    limits = {"POCKETCHAT_LIMIT_SOCKETS": "1", "POCKETCHAT_LIMIT_MESSAGES_PER_MINUTE": "1"}
    a, b = another_replica(**limits), another_replica(**limits)
    cookie = sign_in(a.url)
    on_a = client(a.ws_url, cookie)
    on_a.hello()
    on_b = client(b.ws_url, cookie)  # the user's second socket, on the other replica
    assert on_b.recv()["code"] == "rate_limited"
    assert on_a.turn("my one message this minute")[-1]["status"] == "complete"
    on_a.close()
    served: list[ChatClient] = []
    wait_for(lambda: _served(b, cookie, served))  # the closed socket frees its place, on the other replica too
    on_b = served[0]
    on_b.send("message", content="a second message, elsewhere")
    refused = on_b.recv()
    assert refused["code"] == "rate_limited" and 50 <= refused["retry_after"] <= 60


def _served(app: AppProcess, cookie: str, served: list[ChatClient]) -> bool:
    """Whether a new socket is served now; a served one is kept in `served`."""
    socket = client(app.ws_url, cookie)
    socket.send("hello")
    if socket.recv()["type"] != "ready":
        socket.close()
        return False
    served.append(socket)
    return True


def test_a_session_made_on_one_replica_works_on_the_other_and_signing_out_closes_sockets_everywhere(replicas):
    cookie = sign_in(replicas[0].url)
    on_b = client(replicas[1].ws_url, cookie)
    assert on_b.hello()["type"] == "ready"
    post(replicas[0].url + "/logout", cookie)
    with pytest.raises(ConnectionClosed) as closed:
        on_b.recv(15)  # B notices within seconds
    assert closed.value.rcvd.code == 4401
