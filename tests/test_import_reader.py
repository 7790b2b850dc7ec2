"""The import reader as the app runs it: a child process under a memory budget that holds one conversation
at a time, not the file; what it refuses, and how it ends (out of memory, out of time, killed), reaches
the user as a clear 4xx; and a user checks one file at a time, so two users at most hold both readers."""

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pocketchat.cluster.local import LocalCoordinator
from pocketchat.jobs import Jobs
from pocketchat.store.sqlite import SqliteStore
from pocketchat.transfer import imports as imports_module
from pocketchat.transfer.imports import Imports
from pocketchat.transfer.tree import BadFile
from tests.conftest import ROOT
from tests.test_import import ALICE, BOB, CHATGPT, post_import, trips
from tests.test_import_store import SETTINGS
from tests.test_store import Stores, opened

MiB = 1 << 20


# Runs the reader and prints its peak resident memory. A child's peak counts what it had when forked (not
# yet its program): forked from this small process, not from the test's, it is the reader's own.
MEASURED = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
print(usage.ru_maxrss, file=sys.stderr)
"""


def run_reader(source: Path, budget: int = 1 << 30) -> tuple[dict[str, Any], float]:
    """The reader child on `source`, as the app runs it: its verdict, and its peak memory (MiB resident)."""
    reader = [sys.executable, "-m", "pocketchat.transfer.read", str(source), str(source) + ".out", str(budget)]
    done = subprocess.run([sys.executable, "-c", MEASURED, *reader], capture_output=True, cwd=ROOT, check=True)
    return json.loads(done.stdout), int(done.stderr.split()[-1]) / 1024


def test_a_list_of_a_hundred_megabytes_of_empty_lists_is_refused_at_its_first_in_little_memory(tmp_path):
    # Row 8: parsed whole, this file took 2.5 GB (25 times its size) and 17 s, to be refused for its length.
    source = tmp_path / "empties.json"
    source.write_bytes(b"[" + b"[]," * 33_333_332 + b"[]]")
    verdict, peak = run_reader(source)
    assert "Conversation 1 is neither PocketChat's format" in verdict["error"]
    assert peak < 100


def test_the_reader_holds_a_conversation_at_a_time_not_the_file(tmp_path):
    source = tmp_path / "conversations.json"
    source.write_bytes(trips(4_000))  # 26 MB of ChatGPT's conversations: about 230 MB when parsed whole
    verdict, peak = run_reader(source)
    assert verdict["conversations"] == 4_000
    assert peak < 100
    assert len(Path(str(source) + ".out").read_text(encoding="utf-8").splitlines()) == 4_000


def padded(megabytes: int) -> bytes:
    """One conversation padded with `megabytes` of empty lists: about 20 times that in memory once parsed."""
    return b'{"mapping": {}, "padding": [' + b"[]," * (megabytes * MiB // 3) + b"[]]}"


def test_a_conversation_that_needs_more_memory_than_the_budget_is_refused_saying_so(tmp_path):
    source = tmp_path / "padded.json"
    source.write_bytes(padded(16))
    verdict, peak = run_reader(source, budget=128 * MiB)
    assert verdict == {
        "error": "The file needs more memory than an import may use (128 MiB); split it.",
        "status": 413,
    }
    assert peak < 128


def imported_by(tmp_path: Path, data: bytes) -> BadFile:
    """The import of `data` by the app's Imports (on SQLite): refused, with what the user is told."""
    upload = tmp_path / "upload.json"
    upload.write_bytes(data)

    async def scenario() -> BadFile:
        jobs = Jobs.from_settings(SETTINGS)
        async with opened(Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))) as db:
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), jobs)
            with upload.open("rb") as file, pytest.raises(BadFile) as refused:
                await imports.start("alice", file)
            assert await db.list_conversations("alice") == []
            await jobs.aclose()
            return refused.value

    return asyncio.run(scenario())


def test_the_app_tells_the_user_a_file_needs_more_memory_than_an_import_may_use(tmp_path, monkeypatch):
    monkeypatch.setattr(imports_module, "READ_MEMORY", 128 * MiB)
    refused = imported_by(tmp_path, padded(16))
    assert (refused.status, refused.message) == (
        413,
        "The file needs more memory than an import may use (128 MiB); split it.",
    )


@pytest.mark.parametrize(
    ("death", "status", "says"),
    [
        ("kill -9 $$", 413, "needs more memory than an import may use"),  # the kernel's OOM killer
        ("exit 1", 500, "the server's log says why"),  # a crash
    ],
)
def test_a_reader_that_dies_where_it_cannot_say_why_is_told_as_that(tmp_path, monkeypatch, death, status, says):
    child = tmp_path / "reader"
    child.write_text(f"#!/bin/sh\n{death}\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))  # the job worker the import's check starts
    refused = imported_by(tmp_path, CHATGPT.read_bytes())
    assert refused.status == status and says in refused.message


def test_a_file_that_takes_longer_to_check_than_allowed_is_refused_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(imports_module, "READ_TIMEOUT", 0.1)
    refused = imported_by(tmp_path, trips(2_000))  # half a second to check, alone on a fast machine
    assert refused.status == 413 and "takes longer to check than an import may" in refused.message


def test_a_number_of_thousands_of_digits_gets_a_clear_refusal_not_a_500(start_app):
    # Issue 31 #12: json's limit on an integer's digits crashed the reader, and the import answered 500.
    app = start_app("--auth", "header")
    status, answer = post_import(app, b'[{"mapping": {}, "create_time": ' + b"9" * 5_000 + b"}]", **ALICE)
    assert status == 422 and "a number of over 4,300 digits" in answer["detail"]


def test_a_user_checks_one_file_at_a_time_so_cannot_hold_both_readers(start_app):
    app = start_app("--auth", "header")
    many = trips(3_000)
    answers: list[int] = []
    uploads = [threading.Thread(target=lambda: answers.append(post_import(app, many, **ALICE)[0])) for _ in range(2)]
    for upload in uploads:
        upload.start()
    for upload in uploads:
        upload.join()
    assert sorted(answers) == [202, 409]
    assert post_import(app, trips(1), **BOB)[0] == 202


def test_a_small_file_is_checked_while_large_ones_hold_every_reader(tmp_path):
    """Issue 30, row 7: two users' hostile files held both readers, and a third user's 267-byte import
    waited 23 s. Large files take turns for the readers; a small one waits only for a job worker."""
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(CHATGPT.read_bytes())
    large.write_bytes(trips(200))  # over a megabyte

    async def scenario() -> tuple[int, bool]:
        jobs = Jobs.from_settings(SETTINGS)
        async with opened(Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))) as db:
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), jobs)
            for _ in range(imports_module.READERS):  # two other users' large files, being checked
                await imports._readers.acquire()
            with large.open("rb") as file:
                waiting = asyncio.create_task(imports.start("mallory", file))
                with small.open("rb") as other:
                    job = await asyncio.wait_for(imports.start("carol", other), 30)
                await asyncio.sleep(0.5)
                still_waiting = not waiting.done()
                waiting.cancel()
            await imports.aclose()
            await jobs.aclose()
            return job.total, still_waiting

    total, still_waiting = asyncio.run(scenario())
    assert total > 0 and still_waiting


def test_large_files_sent_at_once_are_checked_two_at_a_time_and_all_imported(tmp_path):
    large = tmp_path / "large.json"
    large.write_bytes(trips(200))  # over a megabyte

    async def scenario() -> tuple[int, list[str]]:
        jobs = Jobs.from_settings(SETTINGS)
        async with opened(Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))) as db:
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), jobs)
            checking, most = 0, 0
            read = imports._read

            async def counted(*args: Any) -> dict[str, Any]:
                nonlocal checking, most
                checking += 1
                most = max(most, checking)
                try:
                    return await read(*args)
                finally:
                    checking -= 1

            imports._read = counted  # type: ignore[method-assign]
            files = [large.open("rb") for _ in range(4)]
            started = await asyncio.gather(*(imports.start(f"user{n}", file) for n, file in enumerate(files)))
            for file in files:
                file.close()
            while any(job.status == "importing" for job in started):
                await asyncio.sleep(0.05)
            await jobs.aclose()
            return most, [job.status for job in started]

    most, statuses = asyncio.run(scenario())
    assert most == imports_module.READERS == 2 and statuses == ["done"] * 4
