"""Starts the tests' app processes by forking one that has imported the app already.

`python main.py` spends most of its start-up importing (the openai SDK's types alone take a second of
CPU), and the suite starts well over a thousand apps: on 2 cores that was most of its time. This
module, run as a process of its own (`python -u -m tests.app_starter`), imports `main` once, then
forks a child for every app a test starts; the child sets up what `subprocess.Popen` would (its log
as stdout and stderr, its working directory, its environment) and runs `main.main(args)`, as
`python main.py args` does. It is single-threaded, so forking it is safe.

The test process talks to it over its stdin and stdout, one JSON line each way: `start` (returns the
child's pid) and `status` (the child's exit code once it ended, as `Popen.returncode` gives it).
`ForkedProcess` is the `Popen`-like handle the tests hold.
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# ---- the starter process ---------------------------------------------------------------------------


def serve() -> None:
    """Answer requests until the test process closes our stdin."""
    sys.path[0] = str(ROOT)  # as for `python main.py`: the checkout first
    import main  # noqa: F401 (the point: imported once, before any fork)

    ended: dict[int, int] = {}
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.05)
        _reap(ended)
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        request = json.loads(line)
        if request["op"] == "start":
            answer: dict[str, Any] = {"pid": _fork(request)}
        else:
            answer = {"code": ended.get(request["pid"])}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def _reap(ended: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ended[pid] = os.waitstatus_to_exitcode(status)


def _fork(request: dict[str, Any]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGUSR2, _print_what_it_does)
        sys.argv = [str(ROOT / "main.py"), *request["args"]]
        code = _run_main(request["args"])
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _print_what_it_does(_signal: int, _frame: object) -> None:
    """SIGUSR2: print every thread's stack and every asyncio task's to the app's log, for a test that
    waited on the app in vain (`ForkedProcess.wait`) to show what it was doing."""
    import asyncio
    import faulthandler

    faulthandler.dump_traceback(all_threads=True)
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        return  # no loop running (starting, or exiting)
    for task in tasks:
        print(f"task {task.get_name()}:", file=sys.stderr)
        awaited = task.get_coro()
        while awaited is not None:  # each coroutine down the chain of awaits, not only the task's own
            # a coroutine, a generator-based one, or an async generator (an `async with`'s context manager)
            frame = _first_of(awaited, ("cr_frame", "gi_frame", "ag_frame"))
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=sys.stderr)
            awaited = _first_of(awaited, ("cr_await", "gi_yieldfrom", "ag_await"))
    sys.stderr.flush()


def _first_of(thing: object, names: tuple[str, ...]) -> Any:
    return next((value for name in names if (value := getattr(thing, name, None)) is not None), None)


def _run_main(args: list[str]) -> int:
    """`main.main(args)`, with the exit code `python main.py` would give."""
    import main

    try:
        main.main(args)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)  # what the interpreter does with a message
        return 1
    return 0


# ---- the test process's side -----------------------------------------------------------------------


class AppStarter:
    """The starter process of one test process, and its requests (one at a time)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "tests.app_starter"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the app starter exited with {self.process.poll()}")
        return json.loads(line)

    def start(self, args: list[str], cwd: Path, env: dict[str, str], log: Path) -> "ForkedProcess":
        pid = self.ask({"op": "start", "args": args, "cwd": str(cwd), "env": env, "log": str(log)})["pid"]
        return ForkedProcess(self, pid)

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()  # it exits at the end of its input
        self.process.wait(10)
        self.process.stdout.close()


class ForkedProcess:
    """An app the starter forked: what the tests use of `subprocess.Popen`."""

    def __init__(self, starter: AppStarter, pid: int) -> None:
        self.starter = starter
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.starter.ask({"op": "status", "pid": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGUSR2)  # its stacks go to its log, which the test's failure shows
                time.sleep(0.5)
                raise subprocess.TimeoutExpired(f"app {self.pid}", timeout or 0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve()
