"""Each per-user limit: going over it gets `rate_limited` with `retry_after`; nothing running is touched
and the socket stays open (over the socket limit, the new socket is told and closed with 1013)."""

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import pytest
from websockets.exceptions import ConnectionClosed

from pocketchat.limits import ALL_SIGN_INS_PER_MINUTE, LocalWindow
from tests.conftest import MODES, reply_text
from tests.fake_openai import Reply
from tests.test_auth import call, sign_in
from tests.test_protocol import wait_for

# The limits hold in both modes: counted in the process, or in Redis across replicas.
pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)


def refused(frames: list[dict]) -> dict:
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["rate_limited"], frames
    return errors[0]


def test_over_the_running_turns_limit_a_message_waits_and_the_running_reply_goes_on(start_app, fake):
    app = start_app("--limit-running-turns", "1")
    fake.queue(Reply(count=40, pace=0.02), Reply(tokens=["later"]))
    first, second = app.client(), app.client()
    first.hello()
    second.hello()
    first.send("message", content="a long one")
    first.until("chunk")
    second.send("message", content="at the same time")
    error = refused([second.recv()])
    assert error["retry_after"] >= 1 and "streaming already" in error["message"]
    assert first.until("turn_end")[-1]["status"] == "complete"
    assert reply_text(second.turn("now")) == "later"  # the same socket, once the first reply ended


def test_over_the_messages_a_minute_limit_the_next_message_is_refused_with_the_wait(start_app, fake):
    app = start_app("--limit-messages-per-minute", "2")
    client = app.client()
    session = client.hello()["conversation_id"]
    client.turn("one")
    client.turn("two")
    client.send("message", content="three")
    error = refused([client.recv()])
    assert 50 <= error["retry_after"] <= 60
    client.send("regenerate")  # a regenerate is a message too
    assert refused([client.recv()])["code"] == "rate_limited"
    assert [m["content"] for m in client.hello(session)["history"] if m["role"] == "user"] == ["one", "two"]


@pytest.mark.parametrize("limit", ["--limit-running-turns", "--limit-messages-per-minute"])
def test_a_burst_of_messages_at_once_lets_through_no_more_than_the_limit(start_app, fake, limit):
    """Checked and counted in one step: messages arriving together cannot all pass the check before
    any is counted (with replicas, a check and its count were separate Redis calls)."""
    app = start_app(limit, "2")
    fake.queue(*(Reply(count=20, pace=0.02) for _ in range(8)))
    clients = [app.client() for _ in range(8)]
    for client in clients:
        client.hello()
    for client in clients:
        client.send("message", content="all at once")
    answers = sorted(frame.get("code", frame["type"]) for frame in (client.recv() for client in clients))
    assert answers == ["rate_limited"] * 6 + ["turn_start"] * 2


def test_a_turn_that_cannot_begin_counts_nothing_against_the_limits(start_app, fake):
    app = start_app("--limit-running-turns", "1", "--limit-messages-per-minute", "1")
    client = app.client()
    client.hello()
    client.send("regenerate")  # nothing to answer again yet
    assert client.recv()["code"] == "nothing_to_regenerate"
    client.send("edit", message_id="no-such-message", content="x")
    assert client.recv()["type"] == "error"
    assert client.turn("the one message this minute")[-1]["status"] == "complete"


def test_a_refused_message_before_hello_gets_ready_then_the_error(start_app):
    """protocol.md: a `message` before any `hello` attaches a new conversation first, then is refused."""
    app = start_app("--limit-messages-per-minute", "1")
    app.client().turn("the one message this minute")
    late = app.client()
    late.send("message", content="one too many")
    ready, error = late.recv(), late.recv()
    assert ready["type"] == "ready" and ready["history"] == []
    assert error["code"] == "rate_limited"


def test_over_the_conversations_a_minute_limit_a_new_chat_is_refused_and_an_old_one_still_opens(start_app):
    app = start_app("--limit-conversations-per-minute", "2")
    client = app.client()
    first = client.hello()["conversation_id"]
    client.hello()
    client.send("hello")
    error = refused([client.recv()])
    assert 50 <= error["retry_after"] <= 60
    assert client.hello(first)["conversation_id"] == first


def test_over_the_hellos_a_minute_limit_a_hello_is_refused_even_for_an_unknown_id(start_app):
    app = start_app("--limit-hellos-per-minute", "4")
    client = app.client()
    first = client.hello()["conversation_id"]
    assert client.hello(first)["conversation_id"] == first
    client.send("hello", conversation_id="no-such-id")  # answered unknown_conversation, and counted
    assert client.recv()["code"] == "unknown_conversation"
    client.send("hello", conversation_id="no-such-id-either")
    assert client.recv()["code"] == "unknown_conversation"
    client.send("hello", conversation_id=first)
    error = refused([client.recv()])
    assert 50 <= error["retry_after"] <= 60 and "opened 4 conversations" in error["message"]
    late = app.client()
    late.send("message", content="a message before any hello is a hello too")
    assert refused([late.recv()])["code"] == "rate_limited"
    client.send("stop")  # the socket stays open, on the conversation it had
    assert client.turn("still here")[-1]["status"] == "complete"


def test_over_the_changes_a_minute_limit_a_change_gets_429_and_changes_nothing(start_app):
    app = start_app("--limit-changes-per-minute", "2")
    session = app.client().hello()["conversation_id"]
    path = f"/api/conversations/{session}"
    assert call(app, "PATCH", path, {"title": "one"}).status == 200
    assert call(app, "DELETE", "/api/conversations/no-such-id").status == 404  # counted too
    for method, body in (("PATCH", {"title": "two"}), ("DELETE", None)):
        answer = call(app, method, path, body)
        assert answer.status == 429 and 50 <= int(answer.headers["retry-after"]) <= 60
        assert "changed conversations 2 times" in answer.json()["detail"]
    assert call(app, "GET", path).json()["title"] == "one"


def test_over_the_searches_a_minute_limit_a_search_gets_429_and_other_users_still_search(start_app):
    app = start_app("--limit-searches-per-minute", "2", "--auth", "header")
    alice, bob = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}
    for q in ("one", "two"):
        assert call(app, "GET", f"/api/search?q={q}", **alice).status == 200
    answer = call(app, "GET", "/api/search?q=three", **alice)
    assert answer.status == 429 and 50 <= int(answer.headers["retry-after"]) <= 60
    assert "searched 2 times in the last minute" in answer.json()["detail"]
    assert call(app, "GET", "/api/search?q=three", **bob).status == 200


def test_over_the_sockets_limit_the_new_socket_is_told_and_closed_and_the_others_work(start_app):
    app = start_app("--limit-sockets", "2")
    open_ones = [app.client(), app.client()]
    for client in open_ones:
        client.hello()
    extra = app.client()
    error = refused([extra.recv()])
    assert error["retry_after"] >= 1 and "tabs open" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        extra.recv()
    assert closed.value.rcvd.code == 1013
    assert all(client.turn("still here")[-1]["status"] == "complete" for client in open_ones)
    open_ones[0].close()

    def a_new_socket_is_served() -> bool:
        """A closed socket frees its place, once the server has seen it go."""
        client = app.client()
        client.send("hello")
        return client.recv()["type"] == "ready"

    wait_for(a_new_socket_is_served)


# ---- bursts: every limit is checked and counted in one step -----------------------------------------

TOKEN = "a-token-for-the-limits-0123456789"


def at_once(count: int, attempt) -> list:
    """`attempt(i)` for i in range(count), all started together (threads waiting at a barrier)."""
    barrier = threading.Barrier(count)

    def run(i: int):
        barrier.wait(30)
        return attempt(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def test_a_burst_of_wrong_tokens_gets_five_401s_and_the_rest_429(start_app):
    """With replicas, the check and the count were separate Redis calls: 128 of 200 got a 401."""
    app = start_app("--auth", "token", "--token", TOKEN)
    statuses = at_once(200, lambda i: sign_in(app, f"wrong-token-number-{i:04}")[0].status)
    assert sorted(statuses) == [401] * 5 + [429] * 195
    assert sign_in(app, TOKEN)[0].status == 429  # the right one waits too, from this address


def first_frame(app, frame: dict) -> str:
    """Open a socket (left open) and send `frame`: what the first answer is, `ready` or an error code."""
    client = app.client()
    with contextlib.suppress(ConnectionClosed):  # over the sockets limit: told, then closed at once
        client.send(**frame)
    answer = client.recv(30)
    return answer.get("code", answer["type"])


def test_a_burst_of_sockets_opens_no_more_than_the_limit(start_app):
    """Sockets limit 20: 41 of 80 opened when the check and the count were separate Redis calls."""
    app = start_app("--limit-sockets", "20")
    answers = at_once(80, lambda i: first_frame(app, {"type": "hello"}))
    assert sorted(answers) == ["rate_limited"] * 60 + ["ready"] * 20


def test_a_burst_of_new_conversations_starts_no_more_than_the_limit(start_app):
    """New conversations limit 30: 31 of 60 started when the check and the count were separate."""
    app = start_app("--limit-conversations-per-minute", "30")
    answers = at_once(60, lambda i: first_frame(app, {"type": "hello"}))
    assert sorted(answers) == ["rate_limited"] * 30 + ["ready"] * 30


# ---- the sign-in limiter: addresses grouped, an overall cap, a bounded table, a quiet log ---------


def sign_in_from(app, address: str, token: str = "not-the-token-at-all-00000") -> int:
    """A sign-in through the (trusted, loopback) proxy for a client at `address`."""
    form = urlencode({"token": token}).encode()
    headers = {"Content_Type": "application/x-www-form-urlencoded", "X_Forwarded_For": address}
    return call(app, "POST", "/login", form, **headers).status


def test_the_addresses_of_one_ipv6_64_share_one_sign_in_limit(start_app):
    app = start_app("--auth", "token", "--token", TOKEN)
    statuses = [sign_in_from(app, f"2001:db8:1:2:{i:x}::{i:x}") for i in range(1, 11)]
    assert statuses == [401] * 5 + [429] * 5
    assert sign_in_from(app, "2001:db8:1:3::1") == 401  # the next /64 is another subscriber
    assert sign_in_from(app, "::ffff:192.0.2.9") == 401  # IPv4-mapped: the IPv4 address it is
    assert [sign_in_from(app, "192.0.2.9") for _ in range(5)] == [401] * 4 + [429]


def test_wrong_tokens_from_thousands_of_addresses_are_capped_together_and_logged_sparingly(start_app):
    """6,000 wrong tokens from 6,000 IPv6 addresses all got a 401, each logged at WARNING."""
    app = start_app("--auth", "token", "--token", TOKEN)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: sign_in_from(app, f"2001:db8:{i:x}::1"), range(1, 301)))
    assert statuses.count(401) == ALL_SIGN_INS_PER_MINUTE and statuses.count(429) == 300 - ALL_SIGN_INS_PER_MINUTE
    assert sign_in_from(app, "198.51.100.1", TOKEN) == 429  # meanwhile, signing in waits for everyone
    app.stop()
    warnings = [line for line in app.logs().splitlines() if "WARNING" in line and "sign-in token" in line]
    assert 1 <= len(warnings) <= 10


def test_a_window_in_one_process_keeps_a_bounded_number_of_keys(mode):
    if mode != "single":
        pytest.skip("with replicas the windows are Redis keys that expire")
    window = LocalWindow(limit=5, max_keys=100)

    async def scenario() -> list[tuple[float, str | None]]:
        for i in range(10_000):
            await window.take(f"2001:db8:{i:x}::/64")
        return [await window.take("2001:db8:270f::/64") for _ in range(5)]

    latest = asyncio.run(scenario())
    assert len(window) == 100
    assert [event is not None for _, event in latest] == [True] * 4 + [False]  # the recent ones still count
