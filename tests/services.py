"""The real services some tests need beside the app: a PostgreSQL database of their own (Redis goes here too).

Each service has a session fixture that reaches it once. Where it cannot be reached (a laptop without
PostgreSQL), the tests that need it skip and say why; with POCKETCHAT_REQUIRE_SERVICES=1 (CI sets it)
that is a failure instead, so that no test goes unrun unseen.

POCKETCHAT_TEST_POSTGRES names a database to connect to as a user who may CREATE DATABASE (default: the
local server's `test` database as postgres). Tests never write there: each session, and each test that
asks for isolation, gets a database of its own beside it, `pocketchat_test_<pid>_<random>`, dropped after.
"""

import asyncio
import os
import secrets
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis

from pocketchat.store.postgres_connection import describe

# Below every system's ephemeral range (Linux from 32768, macOS from 49152): a port chosen by binding to
# port 0 comes from that range, where any process's next outgoing connection may take it before the
# server that was meant to has bound it.
SERVER_PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port nothing listens on now, from outside the range outgoing connections draw from."""
    while True:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", secrets.choice(SERVER_PORTS)))
            except OSError:
                continue
            return probe.getsockname()[1]


POSTGRES_ADMIN_URL = os.environ.get("POCKETCHAT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
CONNECT_TIMEOUT = 5.0


def services_required() -> bool:
    return os.environ.get("POCKETCHAT_REQUIRE_SERVICES") == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip the test for want of a service; fail it where services are required."""
    if services_required():
        pytest.fail(f"{reason} (POCKETCHAT_REQUIRE_SERVICES=1: the services must be there)", pytrace=False)
    pytest.skip(reason)


# ---- PostgreSQL ----------------------------------------------------------------------------------


async def postgres_admin() -> asyncpg.Connection:
    """A connection to the admin database, for what tests do to a test database from outside."""
    return await asyncpg.connect(POSTGRES_ADMIN_URL, timeout=CONNECT_TIMEOUT)


def database_url(name: str) -> str:
    """The URL of database `name` on the admin database's server, as the same user."""
    parts = urlsplit(POSTGRES_ADMIN_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def database_name(url: str) -> str:
    return urlsplit(url).path.removeprefix("/")


async def _create_database(name: str) -> None:
    admin = await postgres_admin()
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()


async def drop_database(name: str) -> None:
    """Drop a test database, ending whatever connections a test left on it first."""
    admin = await postgres_admin()
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')  # a test may have refused them
        ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
        await admin.execute(ended, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # an app may reconnect meanwhile
    finally:
        await admin.close()


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database for as long as the block runs; its URL."""
    name = f"pocketchat_test_{os.getpid()}_{secrets.token_hex(4)}"
    asyncio.run(_create_database(name))
    try:
        yield database_url(name)
    finally:
        asyncio.run(drop_database(name))


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The admin URL, once the server has answered; else a skip (or a failure) that says why."""

    async def probe() -> None:
        admin = await postgres_admin()
        await admin.close()

    try:
        asyncio.run(probe())
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        problem = f"PostgreSQL at {describe(POSTGRES_ADMIN_URL)} cannot be reached ({error})"
    else:
        return POSTGRES_ADMIN_URL
    # Outside the except block: the reason alone is shown, not the connection error's traceback.
    unavailable(f"{problem}; POCKETCHAT_TEST_POSTGRES names another server")


@pytest.fixture(scope="session")
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of this test session's own (tests share it: they use ids of their own)."""
    with fresh_database() as url:
        yield url


@pytest.fixture
def fresh_postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of this test's own, for a test that counts or sweeps every row, or breaks the database."""
    with fresh_database() as url:
        yield url


# ---- Redis ---------------------------------------------------------------------------------------

REDIS_URL = os.environ.get("POCKETCHAT_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_server() -> str:
    """The Redis URL, once the server has answered; else a skip (or a failure) that says why."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=CONNECT_TIMEOUT)
    try:
        client.ping()
    except (redis.RedisError, OSError) as error:
        problem = f"Redis at {urlsplit(REDIS_URL).netloc} cannot be reached ({error})"
    else:
        return REDIS_URL
    finally:
        client.close()
    unavailable(f"{problem}; POCKETCHAT_TEST_REDIS names another server")


@contextmanager
def fresh_redis_prefix(kind: str = "test") -> Iterator[str]:
    """A key prefix of its own on the shared Redis for as long as the block runs; its keys are
    deleted after (streams, events, gauges: not all of them expire on their own)."""
    prefix = f"pocketchat_{kind}_{os.getpid()}_{secrets.token_hex(4)}:"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            for key in client.scan_iter(match=prefix + "*", count=1000):
                client.delete(key)
        finally:
            client.close()


@pytest.fixture
def redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis; its keys are deleted after."""
    with fresh_redis_prefix() as prefix:
        yield prefix


class PrivateRedis:
    """A redis-server of a test's own on a free port, that the test may stop and start (an outage),
    never the shared one."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "PrivateRedis":
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen([*command, "--dir", str(self.directory)], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except (redis.RedisError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


# ---- a fault proxy -------------------------------------------------------------------------------


class FaultProxy:
    """A TCP proxy of a test's own in front of a real server (PostgreSQL, Redis): the app connects
    through it, and the test cuts every connection or stalls every byte, then heals, without touching
    the shared server.

    - `cut()`: every open connection is closed, and new ones are closed as soon as they come, until `heal()`.
    - `stall()`: nothing more is forwarded either way, and new connections hang, until `heal()`;
      the connections stay open, as with a frozen server or a network that drops packets.
    - `reset()`: every open connection is reset at once (TCP RST); new ones pass.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None
        self._refusing = False

    @classmethod
    def before(cls, url: str) -> "FaultProxy":
        """A started proxy in front of the server a URL names."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or {"redis": 6379}.get(parts.scheme, 5432)).start()

    def url(self, url: str) -> str:
        """`url`, pointing at this proxy instead of the server."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{credentials + '@' if credentials else ''}127.0.0.1:{self.port}"))

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._call(self._start())
        return self

    def _call(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(10)

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        if self._refusing:
            writer.close()
            return
        self._writers.add(writer)
        try:
            await self._flowing.wait()
            if self._refusing:  # cut (or stopped) while it waited
                self._drop(writer)
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._drop(writer)
            return
        self._writers.add(upstream_writer)
        if self._refusing:
            self._drop(writer)  # its pump to the server then ends, and closes that side
        await asyncio.gather(
            self._pump(reader, upstream_writer, writer), self._pump(upstream_reader, writer, upstream_writer)
        )

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, other: asyncio.StreamWriter
    ) -> None:
        assert self._flowing is not None
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, RuntimeError):
            pass
        finally:
            self._drop(sink)
            self._drop(other)

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()

    def cut(self) -> None:
        async def cut() -> None:
            self._refusing = True
            for writer in list(self._writers):
                self._drop(writer)

        self._call(cut())

    def stall(self) -> None:
        async def stall() -> None:
            assert self._flowing is not None
            self._flowing.clear()

        self._call(stall())

    def reset(self) -> None:
        """Reset every open connection (a TCP RST, as a crashed host or a middlebox sends); new ones
        pass as before. An idle client connection learns of it only when it is next used."""

        async def reset() -> None:
            for writer in list(self._writers):
                if (sock := writer.get_extra_info("socket")) is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self._writers.discard(writer)
                writer.transport.abort()

        self._call(reset())

    def heal(self) -> None:
        async def heal() -> None:
            assert self._flowing is not None
            self._refusing = False
            self._flowing.set()

        self._call(heal())

    def stop(self) -> None:
        async def stop() -> None:
            assert self._flowing is not None
            self._refusing = True  # what comes now is closed at once
            self._flowing.set()  # stalled pumps wake up, find their connections closed, and end
            await self._close_everything()
            if self._server is not None:
                self._server.close()
            await self._close_everything()  # what was accepted as it closed

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close_everything(self) -> None:
        """Close every connection until nothing runs: a stopped loop would leave their sockets to the
        garbage collector (an unclosed-transport warning in whichever test runs then)."""
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # connections just accepted get their task
            for writer in list(self._writers):
                self._drop(writer)
            if not (others := asyncio.all_tasks() - {asyncio.current_task()}):
                return
            await asyncio.wait(others, timeout=0.05)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str], FaultProxy]]:
    """Start a `FaultProxy` before the server of a URL; stopped after the test."""
    proxies: list[FaultProxy] = []

    def start(url: str) -> FaultProxy:
        proxies.append(FaultProxy.before(url))
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.stop()
