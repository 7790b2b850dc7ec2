"""A request body over its route's limit is refused (413) while it comes in, before the sign-in, its
limiter or the route read it: 64 MiB sent to every route leave the server's memory where it was."""

import contextlib
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from pocketchat.web.body_limit import FORM_BYTES, JSON_BYTES
from tests.conftest import AppProcess
from tests.test_auth import call, sign_in

TOKEN = "a-token-for-the-tests-0123456789"
BIG = 64 << 20
PIECE = b"x" * (1 << 20)  # sent again and again: the test itself never holds 64 MiB either


def send_big(app: AppProcess, method: str, path: str, headers: dict[str, str], chunked: bool) -> int:
    """Send a 64 MiB body (declared up front, or chunked) while reading the answer; its status."""
    connection = socket.create_connection(("127.0.0.1", app.port), timeout=60)
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(BIG)}
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{app.port}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in {**headers, **framing}.items()) + "\r\n"

    def body() -> None:
        try:
            connection.sendall(head.encode())
            for _ in range(BIG // len(PIECE)):
                connection.sendall(b"%x\r\n%s\r\n" % (len(PIECE), PIECE) if chunked else PIECE)
            if chunked:
                connection.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed: it need not read the rest

    sender = threading.Thread(target=body, daemon=True)
    sender.start()
    try:
        answer = b""
        while b"\r\n" not in answer:
            received = connection.recv(65536)
            if not received:
                break
            answer += received
        return int(answer.split(b" ", 2)[1]) if answer else 0
    finally:
        # shutdown, not close alone: it wakes the sender if it is blocked in sendall.
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        sender.join(60)
        connection.close()


class PeakMemory:
    """The server's largest resident size while the block runs, sampled every few milliseconds (a body
    read whole and let go at once would not show in a reading taken after)."""

    def __init__(self, app: AppProcess) -> None:
        assert app.process is not None
        self.process = psutil.Process(app.process.pid)
        self.before = self.peak = self.process.memory_info().rss
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "PeakMemory":
        self._sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._sampler.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def grown(self) -> int:
        return self.peak - self.before


@pytest.fixture
def token_app(start_app) -> AppProcess:
    return start_app("--auth", "token", "--token", TOKEN)


def test_a_64_mib_body_to_every_route_is_refused_while_it_comes_in(token_app):
    _, cookie = sign_in(token_app, TOKEN)
    client = token_app.client(Cookie=cookie)
    conversation = f"/api/conversations/{client.hello()['conversation_id']}"
    signed_in = {"Cookie": cookie}
    routes = [
        ("POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}),  # before the limiter
        ("POST", "/logout", signed_in),
        ("PATCH", conversation, {**signed_in, "Content-Type": "application/json"}),
        ("DELETE", conversation, signed_in),
        ("GET", "/api/conversations", signed_in),
        ("POST", conversation, signed_in),  # no such method there
        ("PUT", "/nowhere", {}),  # no such route
        ("PATCH", conversation, {"Content-Type": "application/json"}),  # not signed in
    ]
    # Three at a time, each route with its length declared and chunked: 16 bodies of 64 MiB.
    with PeakMemory(token_app) as memory, ThreadPoolExecutor(3) as pool:
        statuses = list(
            pool.map(lambda case: send_big(token_app, *case[0], case[1]), [(r, c) for r in routes for c in (0, 1)])
        )
    assert memory.grown < 8 << 20, f"the server grew by {memory.grown >> 20} MiB"
    assert statuses == [413] * len(statuses)
    # Nothing was changed, and the server serves on.
    assert call(token_app, "GET", conversation, Cookie=cookie).json()["title"] is None
    assert client.hello()["type"] == "ready"


def test_bodies_within_the_limits_are_served(token_app):
    _, cookie = sign_in(token_app, TOKEN)
    conversation = f"/api/conversations/{token_app.client(Cookie=cookie).hello()['conversation_id']}"
    # The longest system prompt, every character escaped by JSON (6 bytes each): under the JSON limit.
    prompt = "\x01" * 20_000
    body = json.dumps({"title": "t" * 200, "model": "m" * 200, "system_prompt": prompt}).encode()
    assert len(body) < JSON_BYTES
    assert call(token_app, "PATCH", conversation, body, Cookie=cookie, Content_Type="application/json").status == 200
    assert call(token_app, "GET", conversation, Cookie=cookie).json()["system_prompt"] == prompt
    over = json.dumps({"system_prompt": "\x01" * 30_000}).encode()
    assert call(token_app, "PATCH", conversation, over, Cookie=cookie, Content_Type="application/json").status == 413
    form = b"token=" + TOKEN.encode() + b"&padding=" + b"p" * (FORM_BYTES - 100)
    assert call(token_app, "POST", "/login", form, Content_Type="application/x-www-form-urlencoded").status == 303
