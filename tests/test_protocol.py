"""Each rule of docs/protocol.md, against the app under uvicorn and the fake provider."""

import base64
import json
import sqlite3
import time
import urllib.error
import urllib.request

import psutil
import pytest
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import API_KEY, MODES, chunk_seqs, reply_text, stream_of
from tests.fake_openai import Reply

# Every rule holds in both modes: one process on SQLite, and a replica on PostgreSQL and Redis.
pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_hello_answers_ready_with_a_new_conversation(app):
    ready = app.client().hello()
    assert ready["protocol"] == 1
    assert ready["history"] == [] and "running" not in ready
    assert ready["model"] == "fake-model"
    assert len(ready["conversation_id"]) >= 22  # 128 random bits, base64url


def test_a_turn_streams_ordered_chunks_and_ends_with_stats(app, fake):
    fake.queue(Reply(tokens=["Hel", "lo", " there"]))
    client = app.client()
    client.hello()
    frames = client.turn("hi")
    assert frames[0]["type"] == "turn_start"
    assert frames[0]["message"]["role"] == "user" and frames[0]["message"]["content"] == "hi"
    assert chunk_seqs(frames) == [1, 2, 3]
    assert reply_text(frames) == "Hello there"
    end = frames[-1]
    assert end["status"] == "complete" and end["turn_id"] == frames[0]["turn_id"]
    assert end["usage"]["completion_tokens"] == 3 and end["usage"]["source"] == "provider"
    assert end["ttft_ms"] >= 0 and end["tokens_per_second"] > 0


def test_usage_is_estimated_when_the_provider_sends_none(app, fake):
    fake.queue(Reply(tokens=["abcd", "efgh"], usage=False))
    client = app.client()
    client.hello()
    end = client.turn("hi")[-1]
    assert end["usage"]["source"] == "estimated"
    assert end["usage"]["completion_tokens"] == 2


def test_a_message_before_hello_attaches_a_new_conversation(app):
    client = app.client()
    client.send("message", content="hello")
    frames = client.until("turn_end")
    assert [f["type"] for f in frames[:2]] == ["ready", "turn_start"]
    assert frames[-1]["status"] == "complete"


def test_hello_switches_conversations_on_one_socket(app):
    client = app.client()
    first = client.hello()["conversation_id"]
    client.turn("in the first")
    second = client.hello()["conversation_id"]
    assert second != first
    back = client.hello(first)
    assert back["conversation_id"] == first
    assert [m["content"] for m in back["history"]] == ["in the first", "tok1 tok2 tok3 tok4 tok5 "]


def test_hello_again_for_the_same_conversation_keeps_one_copy_and_one_stream(app, fake):
    fake.queue(Reply(tokens=["idle"]), Reply(count=40, pace=0.02), Reply(tokens=["after"]))
    tab = app.client()
    session = tab.hello()["conversation_id"]
    tab.turn("first")
    assert tab.hello(session)["conversation_id"] == session  # again while idle: nothing else changes
    tab.send("message", content="second")
    first_chunks = tab.until("chunk")
    again = tab.hello(session)  # and again mid-turn, as the page does to resync
    running = again["running"]
    rest = tab.until("turn_end")
    assert chunk_seqs(rest) == list(range(running["seq"] + 1, 41))  # the same stream: nothing lost, nothing twice
    assert running["content"] + reply_text(rest) == "".join(f"tok{i} " for i in range(1, 41))
    # A second tab opened now shares the same copy: it sees the first tab's turns, and a turn it starts
    # reaches the first tab.
    other = app.client()
    history = other.hello(session)["history"]
    assert [m["content"] for m in history][:2] == ["first", "idle"] and len(history) == 4
    other.send("message", content="from the other tab")
    assert reply_text(tab.until("turn_end")) == "after"
    assert len(first_chunks) >= 1 and len(fake.chat_requests) == 3


@pytest.mark.parametrize("stored", [False, True], ids=["new", "stored"])
def test_after_a_rehello_a_second_tab_cannot_start_a_second_turn(app, fake, stored):
    """A hello again keeps the one copy: a stored conversation (let go at once when idle) as well as a
    new one (kept for ten minutes)."""
    tab = app.client()
    session = tab.hello()["conversation_id"]
    if stored:
        assert tab.turn("store it first")[-1]["status"] == "complete"
    fake.queue(Reply(count=40, pace=0.02))
    tab.hello(session)
    other = app.client()
    other.hello(session)
    tab.send("message", content="one")
    tab.until("chunk")
    other.send("message", content="two")
    assert other.until("error")[-1]["code"] == "turn_in_progress"
    assert tab.until("turn_end")[-1]["status"] == "complete"
    assert len(fake.chat_requests) == 1 + stored


def test_a_new_conversation_survives_its_socket_dropping_before_any_message(app):
    first = app.client()
    session = first.hello()["conversation_id"]
    first.close()
    time.sleep(0.3)
    again = app.client()
    ready = again.hello(session)
    assert ready["conversation_id"] == session and ready["history"] == []
    assert again.turn("now I write")[-1]["status"] == "complete"


def test_a_new_chat_does_not_wait_for_a_provider_that_never_answers(start_app, fake):
    fake.models_answer = False
    app = start_app("--idle-limit", "30")
    client = app.client()
    started = time.monotonic()
    ready = client.hello()  # recv waits up to 10 s, far below the 30 s idle limit
    assert time.monotonic() - started < 5
    assert ready["model"] == ""
    client.send("stop")  # the receive loop is not blocked either
    assert client.hello()["type"] == "ready"


def test_a_new_chat_gets_the_default_model_once_the_provider_names_it(app):
    client = app.client()
    ready = client.hello()
    model = ready["model"] or client.until("conversation")[-1]["model"]
    assert model == "fake-model"


def test_frames_before_hello_other_than_message_create_nothing(app, fake):
    client = app.client()
    client.send("stop")
    client.send("regenerate")
    error = client.recv()
    assert error["code"] == "bad_frame" and "hello first" in error["message"]
    client.send("edit", message_id="x", content="y")
    assert client.recv()["code"] == "bad_frame"
    assert client.hello()["type"] == "ready"  # the stop created nothing and sent nothing
    assert app.get("/api/conversations")["conversations"] == [] and fake.chat_requests == []


def test_unknown_conversation_is_an_error_and_the_socket_stays_usable(app):
    client = app.client()
    client.send("hello", conversation_id="no-such-conversation")
    error = client.recv()
    assert error["type"] == "error" and error["code"] == "unknown_conversation"
    assert client.hello()["type"] == "ready"


# Rule 1: a turn belongs to the conversation


def test_two_sockets_on_one_conversation_see_the_same_stream(app, fake):
    fake.queue(Reply(count=20, pace=0.01))
    a, b = app.client(), app.client()
    session = a.hello()["conversation_id"]
    b.hello(session)
    a_frames = a.turn("hello both")
    b_frames = b.until("turn_end")
    # The same stream; a socket that fell behind for a moment may get some chunks in one frame.
    assert stream_of(a_frames) == stream_of(b_frames)
    assert chunk_seqs(a_frames) == list(range(1, 21))


def test_a_turn_runs_to_its_end_when_every_socket_has_gone(app, fake):
    fake.queue(Reply(count=30, pace=0.02))
    client = app.client()
    session = client.hello()["conversation_id"]
    client.send("message", content="keep going without me")
    client.until("chunk")
    client.close()
    wait_for(lambda: fake.completed >= 1)  # the reply (then the title the conversation is named by)
    history = app.client().hello(session)["history"]

    def settled() -> bool:
        nonlocal history
        history = app.client().hello(session)["history"]
        return len(history) == 2 and history[1]["status"] == "complete"

    wait_for(settled)
    assert history[1]["content"] == "".join(f"tok{i} " for i in range(1, 31))


# Rule 2: reconnect and reload lose nothing and repeat nothing


def test_reload_mid_turn_gives_a_byte_identical_transcript(app, fake):
    # 3 s of reply: on a busy machine a reconnect and hello can take a second, and the reply must
    # still be running when they are done.
    fake.queue(Reply(count=150, pace=0.02))
    watcher, leaver = app.client(), app.client()
    session = watcher.hello()["conversation_id"]
    leaver.hello(session)
    leaver.send("message", content="a long answer please")
    for _ in range(10):
        leaver.until("chunk")
    leaver.close()
    time.sleep(0.2)  # chunks stream on while nobody is on that socket

    returning = app.client()
    ready = returning.hello(session)
    running = ready["running"]
    assert running["seq"] >= 10 and running["content"]
    assert [m["role"] for m in ready["history"]] == ["user"]
    rest = returning.until("turn_end")
    assert chunk_seqs(rest) == list(range(running["seq"] + 1, 151))  # nothing repeated, nothing missing

    undisturbed = watcher.until("turn_end")
    assert running["content"] + reply_text(rest) == reply_text(undisturbed)
    assert rest[-1] == undisturbed[-1]


# Rule 3: one running turn per conversation


def test_a_message_while_a_turn_runs_is_refused_and_the_turn_is_untouched(app, fake):
    fake.queue(Reply(count=20, pace=0.02))
    client = app.client()
    client.hello()
    client.send("message", content="first")
    client.until("chunk")
    client.send("message", content="second")
    frames = client.until("turn_end")
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["turn_in_progress"]
    assert frames[-1]["status"] == "complete"
    assert reply_text(frames).endswith("tok20 ")
    assert len(fake.chat_requests) == 1


# Rule 4: stop


def test_stop_hangs_up_on_the_provider_and_stores_the_partial_reply(app, fake):
    fake.queue(Reply(count=200, pace=0.02))
    client = app.client()
    session = client.hello()["conversation_id"]
    client.send("message", content="go on forever")
    start = client.until("turn_start")[-1]
    received = client.until("chunk")
    client.send("stop", turn_id=start["turn_id"])
    received += client.until("turn_end")
    assert received[-1]["status"] == "stopped"
    wait_for(lambda: fake.hangups == 1, timeout=2)
    assert fake.completed == 0
    reply = app.client().hello(session)["history"][1]
    assert reply["status"] == "stopped"
    assert reply["content"] == reply_text(received) and reply["content"]


def test_stop_without_a_running_turn_is_ignored(app):
    client = app.client()
    client.hello()
    client.send("stop")
    frames = client.turn("still works")
    assert frames[-1]["status"] == "complete"
    assert not [f for f in frames if f["type"] == "error"]


# Rule 5: provider failures


def assert_failed_turn(app, client, session, frames, status=None):
    error = next(f for f in frames if f["type"] == "error")
    assert error["code"] == "provider_error" and error["turn_id"] == frames[0]["turn_id"]
    if status is not None:
        assert error["status"] == status
    assert frames[-1]["type"] == "turn_end" and frames[-1]["status"] == "error"
    history = app.client().hello(session)["history"]
    assert history[0]["role"] == "user" and history[1]["status"] == "error"
    assert history[1]["content"] == reply_text(frames)
    return error


def test_an_http_error_is_retried_before_the_first_chunk_then_reported(app, fake):
    fake.queue(*[Reply(status=503, message="Overloaded, try later")] * 3)
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    error = assert_failed_turn(app, client, session, frames, status=503)
    assert "Overloaded, try later" in error["message"]
    assert len(fake.chat_requests) == 3


def test_retries_back_off(start_app, fake):
    app = start_app("--retry-wait", "0.2", "--retries", "3")
    fake.queue(*[Reply(status=500)] * 3)
    client = app.client()
    client.hello()
    client.turn("hi")
    first, second, third = (r["at"] for r in fake.chat_requests)
    # Waits of 0.2 s, then twice that. A busy machine can only make them longer, so only the lower
    # bounds are asserted: the second wait cannot have been 0.2 s again.
    assert second - first >= 0.2
    assert third - second >= 0.4


def test_a_retry_that_succeeds_sends_every_chunk_once(app, fake):
    fake.queue(Reply(status=502), Reply(count=4))
    client = app.client()
    client.hello()
    frames = client.turn("hi")
    assert frames[-1]["status"] == "complete"
    assert chunk_seqs(frames) == [1, 2, 3, 4]
    assert len(fake.chat_requests) == 2


def test_a_client_error_is_not_retried_and_the_key_never_leaks(app, fake):
    fake.queue(Reply(status=401, message=f"Incorrect API key provided: {API_KEY}."))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    error = assert_failed_turn(app, client, session, frames, status=401)
    assert "Incorrect API key provided" in error["message"]
    assert len(fake.chat_requests) == 1
    assert fake.chat_requests[0]["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in json.dumps(client.frames)
    app.stop()
    assert API_KEY not in app.logs()


def test_a_stream_cut_in_the_middle_keeps_the_partial_reply(app, fake):
    fake.queue(Reply(count=10, cut_after=4))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    assert reply_text(frames) == "tok1 tok2 tok3 tok4 "
    error = assert_failed_turn(app, client, session, frames)
    assert error["message"].startswith(f"The provider's stream broke off at http://127.0.0.1:{fake.port}/v1/: ")
    assert len(fake.chat_requests) == 1  # never retried after the first chunk


def test_a_chunk_the_app_cannot_read_is_a_provider_error(app, fake):
    fake.queue(Reply(raw=['{"choices": [{"index": 0, "delta": {"content": 42}}]}']))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    error = assert_failed_turn(app, client, session, frames)
    assert "cannot read" in error["message"]


def test_a_surrogate_pair_split_across_chunks_arrives_whole_and_is_stored(app, fake):
    line = '{"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": %s}]}'
    halves = [line % ("smile \\ud83d", "null"), line % ("\\ude00, and \\udc00 alone", "null"), line % ("", '"stop"')]
    fake.queue(Reply(raw=halves))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    assert frames[-1]["status"] == "complete"
    assert reply_text(frames) == "smile \U0001f600, and \ufffd alone"
    assert client.turn("the socket still works")[-1]["status"] == "complete"
    app.stop()
    app.start()
    reply = app.client().hello(session)["history"][1]
    assert (reply["content"], reply["status"]) == ("smile \U0001f600, and \ufffd alone", "complete")


def test_a_stalled_stream_fails_after_the_idle_limit(start_app, fake):
    app = start_app("--idle-limit", "0.5")
    fake.queue(Reply(count=10, stall_after=3))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    error = assert_failed_turn(app, client, session, frames)
    assert "sent nothing for 0.5 s" in error["message"]
    assert reply_text(frames) == "tok1 tok2 tok3 "
    wait_for(lambda: fake.hangups == 1)


def test_a_refused_connection_is_a_provider_error(start_app, fake):
    app = start_app("--base-url", "http://127.0.0.1:9/v1", "--model", "any", "--retries", "2")
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("hi")
    error = assert_failed_turn(app, client, session, frames)
    assert "Could not reach the provider at http://127.0.0.1:9/v1" in error["message"]


def test_a_keyless_endpoint_gets_no_authorization_header(start_app, fake):
    app = start_app(env={"POCKETCHAT_API_KEY": ""})
    client = app.client()
    assert client.hello()["model"] == "fake-model"
    assert client.turn("hi")[-1]["status"] == "complete"
    assert all("authorization" not in request["headers"] for request in fake.requests)


def test_credentials_in_the_base_url_reach_neither_the_browser_nor_the_log(start_app, fake):
    app = start_app("--base-url", f"http://user:sk-in-url-SECRET@127.0.0.1:{fake.port}/v1")
    client = app.client()
    ready = client.hello()
    assert ready["provider"]["base_url"] == f"http://127.0.0.1:{fake.port}/v1/"
    assert client.turn("hi")[-1]["status"] == "complete"
    app.stop()
    assert "SECRET" not in json.dumps(client.frames) and "SECRET" not in app.logs()
    # The user and password are sent to the provider as Basic auth.
    sent = base64.b64decode(fake.chat_requests[-1]["headers"]["authorization"].removeprefix("Basic "))
    assert sent == b"user:sk-in-url-SECRET"


def test_a_server_failure_outside_a_turn_closes_the_socket_with_1011_and_the_server_carries_on(app, tmp_path, mode):
    if mode != "single":
        pytest.skip("breaks the SQLite file: one process only")
    client = app.client()
    session = client.hello()["conversation_id"]
    assert client.turn("hi")[-1]["status"] == "complete"
    app.stop()
    app.start()
    # Reading the conversation back now fails: its messages' table is gone. (The file itself replaced
    # would not do: a connection the app opened at start, for its reads, goes on reading the file it opened.)
    with sqlite3.connect(app.db_path) as db:
        db.execute("ALTER TABLE messages RENAME TO messages_gone")
    broken = app.client()
    broken.send("hello", conversation_id=session)
    with pytest.raises(ConnectionClosedError) as closed:
        broken.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    assert "WebSocket handler failed" in app.logs() and "no such table: messages" in app.logs()
    assert app.client().hello()["type"] == "ready"  # other sockets are still served


# Rule 6: bad input changes nothing

TOOL_RESULT = '{"type": "tool_result", "call_id": "c1", "result": '


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        ("not json", "bad_frame", "not valid JSON"),
        ("[1, 2]", "bad_frame", "JSON object"),
        ('{"content": "no type"}', "bad_frame", "Unknown frame type"),
        ('{"type": "shout"}', "bad_frame", "Unknown frame type"),
        ('{"type": "message"}', "bad_frame", "'content'"),
        ('{"type": "message", "content": 42}', "bad_frame", "'content'"),
        ('{"type": "message", "content": "   \\n "}', "bad_frame", "must not be empty"),
        ('{"type": "hello", "conversation_id": 7}', "bad_frame", "'conversation_id'"),
        ('{"type": "stop", "turn_id": []}', "bad_frame", "'turn_id'"),
        ("[" * 100_000 + "]" * 100_000, "bad_frame", "nested too deeply"),
        # Deep enough for what reads it later, not for the parser: a client tool's answer (issue 31, item 11).
        (TOOL_RESULT + "[" * 990 + "]" * 990 + "}", "bad_frame", "nested"),
        (TOOL_RESULT + '{"a":' * 990 + "1" + "}" * 991, "bad_frame", "nested"),
        ('{"type": "message", "content": "\\ud83d"}', "bad_frame", "lone surrogate"),
        ('{"type": "message", "content": "a\\u0000b"}', "bad_frame", "NUL"),
        (b'{"type": "hello"}', "bad_frame", "Binary frames"),
        (json.dumps({"type": "message", "content": "x" * 300_000}), "too_large", "limit"),
    ],
)
def test_bad_input_gets_an_error_and_changes_nothing(app, fake, raw, code, says):
    client = app.client()
    session = client.hello()["conversation_id"]
    client.send_raw(raw)
    error = client.recv()
    assert error["type"] == "error" and error["code"] == code and says in error["message"]
    assert client.hello(session)["history"] == []
    assert fake.chat_requests == []
    assert client.turn("still usable")[-1]["status"] == "complete"


# Rule 7: origins


def test_a_foreign_origin_is_refused(app):
    with pytest.raises(InvalidStatus) as refused:
        connect(app.ws_url, additional_headers={"Origin": "http://evil.example"}, legacy=True)
    assert refused.value.response.status_code == 403


def test_the_pages_own_origin_and_allowed_origins_are_accepted_in_any_case(start_app):
    app = start_app("--allowed-origins", "https://Chat.Example.org")
    for origin in (f"http://127.0.0.1:{app.port}", "https://chat.example.org", "HTTPS://CHAT.EXAMPLE.ORG/"):
        assert app.client(Origin=origin).hello()["type"] == "ready"


def test_a_page_on_another_name_for_this_server_is_refused(app):
    """DNS rebinding: evil.example resolves to 127.0.0.1, so its page would be same-origin with itself."""
    request = urllib.request.Request(app.url + "/api/conversations", headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400
    refused.value.close()
    with pytest.raises(InvalidStatus):
        connect(app.ws_url, additional_headers={"Host": "evil.example", "Origin": "http://evil.example"}, legacy=True)


# Rule 8: unguessable ids


def test_logs_hold_neither_message_texts_nor_whole_conversation_ids(app, fake):
    fake.queue(Reply(tokens=["a secret plan"]))
    client = app.client()
    session = client.hello()["conversation_id"]
    client.turn("my private question")
    app.get(f"/api/conversations/{session}")
    app.stop()
    logs = app.logs()
    assert f"turn {client.frames[-1]['turn_id']} conversation {session[:6]}… status=complete" in logs
    assert "my private question" not in logs and "a secret plan" not in logs and session not in logs


def test_conversation_ids_are_random_and_long(app):
    client = app.client()
    ids = {client.hello()["conversation_id"] for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) >= 22 and i.replace("-", "").replace("_", "").isalnum() for i in ids)


def test_the_server_binds_to_loopback_unless_told_otherwise(app):
    listening = {c.laddr.ip for c in psutil.Process(app.process.pid).net_connections() if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}


# Protocol additions: regenerate, edit, reasoning


def test_regenerate_answers_the_last_user_message_again_in_a_new_turn(app, fake):
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]))
    client = app.client()
    session = client.hello()["conversation_id"]
    question = client.turn("question")[0]["message"]
    client.send("regenerate")
    frames = client.until("turn_end")
    assert frames[0]["type"] == "turn_start" and frames[0]["message"]["id"] == question["id"]
    assert reply_text(frames) == "second"
    history = app.client().hello(session)["history"]
    assert [(m["role"], m["content"]) for m in history] == [("user", "question"), ("assistant", "second")]
    assert [m["content"] for m in fake.chat_requests[-1]["json"]["messages"][1:]] == ["question"]


def test_edit_answers_a_new_version_of_a_user_message(app, fake):
    fake.queue(Reply(tokens=["about cats"]), Reply(tokens=["about dogs"]))
    client = app.client()
    session = client.hello()["conversation_id"]
    original = client.turn("cats?")[0]["message"]
    client.send("edit", message_id=original["id"], content="dogs?")
    edited = client.until("turn_end")[0]["message"]
    assert (edited["content"], edited["parent_id"]) == ("dogs?", original["parent_id"])
    assert edited["versions"] == [original["id"], edited["id"]]
    history = app.client().hello(session)["history"]
    assert [(m["role"], m["content"]) for m in history] == [("user", "dogs?"), ("assistant", "about dogs")]


def test_regenerate_and_edit_refuse_what_they_cannot_do(app, fake):
    client = app.client()
    client.hello()
    client.send("regenerate")
    assert client.recv()["code"] == "nothing_to_regenerate"
    reply = client.turn("one")[-1]["message_id"]
    for not_yours in (reply, "no-such-message"):
        client.send("edit", message_id=not_yours, content="changed")
        error = client.recv()
        assert error["code"] == "bad_frame" and "no message of yours with that id" in error["message"]
    fake.queue(Reply(count=50, pace=0.02))
    client.send("message", content="three")
    client.until("chunk")
    client.send("regenerate")
    assert [f["code"] for f in client.until("turn_end") if f["type"] == "error"] == ["turn_in_progress"]


def test_chunks_that_arrive_together_reach_the_socket_in_fewer_frames_covering_each_seq_once(app, fake):
    # Unpaced, the fake's 300 chunks come in a few network reads: what one read brought goes to the
    # socket as frames that carry several chunks (first_seq to seq), their text joined.
    fake.queue(Reply(count=300))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("many")
    chunks = [f for f in frames if f["type"] == "chunk"]
    assert chunk_seqs(frames) == list(range(1, 301))  # every seq once, in order
    assert reply_text(frames) == "".join(f"tok{i} " for i in range(1, 301))
    assert len(chunks) < 300 and all(f["first_seq"] < f["seq"] for f in chunks if "first_seq" in f)
    assert app.client().hello(session)["history"][1]["content"] == reply_text(frames)


def test_reasoning_streams_in_chunks_and_stays_in_the_history(app, fake):
    fake.queue(Reply(reasoning=["Let me ", "think."], tokens=["Done."]))
    client = app.client()
    session = client.hello()["conversation_id"]
    frames = client.turn("why?")
    assert "".join(f.get("reasoning", "") for f in frames if f["type"] == "chunk") == "Let me think."
    assert reply_text(frames) == "Done."
    reply = app.client().hello(session)["history"][1]
    assert (reply["reasoning"], reply["content"]) == ("Let me think.", "Done.")


def test_the_deprecated_session_id_still_opens_a_conversation_and_is_still_sent(app):
    first = app.client()
    ready = first.hello()
    assert ready["session_id"] == ready["conversation_id"]
    again = app.client()
    again.send("hello", session_id=ready["conversation_id"])
    assert again.until("ready")[-1]["conversation_id"] == ready["conversation_id"]
