"""What the database holds of sign-in, in both stores: the hash of a generated access token, never
the token (a copy of the database signs nobody in), and a SQLite file only its owner can read."""

import asyncio
import hashlib
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from pocketchat.store.postgres_schema import MIGRATIONS as postgres_schema
from pocketchat.store.postgres_schema import SCHEMA_VERSION_TABLE
from pocketchat.store.sqlite_schema import MIGRATIONS as sqlite_schema
from tests.conftest import MODES, ROOT, AppProcess
from tests.test_auth import sign_in

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)
CLEAR = "a-clear-token-of-an-old-release-0123"


def database_flags(app: AppProcess) -> list[str]:
    """The flags that name the app's database, for the commands that work on it."""
    flags = ["--db-path", str(app.db_path)]
    if "--database-url" in app.args:
        flags += ["--database-url", app.args[app.args.index("--database-url") + 1]]
    return flags


def login_link(app: AppProcess) -> str:
    command = [sys.executable, str(ROOT / "main.py"), "--login-link", *database_flags(app), "--port", str(app.port)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip()


def secrets_table(app: AppProcess, *statements: str) -> dict[str, str]:
    """The `secrets` rows (after running `statements` on the database, if any)."""
    flags = database_flags(app)
    if "--database-url" not in flags:
        with sqlite3.connect(app.db_path) as db:
            for statement in statements:
                db.execute(statement)
            return dict(db.execute("SELECT name, value FROM secrets").fetchall())

    async def query() -> dict[str, str]:
        db = await asyncpg.connect(flags[-1])
        try:
            for statement in statements:
                await db.execute(statement)
            return {row["name"]: row["value"] for row in await db.fetch("SELECT name, value FROM secrets")}
        finally:
            await db.close()

    return asyncio.run(query())


def database_bytes(app: AppProcess) -> bytes:
    """Every byte of a SQLite database and its -wal (nothing, for PostgreSQL: see the rows)."""
    files = [app.db_path, Path(f"{app.db_path}-wal")]
    return b"".join(file.read_bytes() for file in files if file.exists())


def test_the_database_keeps_only_the_hash_of_a_generated_token_and_login_link_makes_a_new_one(start_app):
    app = start_app("--auth", "token")
    first = login_link(app)
    assert first.startswith(f"http://127.0.0.1:{app.port}/login?token=")
    token = first.rpartition("=")[2]
    assert len(token) >= 32  # 192 random bits, base64url
    assert sign_in(app, token)[0].status == 303
    kept = secrets_table(app)
    assert kept["access_token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in kept.values() and "access_token" not in kept
    assert token.encode() not in database_bytes(app)
    # --login-link again: a new token; the old link stops working, on the running server at once.
    second = login_link(app).rpartition("=")[2]
    assert second != token
    assert sign_in(app, token)[0].status == 401
    assert sign_in(app, second)[0].status == 303
    app.stop()
    assert token not in app.logs() and second not in app.logs() and "--login-link" in app.logs()
    app.start()
    assert sign_in(app, second)[0].status == 303


def test_a_clear_token_of_an_older_release_is_hashed_in_place_and_still_signs_in(start_app, mode, tmp_path, request):
    # The database as the release before the token's hash left it: its schema steps up to then (later
    # steps, whatever they are, are applied at start), the token in clear.
    if mode == "single":
        with sqlite3.connect(tmp_path / "chat.db") as db:
            for number, step in enumerate(sqlite_schema[:2], start=1):
                db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
            db.execute("INSERT INTO secrets VALUES ('access_token', ?)", (CLEAR,))
    else:

        async def older() -> None:
            db = await asyncpg.connect(request.getfixturevalue("fresh_postgres_url"))
            try:
                await db.execute(SCHEMA_VERSION_TABLE)
                await db.execute(postgres_schema[0])
                await db.execute("INSERT INTO schema_version VALUES (1, 0)")
                await db.execute("INSERT INTO secrets VALUES ('access_token', $1)", CLEAR)
            finally:
                await db.close()

        asyncio.run(older())
    app = start_app("--auth", "token")
    kept = secrets_table(app)
    assert kept["access_token_hash"] == hashlib.sha256(CLEAR.encode()).hexdigest() and "access_token" not in kept
    assert sign_in(app, CLEAR)[0].status == 303
    assert CLEAR.encode() not in database_bytes(app)


def test_the_sqlite_file_and_its_wal_and_shm_are_readable_by_their_owner_only(start_app, mode, tmp_path):
    if mode != "single":
        pytest.skip("PostgreSQL keeps its own files")
    path = tmp_path / "chat.db"
    path.touch(mode=0o644)  # made by an older release
    path.chmod(0o644)
    app = start_app("--auth", "token")
    client = app.client(Cookie=sign_in(app, login_link(app).rpartition("=")[2])[1])
    client.hello()
    client.turn("written to the -wal file")
    modes = {file.name: stat.S_IMODE(file.stat().st_mode) for file in tmp_path.glob("chat.db*")}
    assert set(modes) == {"chat.db", "chat.db-wal", "chat.db-shm"}
    assert modes == dict.fromkeys(modes, 0o600)
    fresh = start_app("--db-path", str(tmp_path / "new" / "fresh.db"))
    fresh.client().hello()
    assert {stat.S_IMODE(file.stat().st_mode) for file in (tmp_path / "new").iterdir()} == {0o600}
