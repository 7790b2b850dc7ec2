"""The long-running tasks of a process (a replica's reader, watchdog and renewals, the session watch):
each runs in rounds, and a round that fails is logged with its traceback and followed by the next, so
that one unexpected error (a database that stalls while a dead replica's turns are ended, a Redis
client that raises what nobody expected) does not silently stop the task for good. A task that ends
anyway is a failure that `/healthz` names."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger("pocketchat")

PAUSE_SECONDS = 1.0  # after a failed round: a failure that repeats costs a log line a second, not a spin


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
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
