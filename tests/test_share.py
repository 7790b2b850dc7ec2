"""Share links: made, listed and revoked by the owner only; a link shows its snapshot to anyone who has
it, and grants nothing else; revoked (or its conversation deleted), it is a 404 at once, on every replica."""

import hashlib
import sqlite3

import pytest

from tests.conftest import MODES
from tests.fake_openai import Reply
from tests.test_auth import TOKEN, call, close_code, sign_in

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)
USER = "X-Forwarded-User"


@pytest.fixture
def app(start_app):
    return start_app("--auth", "header")


def as_user(user: str | None) -> dict[str, str]:
    return {USER: user} if user else {}


def chat(app, user: str = "alice", text: str = "hello") -> str:
    """A new conversation of `user` with one turn; its id."""
    client = app.client(**as_user(user))
    conversation = client.hello()["conversation_id"]
    assert client.turn(text)[-1]["status"] == "complete"
    return conversation


def make(app, conversation: str, user: str = "alice") -> dict:
    answer = call(app, "POST", f"/api/conversations/{conversation}/shares", **as_user(user))
    assert answer.status == 201, answer.body
    return answer.json()


def token_of(share: dict) -> str:
    return share["url"].removeprefix("/s/")


def test_a_link_shows_the_snapshot_as_it_was_when_made_to_anyone(app, fake):
    fake.queue(Reply(tokens=["Hi ", "there"]))
    client = app.client(**as_user("alice"))
    conversation = client.hello()["conversation_id"]
    client.turn("hello")
    share = make(app, conversation)
    assert set(share) == {"id", "url", "created_at"} and share["url"].startswith("/s/")
    client.turn("said after the link was made")
    snapshot = call(app, "GET", f"/api/shared/{token_of(share)}")  # no user: anyone
    assert snapshot.status == 200
    body = snapshot.json()
    assert body["title"] == "hello" and body["created_at"] == share["created_at"]
    assert [(m["role"], m["content"], m["status"]) for m in body["messages"]] == [
        ("user", "hello", "complete"),
        ("assistant", "Hi there", "complete"),
    ]
    page = call(app, "GET", share["url"])
    assert page.status == 200 and b'src="/static/shared.js"' in page.body
    for answer in (snapshot, page):
        assert answer.headers["Referrer-Policy"] == "no-referrer"
        assert "noindex" in answer.headers["X-Robots-Tag"]
        assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")
        assert answer.headers["Cache-Control"] == "no-store"
        assert "Set-Cookie" not in answer.headers


def test_the_owner_lists_and_revokes_and_a_revoked_link_is_a_404_at_once(app):
    conversation = chat(app)
    first, second = make(app, conversation), make(app, conversation)
    listed = call(app, "GET", f"/api/conversations/{conversation}/shares", **as_user("alice")).json()["shares"]
    assert listed == [{"id": first["id"], "created_at": first["created_at"]}, {k: second[k] for k in listed[1]}]
    revoke = f"/api/conversations/{conversation}/shares/{first['id']}"
    assert call(app, "DELETE", revoke, **as_user("alice")).status == 204
    assert call(app, "GET", f"/api/shared/{token_of(first)}").status == 404
    assert call(app, "GET", first["url"]).status == 404
    assert call(app, "GET", f"/api/shared/{token_of(second)}").status == 200
    assert call(app, "DELETE", revoke, **as_user("alice")).status == 404


def test_only_the_owner_makes_lists_or_revokes_links(app):
    conversation = chat(app)
    share = make(app, conversation)
    path = f"/api/conversations/{conversation}/shares"
    assert call(app, "POST", path, **as_user("bob")).status == 404
    assert call(app, "GET", path, **as_user("bob")).status == 404
    assert call(app, "DELETE", f"{path}/{share['id']}", **as_user("bob")).status == 404
    # Bob's own conversation does not reach Alice's link either.
    bobs = chat(app, "bob")
    assert call(app, "DELETE", f"/api/conversations/{bobs}/shares/{share['id']}", **as_user("bob")).status == 404
    assert call(app, "GET", f"/api/shared/{token_of(share)}").status == 200
    assert len(call(app, "GET", path, **as_user("alice")).json()["shares"]) == 1


def test_a_wrong_or_malformed_token_is_the_same_404(app):
    share = make(app, chat(app))
    token = token_of(share)
    wrong = ("A" if token[0] != "A" else "B") + token[1:]
    answers = [
        call(app, "GET", f"/api/shared/{candidate}")
        for candidate in (wrong, token[:-1], token + "A", "x", "%00", "a" * 3000)
    ]
    assert {answer.status for answer in answers} == {404}
    assert len({answer.body for answer in answers}) == 1
    assert call(app, "GET", f"/s/{wrong}").status == 404


def test_deleting_the_conversation_revokes_its_links(app):
    conversation = chat(app)
    share = make(app, conversation)
    assert call(app, "DELETE", f"/api/conversations/{conversation}", **as_user("alice")).status == 204
    assert call(app, "GET", f"/api/shared/{token_of(share)}").status == 404


def test_a_conversation_without_messages_has_nothing_to_share(app):
    conversation = app.client(**as_user("alice")).hello()["conversation_id"]
    answer = call(app, "POST", f"/api/conversations/{conversation}/shares", **as_user("alice"))
    assert answer.status == 409 and "no messages" in answer.json()["detail"]


def test_making_links_is_limited(start_app):
    app = start_app("--auth", "header", "--limit-changes-per-minute", "2")
    conversation = chat(app)
    make(app, conversation)
    make(app, conversation)
    limited = call(app, "POST", f"/api/conversations/{conversation}/shares", **as_user("alice"))
    assert limited.status == 429 and int(limited.headers["Retry-After"]) > 0
    assert len(call(app, "GET", f"/api/conversations/{conversation}/shares", **as_user("alice")).json()["shares"]) == 2


def test_a_conversation_has_twenty_links_at_most(app):
    conversation = chat(app)
    shares = [make(app, conversation) for _ in range(20)]
    over = call(app, "POST", f"/api/conversations/{conversation}/shares", **as_user("alice"))
    assert over.status == 409 and "revoke one" in over.json()["detail"]
    call(app, "DELETE", f"/api/conversations/{conversation}/shares/{shares[0]['id']}", **as_user("alice"))
    make(app, conversation)


def test_the_database_keeps_the_hash_and_the_log_neither(app, mode):
    share = make(app, chat(app))
    token = token_of(share)
    call(app, "GET", share["url"])
    call(app, "GET", f"/api/shared/{token}")
    call(app, "GET", f"/api/shared/{token}?token={token}")
    assert "GET /s/[hidden]" in app.logs() and token not in app.logs()
    if mode == "single":  # the same rows in PostgreSQL; SQLite's file is at hand
        with sqlite3.connect(app.db_path) as db:
            rows = db.execute("SELECT * FROM shares").fetchall()
        assert token not in repr(rows) and hashlib.sha256(token.encode()).hexdigest() in repr(rows)


def test_the_link_grants_nothing_else_whatever_the_sign_in(start_app):
    app = start_app("--auth", "token", "--token", TOKEN)
    _, cookie = sign_in(app)
    client = app.client(Cookie=cookie)
    conversation = client.hello()["conversation_id"]
    client.turn("hello")
    answer = call(app, "POST", f"/api/conversations/{conversation}/shares", Cookie=cookie)
    url = answer.json()["url"]
    # The visitor, with the link and no session:
    for path in (url, f"/api/shared/{token_of(answer.json())}"):
        shared = call(app, "GET", path)
        assert shared.status == 200 and "Set-Cookie" not in shared.headers
    for path in (
        "/api/conversations",
        f"/api/conversations/{conversation}",
        f"/api/conversations/{conversation}/shares",
    ):
        assert call(app, "GET", path).status == 401
    assert call(app, "GET", "/").status == 303
    assert close_code(app) == 4401


def test_a_revoke_on_one_replica_is_a_404_on_the_other_at_once(start_app, mode):
    if mode == "single":
        pytest.skip("replicas only")
    first, second = start_app("--auth", "header"), start_app("--auth", "header")
    conversation = chat(first)
    share = make(first, conversation)
    assert call(second, "GET", f"/api/shared/{token_of(share)}").status == 200
    assert call(second, "GET", f"/api/conversations/{conversation}/shares", **as_user("alice")).json()["shares"]
    revoke = f"/api/conversations/{conversation}/shares/{share['id']}"
    assert call(first, "DELETE", revoke, **as_user("alice")).status == 204
    assert call(second, "GET", f"/api/shared/{token_of(share)}").status == 404
    assert call(second, "GET", share["url"]).status == 404
