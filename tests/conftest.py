"""Real parts for every test: the fake provider over HTTP, the app under uvicorn, WebSocket clients."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright
from websockets.sync.client import ClientConnection, connect

from tests import chromium
from tests.app_starter import AppStarter, ForkedProcess
from tests.fake_openai import FakeOpenAI, FakeOpenAIThread
from tests.services import (  # noqa: F401 (fixtures)
    fault_proxy,
    free_port,
    fresh_postgres_url,
    postgres_server,
    postgres_url,
    private_redis,
    redis_prefix,
    redis_server,
)

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-test-SECRET-abcdef0123456789"
# Tests send many messages a minute from one user; the limits are tested where a test sets them.
NO_LIMITS = [
    *("--limit-running-turns", "0", "--limit-messages-per-minute", "0"),
    *("--limit-sockets", "0", "--limit-conversations-per-minute", "0"),
    *("--limit-hellos-per-minute", "0", "--limit-changes-per-minute", "0"),
    *("--limit-tool-calls-per-minute", "0", "--limit-searches-per-minute", "0"),
]


class PortTaken(RuntimeError):
    """The app could not bind its port: another process took it after free_port() chose it."""


class AppProcess:
    """`python main.py` in a subprocess on a free loopback port. Under pytest (`forked_apps`), the app
    of this checkout is forked from a process that imported it already (`tests/app_starter.py`)."""

    forking = False  # set for the test session: the benches start a plain `python main.py`
    _starter: AppStarter | None = None

    def __init__(
        self, tmp: Path, args: list[str], env: dict[str, str] | None = None, root: Path = ROOT, cwd: Path | None = None
    ) -> None:
        self.root = root  # the checkout to run: this one, or a changed copy of it
        self.cwd = cwd or root  # where it is started from
        self.port = free_port()
        self.db_path = tmp / "chat.db"
        self.log_path = tmp / f"server-{self.port}.log"
        self.args = ["--port", str(self.port), "--db-path", str(self.db_path), *args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            if env is None or name not in env:
                self.env.pop(name, None)
        self.process: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.started = False
        self.clients: list[ChatClient] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self) -> "AppProcess":
        tries = 3
        while True:
            try:
                return self._start()
            except PortTaken:
                tries -= 1
                if self.started or not tries:
                    raise  # a restart keeps its address: the test's clients and pages know it
                self._move_to(free_port())

    def _move_to(self, port: int) -> None:
        """Serve on another port (before the first start): another process took this one meanwhile."""
        at = self.args.index("--port") + 1
        self.args[at] = str(port)
        self.port = port
        self.log_path = self.log_path.with_name(f"server-{port}.log")

    def _start(self) -> "AppProcess":
        if AppProcess.forking and self.root == ROOT:
            if AppProcess._starter is None:
                AppProcess._starter = AppStarter()
            self.process = AppProcess._starter.start(self.args, self.cwd, self.env, self.log_path)
        else:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, str(self.root / "main.py"), *self.args],
                    cwd=self.cwd,
                    env=self.env,
                    stdout=log,
                    stderr=log,
                )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                logs = self.logs()
                if f"bind on address ('127.0.0.1', {self.port}): address already in use" in logs:
                    raise PortTaken(logs)
                raise RuntimeError(f"server exited: {logs}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                    self.started = True
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server did not start: {self.logs()}")

    def stop(self) -> None:
        """Shut down the way Ctrl+C does."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.wait_exit(30)
        self._close_clients()

    def kill(self) -> None:
        """Die the way a crash does."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.wait_exit(10)
        self._close_clients()

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit; if it does not, fail with the end of its log (a forked app
        prints its threads' and tasks' stacks there first)."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            lines = [line for line in self.logs().splitlines() if '"GET ' not in line and "WebSocket" not in line]
            tail = "\n".join(lines[-150:])
            raise AssertionError(f"the app did not exit within {timeout} s; its log ends:\n{tail}") from None

    def _close_clients(self) -> None:
        # After the server is gone: a client that stopped reading could not finish a close handshake.
        for client in self.clients:
            client.close()
        self.clients.clear()

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def client(self, **headers: str) -> "ChatClient":
        # legacy=True: a connection the test closes itself, rather than a `with` block per client.
        client = ChatClient(
            connect(
                self.ws_url,
                additional_headers=headers or None,
                open_timeout=10,
                close_timeout=1,  # a client that stopped reading cannot finish a close handshake
                max_size=None,
                legacy=True,
            )
        )
        self.clients.append(client)
        return client


class ChatClient:
    """A real WebSocket client that speaks the protocol in JSON frames."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self.frames: list[dict[str, Any]] = []

    def send(self, type: str, **fields: Any) -> None:
        self.connection.send(json.dumps({"type": type, **fields}))

    def send_raw(self, data: str | bytes) -> None:
        self.connection.send(data)

    def recv(self, timeout: float = 10) -> dict[str, Any]:
        frame = json.loads(self.connection.recv(timeout))
        self.frames.append(frame)
        return frame

    def until(self, type: str, timeout: float = 20) -> list[dict[str, Any]]:
        """Every frame up to and including the next one of `type`."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.recv(max(deadline - time.monotonic(), 0.01))
            seen.append(frame)
            if frame["type"] == type:
                return seen

    def hello(self, conversation_id: str | None = None) -> dict[str, Any]:
        self.send("hello", **({"conversation_id": conversation_id} if conversation_id else {}))
        return self.until("ready")[-1]

    def turn(self, content: str, timeout: float = 20) -> list[dict[str, Any]]:
        """Send a message and return the frames up to its turn_end."""
        self.send("message", content=content)
        return self.until("turn_end", timeout)

    def close(self) -> None:
        self.connection.close()


def of_node(steps: list[dict[str, Any]], node: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The steps one node showed (of one kind): what a test of that node checks, whatever other nodes
    the flow runs show beside them."""
    return [step for step in steps if step["node"] == node and kind in (None, step["kind"])]


def reply_text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["content"] for f in frames if f["type"] == "chunk")


def stream_of(frames: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int], str, str]:
    """What a socket was shown of a turn, however its chunks were grouped into frames: its other frames,
    and its chunks' seqs, text and reasoning."""
    reasoning = "".join(f.get("reasoning", "") for f in frames if f["type"] == "chunk")
    return [f for f in frames if f["type"] != "chunk"], chunk_seqs(frames), reply_text(frames), reasoning


def chunk_seqs(frames: list[dict[str, Any]]) -> list[int]:
    """The seqs the chunk frames carry, in order."""
    return [seq for f in frames if f["type"] == "chunk" for seq in seqs_of(f)]


def seqs_of(chunk: dict[str, Any]) -> range:
    """The seqs a chunk frame carries: its `seq`, or `first_seq` to `seq` (a frame that carries several)."""
    return range(chunk.get("first_seq", chunk["seq"]), chunk["seq"] + 1)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAIThread() as fake:
        yield fake


@pytest.fixture
def fake(fake_server: FakeOpenAI) -> FakeOpenAI:
    fake_server.script.clear()
    fake_server.titles.clear()
    fake_server.embed_delay = 0.0
    fake_server.requests.clear()
    fake_server.hangups = 0
    fake_server.completed = 0
    fake_server.models_answer = True
    fake_server.connections = 0
    fake_server.idle_close = None
    return fake_server


MODES = ["single", "replicas"]


@pytest.fixture
def mode(request: pytest.FixtureRequest) -> str:
    """How the app runs: one process on SQLite, or a replica on PostgreSQL and Redis. A test module
    runs in both with `pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)`."""
    return getattr(request, "param", "single")


@pytest.fixture
def mode_args(request: pytest.FixtureRequest, mode: str) -> list[str]:
    """The flags of the mode: for replicas, a PostgreSQL database and a Redis key prefix of the test's own."""
    if mode == "single":
        return []
    return [
        *("--database-url", request.getfixturevalue("fresh_postgres_url")),
        *("--redis-url", request.getfixturevalue("redis_server")),
        *("--redis-prefix", request.getfixturevalue("redis_prefix")),
    ]


@pytest.fixture(scope="session", autouse=True)
def forked_apps() -> Iterator[None]:
    """Every app of this checkout a test starts is forked from one process that imported it already."""
    AppProcess.forking = True
    yield
    AppProcess.forking = False
    if AppProcess._starter is not None:
        AppProcess._starter.close()
        AppProcess._starter = None


@pytest.fixture
def start_app(tmp_path: Path, fake: FakeOpenAI, mode_args: list[str]) -> Iterator[Any]:
    """Start the app against the fake; extra flags override the defaults."""
    started: list[AppProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> AppProcess:
        defaults = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--retry-wait", "0.05", *NO_LIMITS, *mode_args]
        app = AppProcess(tmp_path, [*defaults, *args], {"POCKETCHAT_API_KEY": API_KEY, **(env or {})}, cwd=cwd)
        started.append(app)
        return app.start()

    yield start
    for app in started:
        app.kill()


@pytest.fixture
def app(start_app: Any) -> AppProcess:
    return start_app()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module scope: sync playwright holds an event loop on this thread until it stops.
    with sync_playwright() as playwright:
        browser = chromium.launch(playwright)
        yield browser
        browser.close()
