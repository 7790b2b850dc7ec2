"""Imports: a file checked whole in a job worker, then its conversations written in the background,
a batch at a time, through the store's one write queue, all or nothing.

The worker (`read.check`) parses and checks the file away from the event loop and this process's memory; a
bad file is refused before anything is written. The conversations then go in batches, each batch one
write job (one transaction; a conversation of more than BATCH_MESSAGES messages goes in parts), each
under new ids and the importer's name, read one at a time (a long one on a thread) and paused between:
other users' chats go first.
Each conversation is listed as the import's, in the transaction that writes it, until the import ends.
If a batch fails, or the app stops meanwhile, the conversations this import wrote are deleted again; if
its process dies (killed, its machine gone), the next that finds it gone deletes them (`clear_stopped`):
an import is kept whole or not at all.

The database is what every replica asks: an import is claimed there before its file is read (one of a
user's at a time: a conflicting insert), says there how far it got batch by batch, and is kept there for
KEEP_SECONDS once it ended, however it ended; so a replica that never ran it answers for it, whatever
Redis forgot.
"""

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal, Protocol

from pocketchat.background import CLEANUP_SECONDS, cancel_and_wait
from pocketchat.errors import StorageError, Unavailable
from pocketchat.jobs import JobFailed, Jobs, OverBudget
from pocketchat.records import new_id
from pocketchat.settings import Settings
from pocketchat.store import SAVE_WAIT_SECONDS, Store
from pocketchat.store.transfer import KEEP_SECONDS
from pocketchat.transfer.native import from_file
from pocketchat.transfer.read import check, over_memory
from pocketchat.transfer.tree import BadFile, ConversationTree

logger = logging.getLogger(__name__)

BATCH_MESSAGES = 500  # messages written in one job at most (a longer conversation goes in parts)
BATCH_CONVERSATIONS = 25
# Between batches. Writing an import is CPU work in the app's process (reading lines, building rows); with
# no pause, a chat's first chunk came twice as late while an import was written on a busy 2-core machine,
# with this one as early as without an import, for an import about a quarter slower (bench/import_conversations.py).
PAUSE_SECONDS = 0.1
READ_TIMEOUT = 300.0  # seconds checking a file may take
# Large files checked at once, by all users (each user one at a time), so that other jobs keep workers: more
# wait their turn. A small file waits for none of them, only for a worker (pocketchat/jobs).
READERS = 2
SMALL_FILE_BYTES = 1_000_000
# Bytes of memory checking a file may take. It holds one conversation at a time: about 4 times its
# size in the file (ours of 100,000 messages, 107 MB: 431 MiB), 11 times for text dense in emoji (4 bytes
# a character in memory), more for small nodes, of which a conversation has at most 100,000 (ChatGPT's
# of 100,000 nodes, 13 MB: 346 MiB). More is refused, saying so, rather than taking the machine's memory
# (before reading went a conversation at a time, a 100 MB list of empty lists took 2.5 GB).
READ_MEMORY = 1 << 30
BIG_LINE = 1 << 18  # characters of a conversation's line from which it is read on a thread
SWEEP_SECONDS = 30.0  # with replicas, how often each looks for an import whose replica died
UNDO_CHECK_SECONDS = 2.0  # how often a failed import whose deletion the database refused looks again

Status = Literal["importing", "done", "failed"]


@dataclass
class ImportJob:
    owner: str
    total: int  # conversations in the file
    dropped: dict[str, int]  # what the file held that was left out, by kind
    id: str = field(default_factory=new_id)
    status: Status = "importing"
    imported: int = 0
    error: str | None = None
    ended_at: float | None = None
    written: list[str] = field(default_factory=list)  # the ids of the conversations written so far

    def to_wire(self) -> dict[str, Any]:
        wire = {"id": self.id, "status": self.status, "total": self.total, "imported": self.imported}
        wire["dropped"] = self.dropped
        return wire | ({"error": self.error} if self.error else {})


class Progress(Protocol):
    """What an import asks of the app's coordinator: which process runs it, and whether another has
    stopped (with replicas, a replica's heartbeat)."""

    replica: str  # this process's name, new at each start: it marks what its imports write

    async def replica_gone(self, replica: str, quiet_for: float) -> bool:
        """Whether the process of that name has stopped (this one's before a restart, or a dead replica),
        its import having written nothing for `quiet_for` seconds."""


class ImportRunning(Exception):
    """The user has an import under way already."""


RUNNING = "An import of yours is under way already; wait for it to end."
FAILED = "The import failed and nothing of it was kept; try again."
STOPPED = "The server that was importing this file stopped before it finished; nothing of it was kept. Try again."


class Imports:
    """The imports of this process, by id; each user runs one at a time."""

    def __init__(
        self, settings: Settings, store: Store, default_model: Callable[[], str], progress: Progress, jobs: Jobs
    ) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs  # a file is checked by a job worker
        self.default_model = default_model  # for conversations whose file names none
        self.progress = progress
        self._jobs: dict[str, ImportJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._readers = asyncio.Semaphore(READERS)
        self._sweeping: asyncio.Task[None] | None = None
        # Told of the conversations a failed import deleted (the app tells the pages that show one).
        self.gone: Callable[[list[str]], None] = lambda conversation_ids: None

    async def state(self, import_id: str, owner: str) -> dict[str, Any] | None:
        """How far the import by that id got (what `GET /api/imports/{id}` says), if it is this owner's:
        run here, or on another replica."""
        if (job := self._jobs.get(import_id)) is not None:
            return job.to_wire() if job.owner == owner else None
        found = await self.store.find_import(import_id)
        if found is None or found.owner != owner:
            return None
        if found.replica is not None and await self.progress.replica_gone(found.replica, time.time() - found.told_at):
            # Its replica died mid-import: failed (nothing kept) once what it wrote is deleted, not before.
            await self.clear_stopped()
            found = await self.store.find_import(import_id) or found
        return found.wire

    async def clear_stopped(self) -> set[str] | None:
        """Delete what the imports of a stopped process wrote (it never ended them), unless its replica
        still runs: at start, every SWEEP_SECONDS with replicas, when an import is found stopped, and
        before a user's import. The ids of the imports still running (None: not known, the database failed)."""
        try:
            running = await self.store.running_imports()
        except Exception as error:
            logger.warning("could not look for imports a stopped process left: %s", error)
            return None
        left = set()
        for import_id, replica, told_at in running:
            if import_id in self._jobs or not await self.progress.replica_gone(replica, time.time() - told_at):
                left.add(import_id)
                continue
            try:
                undone = await self.store.undo_import(import_id, STOPPED)  # written again if the database refuses it
            except Exception as error:
                logger.warning(
                    "import %s stopped with %s: its writes are not deleted yet: %s", import_id[:6], replica, error
                )
                left.add(import_id)
            else:
                logger.warning("import %s stopped with %s: its writes are deleted", import_id[:6], replica)
                self.gone(undone)
        return left

    async def sweep(self) -> None:
        """What stopped processes left, deleted at start and, with replicas, every SWEEP_SECONDS (another
        replica may die at any time, and none may be asked about its import)."""
        await self.clear_stopped()
        if self.settings.clustered:
            self._sweeping = asyncio.create_task(self._sweep_now_and_then(), name="import sweep")

    async def _sweep_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            await self.clear_stopped()

    async def start(self, owner: str, upload: BinaryIO) -> ImportJob:
        """Check the uploaded file whole (BadFile if it cannot be imported: nothing is written), then
        write its conversations in the background; the job says how far it got. ImportRunning if one of
        the owner's runs, here or on another replica."""
        self._forget_old()
        import_id = new_id()
        await self._claim(import_id, owner)
        try:
            folder = await asyncio.to_thread(tempfile.mkdtemp, prefix="pocketchat-import-")
            source, lines = os.path.join(folder, "upload.json"), os.path.join(folder, "conversations.jsonl")
            try:
                size = await asyncio.to_thread(_copy, upload, source)
                async with self._readers if size > SMALL_FILE_BYTES else contextlib.nullcontext():
                    verdict = await self._read(owner, source, lines)
                job = ImportJob(owner, verdict["conversations"], verdict["dropped"], id=import_id)
                # Before its id goes out: the page's first poll may reach another replica.
                await self.store.import_read(job.id, job.total, job.dropped)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, folder, True)
                raise
        except BaseException:
            self.store.release_import(import_id)  # the owner may import again (written until it lands)
            raise
        self._jobs[job.id] = job
        self._keep(self._write(job, lines, folder), name=f"import {job.id[:6]}")
        return job

    async def _claim(self, import_id: str, owner: str) -> None:
        """Claim the import in the database, the one arbiter of a user's imports across replicas (Redis may
        forget), or raise ImportRunning. Claims are queued in the order imports start, so the first wins."""
        if await self._claimed(import_id, owner):
            return
        # One of theirs is listed: perhaps that of a process that stopped, which no sweep has deleted yet.
        await self.clear_stopped()
        if not await self._claimed(import_id, owner):
            raise ImportRunning(RUNNING)

    async def _claimed(self, import_id: str, owner: str) -> bool:
        """One claim: a database that refuses or does not answer in SAVE_WAIT_SECONDS is Unavailable (a
        claim that lands later is let go again)."""
        claim = self.store.claim_import(import_id, owner, self.progress.replica)
        try:
            return await asyncio.wait_for(asyncio.shield(claim), SAVE_WAIT_SECONDS)
        except (StorageError, TimeoutError):
            self.store.release_import(import_id)  # queued behind the claim: lands after it
            raise Unavailable("PocketChat cannot reach its database now; try the import again in a moment.") from None

    async def _read(self, owner: str, source: str, lines: str) -> dict[str, Any]:
        """Check the file in a job worker; its verdict (`{conversations, dropped}`), or BadFile with its
        reason (the file's, or its budget's: out of time, out of memory)."""
        try:
            verdict = await self.jobs.run(owner, check, source, lines, seconds=READ_TIMEOUT, memory_bytes=READ_MEMORY)
        except OverBudget as over:
            if over.budget == "memory":
                raise BadFile(over_memory(READ_MEMORY), status=413) from None
            took = f"The file takes longer to check than an import may ({READ_TIMEOUT:.0f} s); split it."
            raise BadFile(took, 413) from None
        except JobFailed:
            raise BadFile("The file could not be read (the server's log says why).", status=500) from None
        if "error" in verdict:
            raise BadFile(verdict["error"], verdict["status"])
        return verdict

    async def _write(self, job: ImportJob, lines: str, folder: str) -> None:
        started = time.monotonic()
        try:
            with open(lines, encoding="utf-8") as file:
                batch: list[ConversationTree] = []
                for line in file:  # a local file of one conversation a line: each read is short
                    # A conversation of many messages is read on a thread: on the event loop it would hold
                    # every chat up for as long (0.7 s for 40,000 messages); a thread gives the loop the GIL
                    # back every few milliseconds.
                    tree = await asyncio.to_thread(self._tree, line) if len(line) > BIG_LINE else self._tree(line)
                    if len(tree.messages) > BATCH_MESSAGES:
                        if batch:
                            await self._write_batch(job, batch)
                            batch = []
                        await self._write_long(job, tree)
                        continue
                    batch.append(tree)
                    if len(batch) == BATCH_CONVERSATIONS or sum(len(tree.messages) for tree in batch) >= BATCH_MESSAGES:
                        await self._write_batch(job, batch)
                        batch = []
                    # One conversation at a time on the event loop, rather than many in a thread: a thread
                    # busy in Python makes the loop wait for the GIL at every step of every chat.
                    await asyncio.sleep(0)
                if batch:
                    await self._write_batch(job, batch)
            await self.store.finish_import(job.id)
        except BaseException as error:  # a shutdown (cancelled) too: none of it stays
            logger.error("import %s failed after %d conversations: %r", job.id[:6], job.imported, error)
            await self._undo(job)  # before it says failed: then none of it is left
            job.status, job.error = "failed", FAILED
            if not isinstance(error, Exception):
                raise
        else:
            job.status, job.written = "done", []
            logger.info("import %s: %d conversations in %.1f s", job.id[:6], job.imported, time.monotonic() - started)
        finally:
            job.ended_at = time.monotonic()
            await asyncio.to_thread(shutil.rmtree, folder, True)

    def _tree(self, line: str) -> ConversationTree:
        """A conversation of the reader's lines (checked already), under new ids, with the app's defaults."""
        tree = from_file(json.loads(line), "A conversation").with_new_ids()
        tree.model = tree.model or self.default_model()
        tree.system_prompt = self.settings.system_prompt if tree.system_prompt is None else tree.system_prompt
        return tree

    async def _write_batch(self, job: ImportJob, batch: list[ConversationTree]) -> None:
        await self.store.import_conversations(job.owner, batch, job.id)
        job.written += [tree.id for tree in batch]
        job.imported += len(batch)
        await asyncio.sleep(PAUSE_SECONDS)  # an import is never urgent: the writer serves chats first

    async def _write_long(self, job: ImportJob, tree: ConversationTree) -> None:
        """A conversation of more messages than a write holds, in parts of BATCH_MESSAGES, each a write of
        its own: the other users' writes go in between (one transaction of 40,000 messages held their
        replies' saves up for over 2 s, and their turns ended in errors). Until its last part is in, no one
        lists, opens or finds it; the import stays all or nothing (its parts are listed as its)."""
        messages, leaf_id = tree.messages, tree.leaf_id
        tree.messages, tree.leaf_id = messages[:BATCH_MESSAGES], None
        await self.store.import_conversations(job.owner, [tree], job.id, partial=True)
        job.written.append(tree.id)
        for start in range(BATCH_MESSAGES, len(messages), BATCH_MESSAGES):
            last = start + BATCH_MESSAGES >= len(messages)
            await self.store.import_messages(tree.id, messages[start : start + BATCH_MESSAGES], job.id, last, leaf_id)
            await asyncio.sleep(0)  # what waited for the writer meanwhile (a chat's) goes first
        job.imported += 1
        await asyncio.sleep(PAUSE_SECONDS)

    async def _undo(self, job: ImportJob) -> None:
        """Delete what the import wrote: none of it stays. (Queued behind a batch still in flight.) The
        pages that show one of its conversations are told it is gone, also when the database refused the
        deletion for now (it is kept and written again; meanwhile none of them can be changed)."""
        gone = job.written
        try:
            # With a batch whose write was cancelled (a shutdown) but landed: only the undo knows it.
            gone = sorted({*gone, *await self.store.undo_import(job.id, FAILED)})
        except Exception:
            logger.exception("import %s: could not delete the %d conversations it wrote", job.id[:6], job.imported)
            # The store writes it again until it lands; a page may open one of them meanwhile.
            self._keep(self._tell_once_undone(job.id, gone))
        else:
            job.imported = 0
        job.written = []
        self.gone(gone)

    async def _tell_once_undone(self, import_id: str, gone: list[str]) -> None:
        """Tell the pages again once a deletion the database refused has landed (its import no longer listed)."""
        while True:
            await asyncio.sleep(UNDO_CHECK_SECONDS)
            try:
                running = {row[0] for row in await self.store.running_imports()}
            except Exception as error:
                logger.warning("import %s: could not see whether its deletion landed: %s", import_id[:6], error)
                continue
            if import_id not in running:
                self.gone(gone)
                return

    def _keep(self, work: Coroutine[Any, Any, None], name: str = "import") -> None:
        """Run `work` in the background; stopped by `aclose` (and not begun once it has: the app stops)."""
        if self._closing:
            work.close()
            return
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_old(self) -> None:
        now = time.monotonic()
        for job_id, job in list(self._jobs.items()):
            if job.ended_at is not None and now - job.ended_at > KEEP_SECONDS:
                del self._jobs[job_id]

    async def aclose(self) -> None:
        """Stop the imports under way; each deletes what it wrote."""
        self._closing = True
        if self._sweeping is not None:
            await cancel_and_wait([self._sweeping])
        await cancel_and_wait(self._tasks, patience=CLEANUP_SECONDS)


def _copy(upload: BinaryIO, path: str) -> int:
    """Copy the upload to `path`; its size."""
    upload.seek(0)
    with open(path, "wb") as file:
        shutil.copyfileobj(upload, file, 1 << 20)
        return file.tell()
