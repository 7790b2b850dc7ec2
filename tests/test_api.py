"""The page, the health check and the JSON API for conversations."""

import json
import urllib.error
import urllib.request

import pytest

from pocketchat.conversations import UNKNOWN
from tests.conftest import API_KEY, MODES
from tests.fake_openai import Reply

# Every rule holds in both modes: one process on SQLite, and a replica on PostgreSQL and Redis.
pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)


def request(app, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(app.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_the_page_and_health_check_are_served(app):
    status, body = request(app, "GET", "/")
    assert status == 200 and b'<script type="module" src="/static/app.js">' in body
    assert app.get("/healthz")["status"] == "ok"


def test_conversations_are_listed_newest_first(app):
    client = app.client()
    older = client.hello()["conversation_id"]
    client.turn("older one")
    newer = client.hello()["conversation_id"]
    client.turn("newer one")
    listed = app.get("/api/conversations")["conversations"]
    assert [c["id"] for c in listed] == [newer, older]
    assert [c["title"] for c in listed] == ["newer one", "older one"]


def test_rename_is_stored_and_told_to_attached_sockets(app):
    client = app.client()
    session = client.hello()["conversation_id"]
    status, body = request(app, "PATCH", f"/api/conversations/{session}", {"title": "  My plans  "})
    assert status == 200 and json.loads(body)["title"] == "My plans"
    assert client.until("conversation")[-1]["title"] == "My plans"
    assert app.get(f"/api/conversations/{session}")["title"] == "My plans"


def test_model_and_system_prompt_apply_to_the_next_turn(app, fake):
    client = app.client()
    session = client.hello()["conversation_id"]
    changes = {"model": "fake-model-large", "system_prompt": "Answer like a pirate."}
    assert request(app, "PATCH", f"/api/conversations/{session}", changes)[0] == 200
    client.turn("ahoy")
    sent = fake.chat_requests[-1]["json"]
    assert sent["model"] == "fake-model-large"
    assert sent["messages"][0] == {"role": "system", "content": "Answer like a pirate."}
    ready = app.client().hello(session)
    assert (ready["model"], ready["system_prompt"]) == ("fake-model-large", "Answer like a pirate.")


@pytest.mark.parametrize(
    "body",
    [{"title": ""}, {"title": 5}, {"model": ""}, {"title": "   "}, {"model": " \t "}, {"title": "\ud83d"}],
)
def test_a_bad_change_is_refused_and_changes_nothing(app, body):
    session = app.client().hello()["conversation_id"]
    status, _ = request(app, "PATCH", f"/api/conversations/{session}", body)
    assert status == 422
    record = app.get(f"/api/conversations/{session}")
    assert record["title"] is None and record["model"] == "fake-model"


def test_delete_stops_the_turn_tells_the_sockets_and_removes_everything(app, fake):
    fake.queue(Reply(count=500, pace=0.02))
    client = app.client()
    session = client.hello()["conversation_id"]
    client.send("message", content="doomed")
    client.until("chunk")
    status, _ = request(app, "DELETE", f"/api/conversations/{session}")
    assert status == 204
    frames = client.until("deleted")
    assert frames[-1]["conversation_id"] == session
    assert any(f["type"] == "turn_end" and f["status"] == "stopped" for f in frames)
    assert request(app, "GET", f"/api/conversations/{session}")[0] == 404
    client.send("hello", conversation_id=session)
    assert client.recv()["code"] == "unknown_conversation"


def test_unknown_conversations_are_404(app):
    for method in ("GET", "PATCH", "DELETE"):
        assert request(app, method, "/api/conversations/nope", {} if method == "PATCH" else None)[0] == 404


# Ids no conversation can have: a NUL (PostgreSQL refuses it in text), the UTF-8 of a lone surrogate
# (decoded as U+FFFD), a character beyond ASCII, a space, far too long.
IMPOSSIBLE_IDS = ["%00", "abc%00def", "%ED%A0%BD", "%C3%A9t%C3%A9", "a%20b", "x" * 5000]


@pytest.mark.parametrize("bad_id", IMPOSSIBLE_IDS)
def test_an_id_that_cannot_exist_is_404_on_every_route(app, bad_id):
    for method, path in [
        ("GET", f"/api/conversations/{bad_id}"),
        ("PATCH", f"/api/conversations/{bad_id}"),
        ("DELETE", f"/api/conversations/{bad_id}"),
        ("GET", f"/api/conversations/{bad_id}/export.md"),
    ]:
        status, body = request(app, method, path, {"title": "x"} if method == "PATCH" else None)
        assert (status, json.loads(body)) == (404, {"detail": UNKNOWN}), (method, path[:60])
    client = app.client()
    client.send("hello", conversation_id="\u00e9t\u00e9 " + "\ufffd")
    assert client.recv()["code"] == "unknown_conversation"
    assert client.hello()["type"] == "ready"  # the socket goes on


def test_export_is_markdown_of_the_whole_conversation(app, fake):
    fake.queue(Reply(tokens=["**bold** answer"]))
    client = app.client()
    session = client.hello()["conversation_id"]
    client.turn("a question")
    status, body = request(app, "GET", f"/api/conversations/{session}/export.md")
    text = body.decode()
    assert status == 200
    assert text.startswith("# a question\n")
    assert "## You\n\na question\n" in text and "## Assistant\n\n**bold** answer\n" in text


def test_models_come_from_the_provider_with_the_embedded_model_last(app):
    assert app.get("/api/models")["models"] == ["fake-model", "fake-model-large", "SmolLM2-135M-Instruct.Q4_1"]


def test_the_embedded_model_is_listed_when_the_remote_provider_is_down(start_app):
    app = start_app("--base-url", "http://127.0.0.1:9/v1", "--model", "remote-model", "--retries", "1")
    listed = app.get("/api/models")
    assert listed["models"] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert "Could not reach the provider at http://127.0.0.1:9/v1" in listed["error"]


def test_the_health_check_says_ok_with_its_parts(app, mode):
    parts = {"status": "ok", "store": "ok", **({"redis": "ok"} if mode == "replicas" else {})}
    assert app.get("/healthz") == parts
    assert app.get("/livez") == {"status": "alive"}


def test_metrics_count_turns_chunks_and_provider_errors_and_show_no_secret(app, fake):
    client = app.client()
    client.hello()
    client.turn("one")
    fake.queue(Reply(status=401, message="bad key"))
    client.turn("two")
    with urllib.request.urlopen(app.url + "/metrics", timeout=10) as answer:
        assert answer.headers["content-type"].startswith("text/plain")
        text = answer.read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines["pocketchat_chunks_total"]) == 5
    assert float(lines["pocketchat_running_turns"]) == 0 and float(lines["pocketchat_open_sockets"]) == 1
    assert float(lines["pocketchat_first_chunk_seconds_count"]) == 1
    assert float(lines['pocketchat_provider_errors_total{kind="http_401"}']) == 1
    assert float(lines["pocketchat_store_write_seconds_count"]) >= 2
    assert API_KEY not in text and "bad key" not in text
