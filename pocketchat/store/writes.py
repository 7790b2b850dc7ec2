"""The write queue both stores are built on: their batching and refused-write rules, written once.

A store queues each write as a `Job`; one writer task takes the jobs in the order they were queued.
The queue owns:
- group commit: the jobs queued meanwhile (BATCH_SIZE at most) share one transaction, with nothing
  between them (no savepoint each: on PostgreSQL two round trips a job, and FTS5 flushes its index at
  every savepoint);
- when a job or the database fails the group, each job alone, in order (the one that failed is not
  tried twice): a job that fails on its own (a constraint) fails alone, a refused job holds up the
  later jobs of its own conversation only, and a lost connection refuses the rest untried;
- keeping what the database refused for a reason that may pass (its callers get StorageError at once)
  and writing it again, first and in order, every RETRY_SECONDS, and telling `on_written` when a
  conversation's kept writes have all landed;
- `failure` (for /healthz), `unwritten(conversation_id)` (for the hub), `timing` (for /metrics);
- shutdown: finish the queued writes, try the kept ones once more, report what is left.

What differs between the databases is a `Database`: how to run a group in one transaction, how to
run one job alone, which errors may pass and which mean the connection is
lost, and (PostgreSQL) what to do while idle or when the writer is given up on.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pocketchat.background import cancel_and_wait
from pocketchat.errors import StorageError

BATCH_SIZE = 100  # jobs committed together at most
RETRY_SECONDS = 2.0  # how often writes the database refused are tried again
MAX_UNWRITTEN = 10_000  # writes kept for a database that does not recover; the oldest go first


@dataclass
class Job:
    """One queued write: `work` is given the write connection. `retry`: if the database refuses it for a
    reason that may pass, keep it and write it again later; its caller has been told already."""

    work: Callable[[Any], Any]
    done: asyncio.Future[Any] | None
    conversation_id: str | None = None
    retry: bool = True
    # Told what `work` gave once it has landed, also when that is after a refusal (its caller was told it
    # failed then): a write whose outcome matters after its caller stopped waiting (a path's).
    landed: Callable[[Any], None] | None = None


Outcome = tuple[Job, Any, Exception | None]  # a job, its result, or why it failed


class JobFailed(Exception):
    """A group's job `index` raised `error`: the group's transaction was rolled back."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


def refusal(error: BaseException) -> StorageError:
    """What the caller of a write the database refused is told: the database's words, never the job's data."""
    refused = StorageError(f"The database could not save this ({str(error) or type(error).__name__}).")
    refused.__cause__ = error
    return refused


def _reason(error: StorageError) -> str:
    cause = error.__cause__
    return (str(cause) or type(cause).__name__) if cause is not None else str(error)


class Database:
    """What a store's database does for its queue. The queue calls one of these at a time, from its one
    writer task, so a database needs no lock of its own."""

    idle_seconds: float | None = None  # with nothing to write for this long, the queue calls `idle()`
    # When the last job of a group was answered (monotonic): `together` marks each, so that a long group
    # that keeps landing (a burst's, on a busy machine) is not taken for a database that does not answer.
    answered_at = 0.0

    def may_pass(self, error: BaseException) -> bool:
        """Whether `error` is the database refusing for now (full, locked, read-only, out of reach) rather
        than the job failing for good: the job is kept and written again."""
        raise NotImplementedError

    def waits(self, error: BaseException) -> bool:
        """Of those, whether it refuses this job alone (a lock another session holds too long): the
        group goes on without it, and its conversation's kept writes wait for the retry tick."""
        return False

    def lost(self, error: BaseException) -> bool:
        """Whether the connection itself is gone (or hangs): no other job can be written on it."""
        return False

    async def together(self, jobs: list[Job]) -> list[Any]:
        """Run `jobs` in one transaction, in order, and commit: their results. A job that raises rolls
        the transaction back and raises `JobFailed`; a failure of the transaction itself (the
        connection, the commit) raises as it is."""
        raise NotImplementedError

    async def alone(self, job: Job) -> Any:
        """Run `job` in a transaction of its own."""
        raise NotImplementedError

    def renew(self) -> None:
        """The database refused jobs even one by one: what to start afresh before the next try."""

    async def idle(self) -> None:
        """Nothing was queued for `idle_seconds`: check that the database answers (raise if not)."""

    def abort(self) -> None:
        """The writer is given up on: make whatever it waits on fail at once."""


D = TypeVar("D", bound=Database)


class WriteQueue(Generic[D]):
    """The one writer of a store, and what the app reads of it: `failure`, `unwritten()`, and the
    `on_written` and `timing` callbacks it sets. A store queues its writes with `_write` (or `_queue`),
    starts the writer with `_start_writing` once its database is open, and stops it with `_stop_writing`."""

    def __init__(self, database: D, logger: logging.Logger) -> None:
        self._database = database
        self._logger = logger  # the store's own: what it logs is said in the store's name
        self._jobs: asyncio.Queue[Job | None] = asyncio.Queue()  # None: shut down
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        # Writes the database refused for a reason that may pass, in order; retried before new ones.
        self._unwritten: list[Job] = []
        self._batch: list[Job] = []  # the jobs being written now (the unwritten ones first)
        self._locked: dict[str | None, str] = {}  # conversations whose kept writes wait on a lock, and why
        self._refused: str | None = None  # why the last write failed, while writes fail
        self._unanswered: str | None = None  # why the database failed `idle()`, until it answers again
        self._lost: BaseException | None = None  # why the connection was lost, at the last try
        self.waiting_since: float | None = None  # when the database work in flight began (monotonic)
        # Told (on the event loop) of a conversation whose kept writes have all landed.
        self.on_written: Callable[[str], None] | None = None
        self.timing: Callable[[float], None] | None = None  # told how long each group of writes took

    @property
    def failure(self) -> str | None:
        """Why writes fail now: the last batch was refused, or the database did not answer while idle."""
        return self._refused or self._unanswered

    def unwritten(self, conversation_id: str) -> bool:
        """Whether writes of this conversation wait for the database to recover."""
        return any(job.conversation_id == conversation_id for job in self._unwritten)

    def stalled_for(self) -> float:
        """How long the writes in flight have waited for the database's last answer (0: none are in
        flight): since the group began, or since its last job landed."""
        if self.waiting_since is None:
            return 0.0
        return time.monotonic() - max(self.waiting_since, self._database.answered_at)

    def _queue(self, job: Job) -> None:
        self._jobs.put_nowait(job)

    def _write(
        self,
        work: Callable[[Any], Any],
        conversation_id: str | None,
        retry: bool = True,
        landed: Callable[[Any], None] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue a write now (writes run in the order they are queued); await the result when it matters."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue(Job(work, done, conversation_id, retry, landed))
        # The writer logs a failure; a caller that does not wait for the result need not hear of it again.
        done.add_done_callback(lambda future: future.cancelled() or future.exception())
        return done

    def _start_writing(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name=f"{type(self).__name__} writer")

    async def _stop_writing(self, timeout: float | None = None) -> None:
        """Finish the queued writes, try the kept ones once more, report what is left. With `timeout`, a
        database that does not answer costs that long at most: then the writer is given up on, and every
        caller still waiting is told."""
        self._closing = True
        if self._writer is None:
            return
        self._jobs.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._writer), timeout)
        except TimeoutError:
            self._database.abort()
            await cancel_and_wait([self._writer])
            self._abandon()

    def _abandon(self) -> None:
        batch = {id(job) for job in self._batch}
        left = [*self._batch, *(job for job in self._unwritten if id(job) not in batch)]
        while not self._jobs.empty():
            if (job := self._jobs.get_nowait()) is not None:
                left.append(job)
        for job in left:
            self._settle(job, None, StorageError("The database could not save this before shutdown."))
        self._logger.error("%d writes could not be saved before shutdown", sum(1 for job in left if job.retry))

    # ---- the writer ------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            # While writes wait for the database to recover, try them again every few seconds; while
            # there is nothing to write, let the database check itself every `idle_seconds`.
            wait = RETRY_SECONDS if self._unwritten else self._database.idle_seconds
            try:
                job = await asyncio.wait_for(self._jobs.get(), wait)
            except TimeoutError:
                if self._unwritten:
                    await self._write_batch([], tick=True)
                else:
                    await self._idle()
                continue
            if job is None:
                await self._finish()
                return
            await self._write_batch(self._gather(job))

    def _gather(self, first: Job) -> list[Job]:
        """Group commit: the jobs queued meanwhile share one transaction, each in its own savepoint."""
        batch = [first]
        while len(batch) < BATCH_SIZE and not self._jobs.empty():
            if (more := self._jobs.get_nowait()) is None:
                self._jobs.put_nowait(None)  # the shutdown mark stays last
                break
            batch.append(more)
        return batch

    async def _idle(self) -> None:
        if self._closing:
            return
        self.waiting_since = time.monotonic()
        try:
            await self._database.idle()
        except Exception as error:
            if self._unanswered is None:
                self._logger.error("the database does not answer: %s", str(error) or type(error).__name__)
            self._unanswered = str(error) or type(error).__name__
        else:
            self._unanswered = None
        finally:
            self.waiting_since = None

    async def _finish(self) -> None:
        if self._unwritten:
            self._lost = None  # once more, even if the connection was lost at the last try
            await self._write_batch([])
            if self._unwritten:
                self._logger.error("%d writes could not be saved before shutdown", len(self._unwritten))

    async def _write_batch(self, batch: list[Job], tick: bool = False) -> None:
        # The kept writes go first. `_unwritten` stays as it is until this attempt ends: the hub asks it.
        # Those that wait on a lock (`waits`) wait for the retry tick, unless a new job of their
        # conversation must land after them: a lock held by a frozen replica costs each batch a lock
        # timeout otherwise.
        set_aside = set() if tick else self._locked.keys() - {job.conversation_id for job in batch}
        skipped = [job for job in self._unwritten if job.conversation_id in set_aside]
        retried = [job for job in self._unwritten if job.conversation_id not in set_aside]
        self._batch = jobs = [*retried, *batch]
        started = time.perf_counter()
        self.waiting_since = time.monotonic()
        try:
            results = await self._attempt(jobs)
        finally:
            self._batch = []
            self.waiting_since = None
        if self.timing is not None:
            self.timing(time.perf_counter() - started)
        refusals = [(job, error) for job, _, error in results if isinstance(error, StorageError)]
        kept = [*skipped, *(job for job, _ in refusals if job.retry)]
        self._locked = {job.conversation_id: self._locked[job.conversation_id] for job in skipped}
        self._locked |= {
            job.conversation_id: _reason(error)
            for job, error in refusals
            if job.conversation_id is not None and error.__cause__ is not None and self._database.waits(error.__cause__)
        }
        self._refused = _reason(refusals[0][1]) if refusals else next(iter(self._locked.values()), None)
        if refusals:
            self._logger.error("database writes failed (%d kept to write again): %s", len(kept), self._refused)
        if len(refusals) < len(results):
            self._unanswered = None  # it answered
        waiting = {job.conversation_id for job in self._unwritten}
        self._unwritten = kept[-MAX_UNWRITTEN:]
        for job, result, error in results:
            if error is None and job.landed is not None:
                # Before its caller wakes up; what it raises is the loop's to log, not the writer's.
                asyncio.get_running_loop().call_soon(job.landed, result)
            self._settle(job, result, error)
        for conversation_id in waiting - {job.conversation_id for job in self._unwritten}:
            if conversation_id is not None and self.on_written is not None:
                asyncio.get_running_loop().call_soon(self.on_written, conversation_id)

    async def _attempt(self, jobs: list[Job]) -> list[Outcome]:
        """Write `jobs`: together if the database takes them, else each alone; what it refuses fails with
        StorageError."""
        if self._closing and self._lost is not None:
            # Shutting down, and the connection was lost at the last try: not waited on once per batch.
            # The writes are kept, and tried once more at the end.
            return [(job, None, refusal(self._lost)) for job in jobs]
        self._lost = None
        failed: JobFailed | None = None
        try:
            return [(job, result, None) for job, result in zip(jobs, await self._database.together(jobs), strict=True)]
        except JobFailed as error:
            failed, cause = error, error.error
        except Exception as error:
            cause = error
        if self._database.lost(cause):
            self._lost = cause
            return [(job, None, refusal(cause)) for job in jobs]
        # Which ones does it take? A job that failed on its own, or that a lock held up, is not tried
        # again (a lock would be waited for twice); one the database refused as a whole may pass alone.
        known = None
        if failed is not None and (not self._database.may_pass(cause) or self._database.waits(cause)):
            known = failed
        results = await self._one_by_one(jobs, known)
        if any(isinstance(error, StorageError) for _, _, error in results):
            self._database.renew()
        return results

    async def _one_by_one(self, jobs: list[Job], known: JobFailed | None = None) -> list[Outcome]:
        """Each job in its own transaction, in order; `known`: how one of them failed in the group, not
        tried again. A refused job holds up the later jobs of its own conversation only (they stay
        behind it, in order): one write the database will not take (too big for the space left, say)
        does not stop every other conversation's."""
        results: list[Outcome] = []
        held: dict[str, BaseException] = {}  # conversation: why its first write was refused
        for index, job in enumerate(jobs):
            if (cause := self._lost or held.get(job.conversation_id or "")) is not None:
                results.append((job, None, refusal(cause)))  # behind it, for the same reason
                continue
            if known is not None and index == known.index:
                results.append(self._failed(job, known.error, held))
                continue
            try:
                result = await self._database.alone(job)
            except Exception as error:
                results.append(self._failed(job, error, held))
                if self._database.may_pass(error) and self._database.lost(error):
                    self._lost = error  # the rest are refused untried
            else:
                results.append((job, result, None))
        return results

    def _failed(self, job: Job, error: Exception, held: dict[str, BaseException]) -> Outcome:
        """A job that failed alone: refused by the database (it holds up its conversation's later jobs),
        or failing on its own, which takes no other job down and is not written again."""
        if not self._database.may_pass(error):
            self._logger.error("database write failed: %s", error)
            return job, None, error
        if job.conversation_id is not None:
            held[job.conversation_id] = error
        return job, None, refusal(error)

    @staticmethod
    def _settle(job: Job, result: Any, error: Exception | None) -> None:
        if job.done is None or job.done.done():
            return  # a write retried after its caller was told it failed (or a caller that gave up)
        if error is None:
            job.done.set_result(result)
        else:
            job.done.set_exception(error)
