"""Replicas that survive their own failure handling (issue 15, the Redis side): a database that fails
while a dead replica's turns are ended, Redis killed and restarted empty (again and again), a frozen
Redis, a stop that reaches a replica before the turn does. Real replicas under uvicorn, real
WebSocket clients, a private redis-server or the tests' fault proxy: never the shared servers."""

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import pytest

from pocketchat.background import Background
from pocketchat.cluster.produced_log import Copier, ProducedLog
from pocketchat.cluster.redis_link import RedisLink
from pocketchat.cluster.watchdog import Sight, Watchdog
from tests.cluster import TOKEN, sign_in, start_replica
from tests.conftest import NO_LIMITS, AppProcess, ChatClient, reply_text
from tests.fake_openai import FakeOpenAI, Reply
from tests.services import FaultProxy, PrivateRedis
from tests.test_cluster import client, health
from tests.test_protocol import wait_for

LONG = 500  # chunks of a reply that runs through the whole fault (10 s at 20 ms)
FULL = "".join(f"tok{i} " for i in range(1, LONG + 1))


@pytest.fixture
def replica(
    tmp_path: Path, fake: FakeOpenAI, fresh_postgres_url: str, redis_server: str, redis_prefix: str
) -> Iterator[Callable[..., AppProcess]]:
    """Start a replica on the test's own database and Redis prefix, with settings of its own (a
    private Redis, the database through a proxy); every one is killed at the end."""
    shared = {
        "POCKETCHAT_DATABASE_URL": fresh_postgres_url,
        "POCKETCHAT_REDIS_URL": redis_server,
        "POCKETCHAT_REDIS_PREFIX": redis_prefix,
        "POCKETCHAT_TOKEN": TOKEN,
    }
    started: list[AppProcess] = []

    def start(**settings: str) -> AppProcess:
        started.append(start_replica(tmp_path, fake.port, {**shared, **settings}, *NO_LIMITS))
        return started[-1]

    yield start
    for app in started:
        app.kill()


def replies(count: int, chunks: int = LONG) -> list[Reply]:
    return [Reply(count=chunks, pace=0.02) for _ in range(count)]


def followed_turns(producer: AppProcess, followers: list[AppProcess], count: int) -> list[list[ChatClient]]:
    """`count` conversations whose turn runs on `producer`, each with a socket on every follower that
    has seen a chunk of it: [producer's socket, followers' sockets...] per conversation."""
    cookie = sign_in(producer.url)
    conversations = []
    for _ in range(count):
        here = client(producer.ws_url, cookie)
        session = here.hello()["session_id"]
        there = [client(follower.ws_url, cookie) for follower in followers]
        for socket in there:
            socket.hello(session)
        here.send("message", content="a long answer, please")
        conversations.append([here, *there])
    for sockets in conversations:
        for socket in sockets:
            socket.until("chunk")
    return conversations


def on_both(a: AppProcess, b: AppProcess) -> tuple[str, ChatClient, str, ChatClient]:
    """A new conversation with a socket on each replica: (cookie, A's socket, its id, B's socket)."""
    cookie = sign_in(a.url)
    on_a = client(a.ws_url, cookie)
    conversation = on_a.hello()["session_id"]
    on_b = client(b.ws_url, cookie)
    on_b.hello(conversation)
    return cookie, on_a, conversation, on_b


def ends(socket: ChatClient, timeout: float = 20) -> tuple[dict, str, list[dict]]:
    """The socket's turn_end, the reply text it got in all, and the error frames before the end."""
    socket.until("turn_end", timeout=timeout)
    return ends_seen(socket)


def ends_seen(socket: ChatClient) -> tuple[dict, str, list[dict]]:
    """`ends` for a socket whose turn_end has come already."""
    starts = [i for i, f in enumerate(socket.frames) if f["type"] == "turn_start"]
    frames = socket.frames[starts[-1] :]
    assert frames[-1]["type"] == "turn_end"
    return frames[-1], reply_text(frames), [f for f in frames if f["type"] == "error"]


def assistant_rows(database_url: str) -> dict[str, tuple[str, str]]:
    """Every stored reply, read from PostgreSQL itself: id: (status, content)."""

    async def read() -> dict[str, tuple[str, str]]:
        db = await asyncpg.connect(database_url, timeout=5)
        try:
            rows = await db.fetch("SELECT id, status, content FROM messages WHERE role = 'assistant'")
        finally:
            await db.close()
        return {row["id"]: (row["status"], row["content"]) for row in rows}

    return asyncio.run(read())


def healthy(app: AppProcess) -> bool:
    status, body = health(app)
    return status == 200 and "tasks" not in body


@contextmanager
def frozen(redis_server: PrivateRedis) -> Iterator[None]:
    """The private redis-server stopped dead (SIGSTOP), as a stalled host or VM freezes it."""
    assert redis_server.process is not None
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)


# 1. A database that fails while a dead replica's turns are ended


@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_a_database_fault_while_a_dead_replicas_turns_are_ended_stops_no_turn_from_ending(
    replica, fake, fault_proxy, fresh_postgres_url, fault
):
    database: FaultProxy = fault_proxy(fresh_postgres_url)
    producer = replica()
    follower = replica(POCKETCHAT_DATABASE_URL=database.url(fresh_postgres_url))
    fake.queue(*replies(3))
    conversations = followed_turns(producer, [follower], 3)
    getattr(database, fault)()  # the follower's database fails as the producer dies
    producer.kill()
    deadline = time.monotonic() + 10  # about 3.5 s: a heartbeat's life, and a watchdog round
    followed = {}
    for _, there in conversations:
        end, text, errors = ends(there, timeout=deadline - time.monotonic())
        assert end["status"] == "interrupted" and text, end
        assert [e["code"] for e in errors] == ["unavailable"]
        followed[end["message_id"]] = text
    # The database still fails: the conversation takes a new message all the same.
    fake.queue(Reply(tokens=["again"]))
    first = conversations[0][1]
    first.send("message", content="and now?")
    assert first.recv()["type"] == "turn_start"
    database.heal()
    first.until("turn_end", timeout=30)

    # The interrupted replies are stored as the follower had them, once the database is back.
    def stored_as_followed() -> bool:
        rows = assistant_rows(fresh_postgres_url)
        return all(rows.get(reply_id) == ("interrupted", text) for reply_id, text in followed.items())

    wait_for(stored_as_followed, timeout=30)
    wait_for(lambda: healthy(follower), timeout=20)


def test_a_turn_whose_replica_dies_before_its_first_write_lands_is_stored_by_the_replica_that_ends_it(
    replica, fake, fault_proxy, fresh_postgres_url
):
    # A turn's opening write (its conversation, the user message, the reply marked streaming) is queued,
    # not waited for: behind a slow database, the turn streams before it lands, and a replica that dies
    # then takes it with it. The replica that ends the turn stores what it followed, all of it.
    database: FaultProxy = fault_proxy(fresh_postgres_url)
    producer = replica(POCKETCHAT_DATABASE_URL=database.url(fresh_postgres_url))
    follower = replica()
    cookie, here, session, there = on_both(producer, follower)
    fake.queue(*replies(1))
    database.stall()  # the producer's writes wait from here on
    here.send("message", content="my words, kept whatever happens")
    start = there.until("turn_start")[-1]
    there.until("chunk")
    producer.kill()
    end, text, _ = ends(there)
    assert end["status"] == "interrupted" and text, end

    async def stored() -> tuple[list, list]:
        db = await asyncpg.connect(fresh_postgres_url, timeout=5)
        try:
            conversations = await db.fetch("SELECT id, owner FROM conversations")
            messages = await db.fetch("SELECT id, role, content, status, parent_id FROM messages ORDER BY seq")
        finally:
            await db.close()
        return [tuple(row) for row in conversations], [tuple(row) for row in messages]

    user_id = start["message"]["id"]
    wait_for(lambda: asyncio.run(stored())[1] != [], timeout=20)
    conversations, messages = asyncio.run(stored())
    assert [row[0] for row in conversations] == [session]
    assert messages == [
        (user_id, "user", "my words, kept whatever happens", "complete", None),
        (end["message_id"], "assistant", text, "interrupted", user_id),
    ]
    # The follower shows the same after a reload, and the conversation takes a new message.
    again = client(follower.ws_url, cookie)
    ready = again.hello(session)
    assert [(m["role"], m["content"], m["status"]) for m in ready["history"]] == [
        ("user", "my words, kept whatever happens", "complete"),
        ("assistant", text, "interrupted"),
    ]


def test_a_switch_whose_write_is_slow_is_not_undone_by_a_turn_started_on_the_other_replica(
    replica, fake, fault_proxy, fresh_postgres_url
):
    # A's switch and B's new turn, at once: both write the path shown (the switch its message, the turn
    # "the latest"). Were the turn to start while the switch's write has not landed, the switch would
    # land last and hide the turn's reply from every reload. The switch holds the conversation's lease
    # until its write lands (2 s at most): the turn waits for it, or is refused; a turn that starts
    # later, on a copy that has not heard of the switch (it is told once it lands), is the latest, and
    # the switch, landing after it, is refused (pocketchat/paths.py).
    database: FaultProxy = fault_proxy(fresh_postgres_url)
    a = replica(POCKETCHAT_DATABASE_URL=database.url(fresh_postgres_url))
    b = replica()
    cookie, on_a, conversation, on_b = on_both(a, b)
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]), Reply(tokens=["third"]))
    first = on_a.turn("question")[-1]["message_id"]
    on_b.until("turn_end")
    on_a.send("regenerate")
    on_a.until("turn_end")
    on_b.until("turn_end")
    database.stall()  # A's writes wait from here
    on_a.send("switch", message_id=first)
    on_a.until("path")
    on_b.send("message", content="and then?")
    while (answer := on_b.recv(20))["type"] not in ("turn_end", "error"):
        pass
    database.heal()
    time.sleep(1)  # A's switch lands, if it has not
    # What a replica that loads it from the database shows, and what A and B show.
    reloaded = [m["content"] for m in client(replica().ws_url, cookie).hello(conversation)["history"]]
    for socket in (client(a.ws_url, cookie), client(b.ws_url, cookie)):
        assert [m["content"] for m in socket.hello(conversation)["history"]] == reloaded
    if answer["type"] == "turn_end":
        assert reloaded == ["question", "second", "and then?", "third"], "the switch landed over the turn"
    else:
        assert answer["code"] == "turn_in_progress" and reloaded == ["question", "first"]


def test_only_a_turns_lease_is_taken_for_a_turn_running_elsewhere(redis_server, redis_prefix):
    # A delete's and a switch's leases name no turn: a replica that starts must not watch (and later
    # end, with an error frame to every socket on the conversation) a turn called "switching".
    async def scenario() -> dict:
        link = RedisLink(redis_server, redis_prefix, "starting")
        try:
            await link.client.set(link.lease("c1"), "t1 r1 replica-a")
            await link.client.set(link.lease("c2"), "switching s1 replica-b")
            await link.client.set(link.lease("c3"), "deleting replica-c")
            elsewhere: dict = {}
            watchdog = Watchdog(link, None, None, elsewhere, Sight(), lambda work: None)  # type: ignore[arg-type]
            await watchdog.find_running_turns()
            return elsewhere
        finally:
            await link.aclose()

    assert asyncio.run(scenario()) == {"t1": ("c1", "r1", "replica-a")}


def test_a_background_task_that_ends_anyway_is_named_and_one_that_fails_goes_on():
    async def scenario() -> tuple[str | None, int]:
        tasks = Background()
        rounds = 0

        async def failing() -> None:
            nonlocal rounds
            rounds += 1
            raise RuntimeError("one round fails")

        async def dying() -> None:
            raise asyncio.CancelledError("gone")  # not an Exception: nothing a round catches

        tasks.keep("failing", failing, pause=0.01)
        tasks.keep("dying", dying)
        await asyncio.sleep(0.2)
        failure = tasks.failure
        await tasks.aclose()
        return failure, rounds

    failure, rounds = asyncio.run(scenario())
    assert failure == "dying stopped (cancelled)"
    assert rounds > 3


def test_closing_ends_a_task_that_dropped_its_cancel_as_python_3_11s_wait_for_can():
    # redis-py sends each command through asyncio.wait_for, which in Python 3.11 returns its result and
    # drops a cancel that comes as what it waits for ends: a replica's Redis reader so read on, and its
    # shutdown never ended (seen in the rolling-restart test). Here a round drops the first cancel.
    async def scenario() -> int:
        tasks = Background()
        dropped = 0

        async def reading() -> None:
            nonlocal dropped
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped += 1  # as wait_for does: the round returns, and the next one begins

        tasks.keep("reader", reading)
        await asyncio.sleep(0.05)
        await asyncio.wait_for(tasks.aclose(), 5)
        return dropped

    assert asyncio.run(scenario()) == 1


def test_a_turn_whose_end_is_copied_after_its_last_copy_left_lets_its_lease_go(redis_server, redis_prefix):
    # The copy of turn_end leaves before the turn says it is the last: one more copy lets the lease go.
    async def scenario() -> tuple[bytes | None, list[str]]:
        link = RedisLink(redis_server, redis_prefix, "producer")
        lease = "t1 r1 producer"
        await link.client.set(link.lease("c1"), lease)
        log = ProducedLog("t1", "c1", lease, Copier(link, lambda turn_id, error: None))
        log.append({"type": "turn_start"})
        log.append({"type": "turn_end"})
        for _ in range(2):
            await asyncio.sleep(0)  # its copy has left, not as the last one, and waits for Redis
        await asyncio.wait_for(log.finish(), 5)
        held, frames = await link.client.get(link.lease("c1")), [f for _, f in await link.entries("t1")]
        await link.aclose()
        return held, frames

    held, frames = asyncio.run(scenario())
    assert held is None and frames == ['{"type":"turn_start"}', '{"type":"turn_end"}']


# 2. Redis killed and restarted empty: the turns followed elsewhere end


def test_turns_followed_on_other_replicas_end_interrupted_when_redis_restarts_empty(
    replica, fake, private_redis: PrivateRedis, fresh_postgres_url
):
    producer, *followers = (replica(POCKETCHAT_REDIS_URL=private_redis.url) for _ in range(3))
    fake.queue(*replies(3))
    conversations = followed_turns(producer, followers, 3)
    private_redis.stop()
    private_redis.start()  # empty: the turns' logs and leases are gone
    for here, *there in conversations:
        for socket in there:
            end, text, errors = ends(socket, timeout=20)
            assert end["status"] == "interrupted" and FULL.startswith(text), end
            assert [e["code"] for e in errors] == ["unavailable"]
        end, _, errors = ends(here, timeout=20)
        # error: its copy met Redis down; interrupted: Redis was back, empty, and the lease gone, so the
        # turn ended as a taken-over one does (as the followers ended it)
        assert end["status"] in ("error", "interrupted") and [e["code"] for e in errors] == ["unavailable"]
    for app in (producer, *followers):
        wait_for(lambda app=app: healthy(app), timeout=20)
    # The old conversations take new messages, on any replica, followed everywhere.
    for index, (_, *there) in enumerate(conversations):
        fake.queue(Reply(tokens=["back"]))
        there[0].send("message", content="still there?")
        assert there[0].until("turn_end")[-1]["status"] == "complete"
        assert there[1].until("turn_end")[-1]["status"] == "complete", f"conversation {index}"
    wait_for(lambda: all(status != "streaming" for status, _ in assistant_rows(fresh_postgres_url).values()), 20)


# 3. Redis killed and restarted again and again


def test_replicas_recover_from_redis_killed_and_restarted_round_after_round(replica, fake, private_redis: PrivateRedis):
    a, b = (replica(POCKETCHAT_REDIS_URL=private_redis.url) for _ in range(2))
    cookie = sign_in(a.url)
    on_a, on_b = client(a.ws_url, cookie), client(b.ws_url, cookie)
    from_a, from_b = on_a.hello()["session_id"], on_b.hello()["session_id"]
    watching_a, watching_b = client(b.ws_url, cookie), client(a.ws_url, cookie)  # each follows the other's
    watching_a.hello(from_a)
    watching_b.hello(from_b)
    for round in range(3):
        fake.queue(*replies(2))
        on_a.send("message", content=f"round {round} on A")
        on_b.send("message", content=f"round {round} on B")
        for socket in (on_a, on_b, watching_a, watching_b):
            socket.until("chunk")
        private_redis.stop()
        time.sleep(0.3)
        private_redis.start()
        for producer in (on_a, on_b):  # its own client gets turn_end, whatever Redis did
            end, _, errors = ends(producer, timeout=20)
            assert end["status"] in ("error", "interrupted"), (round, end)  # as in the test above
            assert [e["code"] for e in errors] == ["unavailable"], (round, end)
        for follower in (watching_a, watching_b):
            assert ends(follower, timeout=20)[0]["status"] == "interrupted", round
        wait_for(lambda: healthy(a) and healthy(b), timeout=20)
        # Both readers live: each replica follows the other's next turn, and a stop from the follower
        # reaches the producer.
        fake.queue(*replies(2))
        on_a.send("message", content=f"after round {round} on A")
        on_b.send("message", content=f"after round {round} on B")
        for follower in (watching_a, watching_b):
            turn_id = follower.until("chunk")[-1]["turn_id"]
            follower.send("stop", turn_id=turn_id)
        for socket in (on_a, on_b, watching_a, watching_b):
            assert socket.until("turn_end", timeout=20)[-1]["status"] == "stopped", round
    assert "Traceback" not in a.logs() + b.logs()


def test_redis_connections_reset_under_the_replicas_cost_no_message_and_no_task(
    replica, fake, fault_proxy, redis_server
):
    # A reset connection lying idle in a pool fails only when next used, and on uvloop not with a
    # Redis error: with the transport's RuntimeError.
    link: FaultProxy = fault_proxy(redis_server)
    a, b = (replica(POCKETCHAT_REDIS_URL=link.url(redis_server)) for _ in range(2))
    cookie = sign_in(a.url)
    here, there = client(a.ws_url, cookie), client(b.ws_url, cookie)
    there.hello(here.hello()["session_id"])
    assert here.turn("before the resets")[-1]["status"] == "complete"
    assert there.until("turn_end")[-1]["status"] == "complete"
    for round in range(3):
        link.reset()
        time.sleep(0.3)  # every connection has its RST
        fake.queue(*replies(1))
        here.send("message", content=f"after reset {round}")
        assert here.until("turn_start")[-1]["type"] == "turn_start", round
        there.send("stop", turn_id=there.until("chunk")[-1]["turn_id"])
        for socket in (here, there):
            assert socket.until("turn_end")[-1]["status"] == "stopped", round
        assert healthy(a) and healthy(b)
    assert "Traceback" not in a.logs() + b.logs()


# 6. A frozen Redis: no reply is cut short, and /healthz says so at once


def test_a_redis_frozen_longer_than_a_commands_timeout_cuts_no_reply_short_and_health_fails_at_once(
    replica, fake, private_redis: PrivateRedis
):
    producer, follower = (replica(POCKETCHAT_REDIS_URL=private_redis.url) for _ in range(2))
    fake.queue(*replies(4, chunks=100))
    conversations = followed_turns(producer, [follower], 4)
    # Seven seconds: every heartbeat expires meanwhile, and the producer's copies time out (5 s) and
    # are sent again while Redis still sleeps. The replies end on the producer meanwhile (2 s).
    with frozen(private_redis):
        froze = time.monotonic()
        wait_for(lambda: health(follower)[0] == 503 and health(producer)[0] == 503, timeout=3)
        for here, _ in conversations:  # their own sockets are not kept waiting for Redis
            assert ends(here, timeout=froze + 6 - time.monotonic())[0]["status"] == "complete"
        time.sleep(max(0.0, froze + 7 - time.monotonic()))
    for here, there in conversations:
        followed = ends(there, timeout=30)
        assert followed[0]["status"] == "complete" and followed[1] == ends_seen(here)[1], followed[0]
        assert followed[1] == "".join(f"tok{i} " for i in range(1, 101))
    wait_for(lambda: healthy(producer) and healthy(follower), timeout=15)


def test_a_producer_cut_off_from_redis_for_a_moment_ends_its_turn_on_the_followers_as_soon_as_it_is_back(
    replica, fake, fault_proxy, redis_server
):
    link: FaultProxy = fault_proxy(redis_server)
    producer = replica(POCKETCHAT_REDIS_URL=link.url(redis_server))
    follower = replica()
    fake.queue(*replies(2))
    conversations = followed_turns(producer, [follower], 2)
    link.cut()  # its turns end with an error; what they have not copied yet waits
    produced = [ends(here, timeout=10) for here, _ in conversations]
    assert [end["status"] for end, _, _ in produced] == ["error", "error"]
    time.sleep(1.0)  # shorter than a heartbeat's life: nobody takes its turns over
    link.heal()
    for (_, there), (_, text, errors) in zip(conversations, produced, strict=True):
        followed = ends(there, timeout=10)  # not a lease's 30 s later
        assert followed[0]["status"] == "error" and followed[1:] == (text, errors), followed
    fake.queue(Reply(tokens=["next"]))
    conversations[0][1].send("message", content="the next one")  # its lease went with the end
    assert conversations[0][1].until("turn_end")[-1]["status"] == "complete"


def test_a_follower_that_sees_redis_again_first_waits_for_the_producers_heartbeat_and_catches_up(
    replica, fake, fault_proxy, redis_server
):
    # Redis stalls for both replicas, long enough for the producer's heartbeat to expire; the
    # follower's way to it comes back first, the producer's a moment later (a network that heals
    # unevenly, a heartbeat thread still waiting out its timeout).
    to_producer, to_follower = fault_proxy(redis_server), fault_proxy(redis_server)
    producer = replica(POCKETCHAT_REDIS_URL=to_producer.url(redis_server))
    follower = replica(POCKETCHAT_REDIS_URL=to_follower.url(redis_server))
    fake.queue(*replies(3, chunks=400))
    conversations = followed_turns(producer, [follower], 3)
    to_producer.stall()
    to_follower.stall()
    stalled = time.monotonic()
    wait_for(lambda: health(follower)[0] == 503 and health(producer)[0] == 503, timeout=3)
    time.sleep(max(0.0, stalled + 3.2 - time.monotonic()))  # every heartbeat has expired (3 s)
    to_follower.heal()
    time.sleep(0.6)
    to_producer.heal()  # within its 5 s timeouts: its copies to Redis go on where they were
    for here, there in conversations:
        produced, followed = ends(here, timeout=30), ends(there, timeout=30)
        assert produced[0]["status"] == followed[0]["status"] == "complete", (produced[0], followed[0])
        assert produced[1] == followed[1] == "".join(f"tok{i} " for i in range(1, 401))
    wait_for(lambda: healthy(producer) and healthy(follower), timeout=15)


# 12. A reply that loses Redis says `unavailable`


def test_a_reply_that_loses_redis_ends_with_unavailable(replica, fake, private_redis: PrivateRedis):
    app = replica(POCKETCHAT_REDIS_URL=private_redis.url)
    socket = client(app.ws_url, sign_in(app.url))
    socket.hello()
    fake.queue(*replies(1))
    socket.send("message", content="about to lose Redis")
    socket.until("chunk")
    private_redis.stop()
    end, text, errors = ends(socket, timeout=30)
    assert end["status"] == "error" and text
    assert [e["code"] for e in errors] == ["unavailable"] and "Redis" in errors[0]["message"]


# 13. A stop that reaches a replica before the turn does


def test_a_stop_sent_to_a_replica_that_has_not_heard_of_the_turn_yet_stops_it(replica, fake, fault_proxy, redis_server):
    link: FaultProxy = fault_proxy(redis_server)
    producer = replica()
    other = replica(POCKETCHAT_REDIS_URL=link.url(redis_server))
    cookie = sign_in(producer.url)
    here, there = client(producer.ws_url, cookie), client(other.ws_url, cookie)
    there.hello(here.hello()["session_id"])
    fake.queue(*replies(1))
    link.stall()  # the other replica hears of nothing for now: the stop reaches it first
    here.send("message", content="stop me from elsewhere")
    turn_id = here.until("turn_start")[-1]["turn_id"]
    there.send("stop", turn_id=turn_id)
    time.sleep(0.3)
    link.heal()
    assert here.until("turn_end", timeout=10)[-1]["status"] == "stopped"
    # And as it happens without help: the stop sent the moment turn_start arrives.
    for attempt in range(5):
        fake.queue(*replies(1))
        here.send("message", content=f"stop me again, {attempt}")
        there.send("stop", turn_id=here.until("turn_start")[-1]["turn_id"])
        assert here.until("turn_end", timeout=10)[-1]["status"] == "stopped", attempt
