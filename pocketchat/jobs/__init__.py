"""Untrusted work, bounded and off the event loop: what a user's input can make slow (reading a document,
cutting it into passages, decoding an image, a calculation) runs in worker processes, where it cannot hold
the event loop or the GIL of the app.

Each job has a time budget (past it, its worker is killed and a fresh one takes its place) and a memory
budget (the worker's address space; past it, the job fails and its worker is replaced). Workers are shared
fairly: a user runs at most `per_user` jobs at once, however many they send, and when a worker frees up the
next job is taken from the next user in turn, not from the one who queued most. So one user's large jobs
never take every worker, and another user's small job waits at most for one job to end (and usually for
none).
"""

import asyncio
import collections
import itertools
import logging
import pickle
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pocketchat.jobs.wire import HEADER, JOB_FUNCTIONS, READY, answer_of, frame, length_of
from pocketchat.settings import Settings

logger = logging.getLogger("pocketchat")
T = TypeVar("T")
APP_ROOT = Path(__file__).resolve().parents[2]  # where `-m pocketchat.jobs.worker` is found
PIPE_BUFFER = 1 << 20
START_SECONDS = 60.0  # a worker's start (not counted in a job's time): minutes only on a machine in trouble


class JobFailed(Exception):
    """A job that did not finish: `message` says why, for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OverBudget(JobFailed):
    """A job that went over its time or memory budget (`budget`), and was stopped."""

    def __init__(self, message: str, budget: Literal["time", "memory"]) -> None:
        super().__init__(message)
        self.budget = budget


class Worker:
    """One worker process, running one job at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.ready = False  # it said it started: its imports done, a job's time is the job's own

    @classmethod
    async def start(cls, functions: frozenset[str]) -> "Worker":
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pocketchat.jobs.worker", *sorted(functions),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=APP_ROOT, limit=PIPE_BUFFER,
        )  # fmt: skip
        return cls(process)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def started(self) -> None:
        """Wait for the worker to say it is ready (a Python starting takes seconds on a busy machine)."""
        assert self.process.stdout is not None
        if await self.process.stdout.readexactly(len(READY)) != READY:
            raise ConnectionError("the worker did not start as one")
        self.ready = True

    async def call(self, reference: str, args: tuple[Any, ...], memory: int) -> tuple[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        # Pickled on a thread: a job's input may be a 20 MB file (the loop would wait for its copy).
        self.process.stdin.writelines(await asyncio.to_thread(frame, (reference, args, memory)))
        await self.process.stdin.drain()
        header = await self.process.stdout.readexactly(HEADER.size)
        data = await self.process.stdout.readexactly(length_of(header))
        # A large answer (a long document's passages) is unpickled on a thread, not the event loop.
        return await asyncio.to_thread(answer_of, data) if len(data) > PIPE_BUFFER else answer_of(data)

    async def kill(self) -> None:
        if self.alive:
            self.process.kill()
        await self.process.wait()


class Jobs:
    """The app's job workers: at most `workers` processes, started when first needed and kept."""

    def __init__(
        self, workers: int, per_user: int, seconds: float, memory_bytes: int, functions: frozenset[str] = JOB_FUNCTIONS
    ) -> None:
        self.functions = functions  # what the workers may run ("module:function")
        self.workers = workers
        self.per_user = max(1, min(per_user, workers))
        self.seconds = seconds
        self.memory_bytes = memory_bytes
        self._workers: set[Worker] = set()  # every worker started and not killed
        self._idle: list[Worker] = []  # of those, the free ones
        self._running: collections.Counter[str] = collections.Counter()  # places taken, by user
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}  # jobs waiting for a place
        self._served: dict[str, int] = {}  # when each user running or waiting last got a place
        self._tickets = itertools.count(1)

    @classmethod
    def from_settings(cls, settings: Settings) -> "Jobs":
        return cls(
            settings.job_workers,
            settings.job_workers_per_user,
            settings.job_seconds,
            settings.job_memory_mb * 1_000_000,
        )

    async def run(
        self,
        owner: str,
        function: Callable[..., T],
        *args: Any,
        seconds: float | None = None,
        memory_bytes: int | None = None,
    ) -> T:
        """`function(*args)` in a worker, for `owner`, within its budgets (the settings' by default). Raises
        what the function raises for its input (a ValueError of its own), OverBudget, or JobFailed."""
        reference = f"{function.__module__}:{function.__qualname__}"
        if reference not in self.functions:
            raise ValueError(f"{reference} is not a job a worker runs")
        seconds = self.seconds if seconds is None else seconds
        memory = self.memory_bytes if memory_bytes is None else memory_bytes
        await self._place_for(owner)
        started = time.monotonic()
        try:
            kind, value = await self._call(function.__name__, reference, args, seconds, memory)
        finally:
            self._let_go(owner)
        logger.debug("job %s: %s in %d ms", function.__name__, kind, (time.monotonic() - started) * 1000)
        if kind == "ok":
            return value
        if kind == "raised":
            raise value
        if kind == "memory":
            raise OverBudget(
                f"It needed more than the {memory // 1_000_000:,} MB a job may use, and was stopped.", "memory"
            )
        logger.error("job %s failed inside PocketChat:\n%s", function.__name__, value)
        raise JobFailed("It could not be done: PocketChat failed doing it (the server's log says more).")

    async def _call(
        self, name: str, reference: str, args: tuple[Any, ...], seconds: float, memory: int
    ) -> tuple[str, Any]:
        """One job on a free worker (started if none is). The worker goes back to the free ones after a
        job that ended as it should; killed otherwise (over time, cancelled, dead, over memory)."""
        while self._idle and not self._idle[-1].alive:
            self._workers.discard(self._idle.pop())
        if self._idle:
            worker = self._idle.pop()
        else:
            worker = await Worker.start(self.functions)
            self._workers.add(worker)
        kind = "cancelled"
        try:
            if not worker.ready:
                await asyncio.wait_for(worker.started(), START_SECONDS)
            kind, value = await asyncio.wait_for(worker.call(reference, args, memory), seconds)
        except TimeoutError:
            if not worker.ready:
                logger.error("a job worker did not start within %g s", START_SECONDS)
                raise JobFailed("It could not be done: no worker could start (the server's log says more).") from None
            logger.warning("job %s over its %g s: stopped", name, seconds)
            raise OverBudget(
                f"It took longer than the {seconds:g} s a job may take, and was stopped.", "time"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            code = await worker.process.wait()
            logger.error("a job worker died during %s (exit %s)", name, code)
            if code == -signal.SIGKILL:  # not by us: the kernel's OOM killer, out of memory where it can't say so
                raise OverBudget(
                    "It needed more memory than the machine could give, and was stopped.", "memory"
                ) from None
            raise JobFailed("It could not be done: the worker doing it failed (the server's log says more).") from None
        except pickle.UnpicklingError as error:  # a worker a file took over, or a job's bug
            logger.error("job %s answered what the app does not take: %s", name, error)
            raise JobFailed("It could not be done: the worker doing it failed (the server's log says more).") from None
        finally:
            if kind in ("ok", "raised", "failed") and worker.alive:
                self._idle.append(worker)
            else:
                self._workers.discard(worker)
                await asyncio.shield(worker.kill())
        return kind, value

    async def _place_for(self, owner: str) -> None:
        """Wait until `owner` may start a job (a place among the workers, within their share), and take it."""
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, collections.deque()).append(place)
        self._dispatch()
        try:
            await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():  # given a place it will not take: passed on
                self._let_go(owner)
            elif (queue := self._waiting.get(owner)) is not None and place in queue:
                queue.remove(place)
                if not queue:
                    del self._waiting[owner]
            raise

    def _let_go(self, owner: str) -> None:
        self._running[owner] -= 1
        if not self._running[owner]:
            del self._running[owner]
            if owner not in self._waiting:
                self._served.pop(owner, None)
        self._dispatch()

    def _dispatch(self) -> None:
        """Give the free places to the waiting jobs: first to the users running fewest, then to the one
        served longest ago (a user who just got a place goes behind one who waits for a first)."""
        while sum(self._running.values()) < self.workers:
            ready = [owner for owner in self._waiting if self._running[owner] < self.per_user]
            if not ready:
                return
            owner = min(ready, key=lambda owner: (self._running[owner], self._served.get(owner, 0)))
            queue = self._waiting[owner]
            place = queue.popleft()
            if not queue:
                del self._waiting[owner]
            if place.done():  # cancelled, its task not yet told
                continue
            place.set_result(None)
            self._running[owner] += 1
            self._served[owner] = next(self._tickets)

    async def aclose(self) -> None:
        workers, self._workers, self._idle = self._workers, set(), []
        await asyncio.gather(*(worker.kill() for worker in workers), return_exceptions=True)
