"""The long-running tasks of a process (a replica's reader, watchdog and renewals, the session watch):
each runs in rounds, and a round that fails is logged with its traceback and followed by the next, so
that one unexpected error (a database that stalls while a dead replica's turns are ended, a Redis
client that raises what nobody expected) does not silently stop the task for good. A task that ends
anyway is a failure that `/healthz` names."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

logger = logging.getLogger("pocketchat")

PAUSE_SECONDS = 1.0  # after a failed round: a failure that repeats costs a log line a second, not a spin
CANCEL_AGAIN_SECONDS = 0.5  # a cancelled task still running after this is cancelled again
CANCEL_TRIES = 20
CLEANUP_SECONDS = 10.0  # the patience for tasks whose cancel runs writes or closes servers


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], patience: float = CANCEL_AGAIN_SECONDS) -> None:
    """Cancel `tasks` and wait until they have ended, cancelling again those that go on. Python 3.11's
    `asyncio.wait_for` returns its result and drops a cancel that comes just as what it waits for
    ends (fixed in 3.12); redis-py sends each command through it, and a replica's Redis reader whose
    one cancel was dropped so read on and held up the shutdown for good. A task that still runs after
    CANCEL_TRIES cancels is logged and left. `patience`: how long a cancelled task may take to clean up
    (an import deleting what it wrote) before it is cancelled again."""
    pending = {task for task in tasks if not task.done()}
    for _ in range(CANCEL_TRIES):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=patience)
    if pending:
        logger.error("tasks still running after %d cancels: %s", CANCEL_TRIES, [task.get_name() for task in pending])


class Background:
    """Named tasks that run rounds until closed; `failure` says which ended, if any did."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ended: dict[str, str] = {}  # name: why it ended
        self._closing = False

    def keep(self, name: str, one_round: Callable[[], Awaitable[None]], pause: float = PAUSE_SECONDS) -> None:
        """Run `one_round` again and again, whatever it raises, until `aclose`."""
        task = asyncio.create_task(self._rounds(name, one_round, pause), name=name)
        task.add_done_callback(lambda done: self._done(name, done))
        self._tasks[name] = task

    @staticmethod
    async def _rounds(name: str, one_round: Callable[[], Awaitable[None]], pause: float) -> None:
        while True:
            try:
                await one_round()
            except Exception:
                logger.exception("%s: a round failed; the next one follows", name)
                await asyncio.sleep(pause)

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._closing:
            return
        # Only a BaseException that is not an Exception, or a cancel from elsewhere, gets here.
        why = "cancelled" if task.cancelled() else repr(task.exception())
        self._ended[name] = why
        logger.error("%s stopped (%s): this process no longer does its work", name, why)

    @property
    def failure(self) -> str | None:
        """Which tasks ended, and why; None while all of them run."""
        if not self._ended:
            return None
        return "; ".join(f"{name} stopped ({why})" for name, why in self._ended.items())

    async def aclose(self) -> None:
        self._closing = True
        await cancel_and_wait(self._tasks.values())
