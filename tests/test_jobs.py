"""The job workers (pocketchat/jobs): untrusted work in processes, within budgets, shared fairly."""

import asyncio
import functools
import io
import os
import pickle
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pocketchat.jobs import JobFailed, Jobs, OverBudget
from pocketchat.jobs.wire import JOB_FUNCTIONS, answer_of
from tests.conftest import ROOT
from utils.calculator import CalculationError, calculate
from utils.chunking import chunk_pages
from utils.read_document import Page, UnreadableDocument, read_document

# Besides the app's jobs, the tests' workers may sleep (a slow job) and allocate (a large one).
FUNCTIONS = JOB_FUNCTIONS | {"time:sleep", "builtins:bytearray"}


def scenario(test):
    """The test's body, run in an event loop of its own."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def jobs(workers: int = 2, per_user: int = 1, seconds: float = 30.0) -> Jobs:
    return Jobs(workers, per_user, seconds, 256_000_000, FUNCTIONS)


@scenario
async def test_a_job_answers_from_a_worker_and_raises_its_own_errors():
    pool = jobs()
    try:
        assert await pool.run("alice", calculate, "6 * 7") == 42
        with pytest.raises(CalculationError, match="Division by zero"):
            await pool.run("alice", calculate, "1 / 0")
        with pytest.raises(UnreadableDocument):
            await pool.run("alice", read_document, io.BytesIO(b"\x00\x01binary"), "a.txt")
        assert await pool.run("alice", calculate, "2 ** 10") == 1024  # the same worker, still there
    finally:
        await pool.aclose()


@scenario
async def test_a_job_over_its_time_is_stopped_and_the_next_one_runs():
    pool = jobs(workers=1)
    try:
        with pytest.raises(OverBudget, match=r"longer than the 0\.2 s"):
            await pool.run("alice", time.sleep, 30, seconds=0.2)
        assert await pool.run("alice", calculate, "1 + 1") == 2
    finally:
        await pool.aclose()


@scenario
async def test_a_job_over_its_memory_is_stopped_and_the_next_one_runs():
    pool = jobs(workers=1)
    try:
        with pytest.raises(OverBudget, match="more than the 256 MB"):
            await pool.run("alice", bytearray, 300_000_000)
        assert len(await pool.run("alice", bytearray, 50_000_000)) == 50_000_000
        assert await pool.run("alice", calculate, "1 + 1") == 2
    finally:
        await pool.aclose()


@scenario
async def test_one_users_jobs_leave_a_worker_for_another_user():
    """Alice sends four slow jobs at once; Bob's quick one is answered while hers still run."""
    pool = jobs(workers=2, per_user=1)
    try:
        alice = [asyncio.create_task(pool.run("alice", time.sleep, 3)) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert await pool.run("bob", calculate, "2 + 2") == 4
        assert sum(task.done() for task in alice) == 0
        for task in alice:
            task.cancel()
    finally:
        await pool.aclose()


@scenario
async def test_places_go_round_the_users_in_turn():
    """With one worker, the jobs of two users alternate, whoever queued more."""
    pool = jobs(workers=1, per_user=1)
    order: list[str] = []

    async def job(owner: str) -> None:
        await pool.run(owner, calculate, "1 + 1")
        order.append(owner)

    try:
        tasks = [asyncio.create_task(job("alice")) for _ in range(3)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(job("bob")) for _ in range(2)]
        await asyncio.gather(*tasks)
        assert order == ["alice", "bob", "alice", "bob", "alice"]
    finally:
        await pool.aclose()


@scenario
async def test_a_cancelled_job_kills_its_worker_and_frees_its_place():
    pool = jobs(workers=1)
    try:
        task = asyncio.create_task(pool.run("alice", time.sleep, 30))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not pool._idle  # its worker was killed, not kept
        assert await asyncio.wait_for(pool.run("bob", calculate, "3 * 3"), 10) == 9
    finally:
        await pool.aclose()


@scenario
async def test_a_worker_that_died_is_replaced():
    pool = jobs(workers=1)
    try:
        assert await pool.run("alice", calculate, "1 + 1") == 2
        (worker,) = pool._idle
        os.kill(worker.process.pid, signal.SIGKILL)
        await worker.process.wait()
        assert await pool.run("alice", calculate, "2 + 2") == 4
    finally:
        await pool.aclose()


@scenario
async def test_only_the_listed_functions_are_jobs():
    pool = jobs()
    with pytest.raises(ValueError, match="not a job"):
        await pool.run("alice", os.getcwd)
    await pool.aclose()


class Exploit:
    def __reduce__(self):  # what a worker taken over by a crafted file could send
        return (os.system, ("true",))


def test_an_answer_naming_another_class_is_refused():
    with pytest.raises(pickle.UnpicklingError, match=r"posix\.system"):
        answer_of(pickle.dumps(("ok", Exploit())))
    assert answer_of(pickle.dumps(("ok", [Page(1, "text")]))) == ("ok", [Page(1, "text")])


@scenario
async def test_a_bug_in_a_job_is_a_job_failed_and_the_worker_stays():
    pool = jobs(workers=1)
    try:
        with pytest.raises(JobFailed, match="PocketChat failed"):
            await pool.run("alice", chunk_pages, "not pages")  # a TypeError inside the job
        assert await pool.run("alice", calculate, "1 + 1") == 2
    finally:
        await pool.aclose()


APP = """
import asyncio, sys, time
from pocketchat.jobs import Jobs
from pocketchat.jobs.wire import JOB_FUNCTIONS

async def main():
    jobs = Jobs(1, 1, 60, 10**9, JOB_FUNCTIONS | {"time:sleep"})
    job = asyncio.create_task(jobs.run("alice", time.sleep, 60))
    while not jobs._running:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1)
    print(next(iter(jobs._workers)).process.pid, flush=True)
    await job

asyncio.run(main())
"""


def test_a_worker_dies_with_the_app_even_in_the_middle_of_a_job():
    with subprocess.Popen([sys.executable, "-c", APP], stdout=subprocess.PIPE, cwd=ROOT) as app:
        try:
            worker = psutil.Process(int(app.stdout.readline()))
            assert worker.is_running()
            app.kill()
            app.wait()
            worker.wait(timeout=10)  # psutil.TimeoutExpired if it outlived the app
        finally:
            app.kill()


@scenario
async def test_a_workers_start_is_not_counted_in_a_jobs_time():
    """On a busy machine a Python takes seconds to start: a calculation's 2 s are its own, not the start's."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        slow = Path(folder) / "python"
        slow.write_text(f'#!/bin/sh\nsleep 2\nexec {sys.executable} "$@"\n')
        slow.chmod(0o755)
        executable, sys.executable = sys.executable, str(slow)
        pool = jobs(workers=1)
        try:
            assert await pool.run("alice", calculate, "2 * 21", seconds=1) == 42
        finally:
            sys.executable = executable
            await pool.aclose()
