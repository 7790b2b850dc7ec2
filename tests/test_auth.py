"""Sign-in (token and header modes), ownership and the refusal to serve the world without a sign-in,
over real HTTP and WebSockets against the app under uvicorn."""

import http.client
import json
import sqlite3
import subprocess
import sys
import time
from urllib.parse import urlencode

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import main
from pocketchat.settings import Settings
from pocketchat.store.sqlite_schema import MIGRATIONS
from tests.conftest import ROOT, AppProcess
from tests.test_protocol import wait_for

TOKEN = "a-token-for-the-tests-0123456789"


class Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = response.headers
        self.body = response.read()

    def json(self) -> dict:
        return json.loads(self.body)


def call(app: AppProcess, method: str, path: str, body: bytes | dict | None = None, **headers: str) -> Answer:
    """One HTTP request, redirects not followed (the test looks at them)."""
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=10)
    if isinstance(body, dict):
        body, headers = json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    try:
        connection.request(method, path, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
        return Answer(connection.getresponse())
    finally:
        connection.close()


def sign_in(app: AppProcess, token: str = TOKEN) -> tuple[Answer, str]:
    form = urlencode({"token": token}).encode()
    answer = call(app, "POST", "/login", form, Content_Type="application/x-www-form-urlencoded")
    cookie = answer.headers.get("set-cookie", "")
    return answer, cookie.split(";")[0]


def close_code(app: AppProcess, **headers: str) -> int:
    """Open /ws with these headers, say hello, and return the code it is closed with."""
    with (
        connect(app.ws_url, additional_headers=headers, open_timeout=10) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.send('{"type": "hello"}')  # the server may have closed it already
        while True:
            ws.recv(10)
    return closed.value.rcvd.code


@pytest.fixture
def token_app(start_app):
    return start_app("--auth", "token", "--token", TOKEN)


def test_without_a_session_the_page_redirects_the_api_says_401_and_the_socket_closes_4401(token_app):
    assert call(token_app, "GET", "/").status == 303
    assert call(token_app, "GET", "/").headers["location"] == "/login"
    for path in ("/api/conversations", "/api/models", "/api/conversations/anything/export.md"):
        answer = call(token_app, "GET", path)
        assert answer.status == 401 and "Sign in first" in answer.json()["detail"]
    assert close_code(token_app) == 4401
    page = call(token_app, "GET", "/login")
    assert page.status == 200 and b'name="token"' in page.body
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert call(token_app, "GET", "/healthz").status == 200  # for load balancers


def test_signing_in_with_the_token_gives_a_session_cookie_that_opens_everything(token_app):
    answer, cookie = sign_in(token_app)
    assert answer.status == 303 and answer.headers["location"] == "/"
    attributes = answer.headers["set-cookie"].lower()
    assert cookie.startswith("pocketchat_session=") and "httponly" in attributes and "samesite=lax" in attributes
    assert "secure" not in attributes  # plain http on loopback
    assert call(token_app, "GET", "/", Cookie=cookie).status == 200
    assert call(token_app, "GET", "/api/conversations", Cookie=cookie).json() == {"conversations": []}
    client = token_app.client(Cookie=cookie)
    assert client.hello()["type"] == "ready"
    assert client.turn("signed in")[-1]["status"] == "complete"


def test_a_forged_or_tampered_cookie_is_no_session(token_app):
    _, cookie = sign_in(token_app)
    session_id, signature = cookie.removeprefix("pocketchat_session=").split(".")
    for forged in (f"{session_id}.{'0' * len(signature)}", f"{session_id[:-1]}A.{signature}", "x"):
        assert call(token_app, "GET", "/api/conversations", Cookie=f"pocketchat_session={forged}").status == 401


# Cookies ignore ports: any service on this host can plant one, bytes and all.
MALFORMED_COOKIES = [
    "pocketchat_session=abc.\xe9\xff\u00ff",  # non-ASCII bytes in the signature
    "pocketchat_session=\xe9t\xe9.0123",  # and in the session id
    "pocketchat_session=..........",
    "pocketchat_session=",
    "pocketchat_session=%FF%00.%FE; pocketchat_session=a.b.c",
]


@pytest.mark.parametrize("cookie", MALFORMED_COOKIES)
def test_a_malformed_cookie_is_a_missing_cookie_on_every_route_and_the_socket(token_app, cookie):
    answers = {
        path: call(token_app, "GET", path, Cookie=cookie).status
        for path in ("/", "/login", "/livez", "/healthz", "/metrics", "/static/app.js", "/api/conversations")
    }
    assert answers == {
        "/": 303, "/login": 200, "/livez": 200, "/healthz": 200, "/metrics": 200, "/static/app.js": 200,
        "/api/conversations": 401,
    }  # fmt: skip
    form = urlencode({"token": TOKEN}).encode()
    signed_in = call(token_app, "POST", "/login", form, Cookie=cookie, Content_Type="application/x-www-form-urlencoded")
    assert signed_in.status == 303
    assert call(token_app, "POST", "/logout", Cookie=cookie).status == 401  # no session to end
    assert close_code(token_app, Cookie=cookie) == 4401
    token_app.stop()
    assert "Traceback" not in token_app.logs()


def test_a_wrong_token_is_refused_and_five_a_minute_then_429_even_for_the_right_one(token_app):
    for _ in range(5):
        answer, cookie = sign_in(token_app, "not-the-token-at-all-00000")
        assert answer.status == 401 and cookie == "" and b"That token is not right." in answer.body
    limited, cookie = sign_in(token_app)
    assert limited.status == 429 and cookie == ""
    assert 1 <= int(limited.headers["retry-after"]) <= 60


def test_a_sign_in_link_signs_in_and_redirects_to_a_clean_url_and_the_log_shows_no_token(token_app):
    answer = call(token_app, "GET", f"/login?token={TOKEN}")
    assert answer.status == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"].split(";")[0]
    assert call(token_app, "GET", "/api/conversations", Cookie=cookie).status == 200
    wrong = call(token_app, "GET", "/login?token=wrong-token-0000000000")
    assert wrong.status == 303 and wrong.headers["location"] == "/login?failed"
    token_app.stop()
    logs = token_app.logs()
    assert "GET /login?token=[hidden] HTTP/1.1" in logs
    assert TOKEN not in logs and "wrong-token" not in logs and cookie.split("=")[1] not in logs


@pytest.mark.parametrize(
    "query",
    [
        f"%74oken={TOKEN}",  # signs in: the framework decodes the key
        f"a=1;token={TOKEN}",
        f"token=x&token={TOKEN}",
        f"+token={TOKEN}",
        f"x=1%26token%3D{TOKEN}",
        f"TOKEN={TOKEN}",
        f"%2574oken={TOKEN}",
    ],
)
def test_the_access_log_hides_the_token_however_the_query_spells_it(token_app, query):
    answer = call(token_app, "GET", f"/login?{query}")
    if query.startswith("%74oken="):
        assert answer.status == 303 and answer.headers["location"] == "/"  # it did sign in
    token_app.stop()
    logs = token_app.logs()
    assert '"GET /login?' in logs  # the line is there ...
    assert TOKEN not in logs  # ... without the token


def test_signing_out_closes_the_open_sockets_with_4401_and_the_cookie_is_dead(token_app):
    _, cookie = sign_in(token_app)
    _, other_cookie = sign_in(token_app)  # another browser: stays signed in
    socket = token_app.client(Cookie=cookie)
    socket.hello()
    other = token_app.client(Cookie=other_cookie)
    other.hello()
    answer = call(token_app, "POST", "/logout", Cookie=cookie)
    assert answer.status == 303 and answer.headers["location"] == "/login"
    assert "pocketchat_session=" in answer.headers["set-cookie"] and "max-age=0" in answer.headers["set-cookie"].lower()
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(10)
    assert closed.value.rcvd.code == 4401
    assert call(token_app, "GET", "/api/conversations", Cookie=cookie).status == 401
    assert close_code(token_app, Cookie=cookie) == 4401
    assert other.hello()["type"] == "ready"


def test_revoke_sessions_from_the_command_line_signs_every_browser_out(token_app):
    _, cookie = sign_in(token_app)
    socket = token_app.client(Cookie=cookie)
    socket.hello()
    command = [sys.executable, str(ROOT / "main.py"), "--revoke-sessions", "--db-path", str(token_app.db_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    assert "Revoked 1 sessions" in done.stdout
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(15)  # the server notices within seconds
    assert closed.value.rcvd.code == 4401
    wait_for(lambda: call(token_app, "GET", "/api/conversations", Cookie=cookie).status == 401)


def test_behind_a_trusted_proxy_over_https_the_cookie_is_secure(token_app):
    answer, _ = sign_in_through_proxy(token_app)
    assert "secure" in answer.headers["set-cookie"].lower()


@pytest.mark.parametrize(
    ("header", "value", "secure"),
    [
        ("X-Forwarded-Proto", "https, http", True),  # TLS ended at the first of two proxies
        ("X-Forwarded-Proto", "HTTPS", True),
        ("X-Forwarded-Proto", " Https ,http", True),
        ("Forwarded", "for=198.51.100.7;proto=https", True),  # RFC 7239
        ("Forwarded", 'for="[2001:db8::1]";Proto="HTTPS", for=10.0.0.1;proto=http', True),
        ("X-Forwarded-Proto", "http, https", False),  # the browser's own hop was plain http
        ("Forwarded", "for=198.51.100.7;proto=http, for=10.0.0.1;proto=https", False),
        ("X-Forwarded-Proto", "httpsx", False),
    ],
)
def test_the_cookie_is_secure_when_the_first_hop_a_trusted_proxy_names_is_https(token_app, header, value, secure):
    answer, cookie = sign_in_through_proxy(token_app, **{header.replace("-", "_"): value})
    assert cookie.startswith("pocketchat_session=")
    assert ("secure" in answer.headers["set-cookie"].lower()) is secure


def test_the_forwarded_proto_of_an_untrusted_peer_is_not_believed(start_app):
    app = start_app("--auth", "token", "--token", TOKEN, "--trusted-proxies", "192.0.2.1")
    for header in ({"X_Forwarded_Proto": "https"}, {"Forwarded": "proto=https"}):
        answer, cookie = sign_in_through_proxy(app, **header)
        assert cookie and "secure" not in answer.headers["set-cookie"].lower()


def sign_in_through_proxy(app: AppProcess, **forwarded: str) -> tuple[Answer, str]:
    form = urlencode({"token": TOKEN}).encode()
    answer = call(
        app,
        "POST",
        "/login",
        form,
        Content_Type="application/x-www-form-urlencoded",
        X_Forwarded_For="198.51.100.7",
        **(forwarded or {"X_Forwarded_Proto": "https"}),
    )
    return answer, answer.headers.get("set-cookie", "").split(";")[0]


def test_a_state_changing_request_from_another_origin_is_refused(token_app):
    _, cookie = sign_in(token_app)
    client = token_app.client(Cookie=cookie)
    session = client.hello()["conversation_id"]
    path = f"/api/conversations/{session}"
    foreign = call(token_app, "PATCH", path, {"title": "pwned"}, Cookie=cookie, Origin="http://evil.example")
    assert foreign.status == 403
    assert call(token_app, "DELETE", path, Cookie=cookie, Origin="http://127.0.0.1:1").status == 403
    assert call(token_app, "POST", "/logout", Cookie=cookie, Origin="http://evil.example").status == 403
    # A form on another site whose Origin the browser hid ("null") is told apart by its fetch metadata.
    hidden = {"Cookie": cookie, "Origin": "null"}
    assert call(token_app, "POST", "/logout", **hidden, Sec_Fetch_Site="cross-site").status == 403
    assert call(token_app, "POST", "/logout", **hidden, Sec_Fetch_Site="same-site").status == 403
    assert call(token_app, "POST", "/logout", **hidden, Sec_Fetch_Site="none").status == 403
    assert call(token_app, "POST", "/logout", **hidden).status == 403  # a browser too old to say
    own = f"http://127.0.0.1:{token_app.port}"
    assert call(token_app, "PATCH", path, {"title": "mine"}, Cookie=cookie, Origin=own).status == 200
    assert call(token_app, "GET", path, Cookie=cookie).json()["title"] == "mine"


def test_a_websocket_from_the_opaque_origin_null_is_refused_unless_allowed(start_app):
    """A sandboxed iframe, a data: URL or a file opens sockets with `Origin: null` and no fetch metadata."""
    app = start_app()  # --auth none on loopback: the socket is all that stands between a page and the chat
    for headers in ({"Origin": "null"}, {"Origin": "null", "Sec-Fetch-Site": "same-origin"}):
        with pytest.raises(InvalidStatus) as refused:
            connect(app.ws_url, additional_headers=headers, open_timeout=10)
        assert refused.value.response.status_code == 403
    assert app.client(Origin=f"http://127.0.0.1:{app.port}").hello()["type"] == "ready"
    allowing = start_app("--allowed-origins", "https://chat.example, NULL")
    assert allowing.client(Origin="null").hello()["type"] == "ready"


# ---- header mode ---------------------------------------------------------------------------------


@pytest.fixture
def header_app(start_app):
    return start_app("--auth", "header")


def as_user(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def test_in_header_mode_each_user_sees_only_their_own_conversations(header_app, fake):
    alice = header_app.client(**as_user("alice"))
    mine = alice.hello()["conversation_id"]
    alice.turn("alice's secret plan")
    bob = header_app.client(**as_user("bob"))
    assert bob.hello()["conversation_id"] != mine
    assert call(header_app, "GET", "/api/conversations", **as_user("bob")).json() == {"conversations": []}
    listed = call(header_app, "GET", "/api/conversations", **as_user("alice")).json()["conversations"]
    assert [c["id"] for c in listed] == [mine]
    # Bob gets for Alice's id exactly what he gets for an id that does not exist.
    for method, path, body in [
        ("GET", f"/api/conversations/{mine}", None),
        ("PATCH", f"/api/conversations/{mine}", {"title": "bob was here"}),
        ("DELETE", f"/api/conversations/{mine}", None),
        ("GET", f"/api/conversations/{mine}/export.md", None),
    ]:
        theirs = call(header_app, method, path, body, **as_user("bob"))
        missing = call(header_app, method, path.replace(mine, "no-such-id"), body, **as_user("bob"))
        assert theirs.status == missing.status == 404 and theirs.body == missing.body
    bob.send("hello", conversation_id=mine)
    refused = bob.recv()
    bob.send("hello", conversation_id="no-such-id")
    assert refused == bob.recv() and refused["code"] == "unknown_conversation"
    # Nothing Bob tried changed it.
    record = call(header_app, "GET", f"/api/conversations/{mine}", **as_user("alice")).json()
    assert record["title"] == "alice's secret plan" and len(record["messages"]) == 2


def test_in_header_mode_a_request_without_the_header_is_403(header_app):
    assert call(header_app, "GET", "/").status == 403
    assert call(header_app, "GET", "/api/conversations").status == 403
    with pytest.raises(InvalidStatus) as refused:
        connect(header_app.ws_url, open_timeout=10)
    assert refused.value.response.status_code == 403


def raw_get(app: AppProcess, path: str, headers: list[tuple[str, str]]) -> int:
    """A GET with these headers, the same name as often as it is listed."""
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=10)
    try:
        connection.putrequest("GET", path)
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize(
    "headers",
    [
        [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "alice")],  # a proxy that appends its own
        [("X-Forwarded-User", "alice"), ("X-Forwarded-User", "alice")],
        [("X-Forwarded-User", "mallory, alice")],  # or joins them into a list
        [("X-Forwarded-User", "mallory,alice")],
    ],
)
def test_in_header_mode_two_user_names_are_refused(header_app, headers):
    assert raw_get(header_app, "/api/conversations", [("X-Forwarded-User", "alice")]) == 200
    assert raw_get(header_app, "/api/conversations", headers) == 403
    assert raw_get(header_app, "/", headers) == 403
    with pytest.raises(InvalidStatus) as refused:
        connect(header_app.ws_url, additional_headers=headers, open_timeout=10)
    assert refused.value.response.status_code == 403


def test_in_header_mode_the_header_is_believed_only_from_a_trusted_proxy(start_app):
    app = start_app("--auth", "header", "--trusted-proxies", "192.0.2.1")  # not where the test calls from
    assert call(app, "GET", "/api/conversations", **as_user("alice")).status == 403
    with pytest.raises(InvalidStatus):
        connect(app.ws_url, additional_headers=as_user("alice"), open_timeout=10)


def test_in_header_mode_a_session_cookie_of_an_earlier_token_mode_signs_nobody_in(start_app):
    token_app = start_app("--auth", "token", "--token", TOKEN)
    _, cookie = sign_in(token_app)
    token_app.stop()
    app = start_app("--auth", "header", "--trusted-proxies", "192.0.2.1")  # the same database
    assert call(app, "GET", "/api/conversations", Cookie=cookie).status == 403


def test_in_header_mode_the_page_names_the_user_and_the_log_does_not(header_app):
    page = call(header_app, "GET", "/", **as_user("carol-the-user"))
    assert page.status == 200 and b"carol-the-user" in page.body
    header_app.client(**as_user("carol-the-user")).turn("hi")
    header_app.stop()
    assert "carol-the-user" not in header_app.logs()


# ---- serving beyond loopback -------------------------------------------------------------------


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True, timeout=30)


def test_no_sign_in_beyond_loopback_is_refused_and_names_the_fix(tmp_path):
    refused = run_main("--host", "0.0.0.0", "--auth", "none", "--db-path", str(tmp_path / "c.db"))
    assert refused.returncode != 0 and "--auth token" in refused.stderr


def test_insecure_no_auth_overrides_the_refusal_with_a_warning(start_app):
    app = start_app("--host", "0.0.0.0", "--auth", "none", "--insecure-no-auth")
    assert app.client().hello()["type"] == "ready"
    app.stop()
    assert "no sign-in (--insecure-no-auth)" in app.logs()


def test_beyond_loopback_the_default_is_token_sign_in(start_app):
    app = start_app("--host", "0.0.0.0", "--allowed-hosts", "127.0.0.1")
    assert call(app, "GET", "/api/conversations").status == 401


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
@pytest.mark.parametrize("auth", ["token", "header"])
def test_sign_in_beyond_loopback_needs_allowed_hosts_and_the_refusal_names_the_fix(tmp_path, host, auth):
    refused = run_main("--host", host, "--auth", auth, "--db-path", str(tmp_path / "c.db"))
    assert refused.returncode != 0 and "--allowed-hosts" in refused.stderr and "DNS rebinding" in refused.stderr


@pytest.mark.parametrize(
    ("args", "link"),
    [
        (["--host", "0.0.0.0", "--allowed-hosts", "*.lan, Chat.lan"], "http://chat.lan:8000/login?token=T"),
        (["--host", "::", "--allowed-hosts", "fd00::2"], "http://[fd00::2]:8000/login?token=T"),
        (["--host", "0.0.0.0", "--allowed-hosts", "*"], "http://127.0.0.1:8000/login?token=T"),
        (["--host", "::1"], "http://[::1]:8000/login?token=T"),
    ],
)
def test_the_sign_in_link_names_a_host_the_server_answers_to(args, link):
    assert main.sign_in_link(Settings(_cli_parse_args=args), "T") == link


def test_beyond_loopback_with_allowed_hosts_another_host_name_is_refused(start_app):
    """A DNS-rebinding page reaches the app under its own name: that Host is not answered."""
    app = start_app("--host", "0.0.0.0", "--auth", "header", "--allowed-hosts", "chat.example, 127.0.0.1")
    assert call(app, "GET", "/api/conversations", **as_user("alice")).status == 200
    assert call(app, "GET", "/api/conversations", Host="chat.example", **as_user("alice")).status == 200
    assert call(app, "GET", "/api/conversations", Host="rebound.example:80", **as_user("alice")).status == 400


# ---- a database of the first release -------------------------------------------------------------

FIRST_RELEASE_SCHEMA = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY, title TEXT, model TEXT NOT NULL, system_prompt TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, turn_id TEXT,
    role TEXT NOT NULL, content TEXT NOT NULL, reasoning TEXT NOT NULL DEFAULT '', status TEXT NOT NULL,
    error TEXT, meta TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, seq);
"""


def test_a_database_of_the_first_release_is_upgraded_and_its_conversations_go_to_the_local_user(tmp_path, fake):
    app = AppProcess(tmp_path, ["--base-url", f"http://127.0.0.1:{fake.port}/v1"])
    with sqlite3.connect(app.db_path) as db:
        db.executescript(FIRST_RELEASE_SCHEMA)
        now = time.time()
        db.execute("INSERT INTO conversations VALUES ('old-one', 'Kept', 'fake-model', 'Be kind.', ?, ?)", (now, now))
        for seq, (role, text) in enumerate([("user", "an old question"), ("assistant", "an old answer")]):
            db.execute(
                "INSERT INTO messages (id, conversation_id, turn_id, role, content, status, created_at)"
                " VALUES (?, 'old-one', 't1', ?, ?, 'complete', ?)",
                (f"m{seq}", role, text, now + seq),
            )
    app.start()
    try:
        listed = app.get("/api/conversations")["conversations"]
        assert [(c["id"], c["title"], c["system_prompt"]) for c in listed] == [("old-one", "Kept", "Be kind.")]
        client = app.client()
        history = client.hello("old-one")["history"]
        assert [(m["role"], m["content"]) for m in history] == [
            ("user", "an old question"),
            ("assistant", "an old answer"),
        ]
        assert client.turn("a new question")[-1]["status"] == "complete"
    finally:
        app.kill()
    with sqlite3.connect(app.db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert db.execute("SELECT owner FROM conversations").fetchall() == [("local",)]
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 4
