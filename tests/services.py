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
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis

from utils.pg_store import describe


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
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
