"""Documents attached to conversations, around the indexing flow (flow.py): an upload is checked and
read, stored as `indexing`, then indexed in the background by the flow; every change of its state is
told to the conversation's sockets (on every replica). What retrieval needs (the embedding model, the
cache of vectors) lives here too, once per process.
"""

import asyncio
import contextlib
import io
import logging
import time
import unicodedata
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from pocketchat import protocol
from pocketchat.background import CLEANUP_SECONDS, cancel_and_wait
from pocketchat.errors import ProviderError
from pocketchat.flows import FlowFactory
from pocketchat.jobs import JobFailed, Jobs, OverBudget
from pocketchat.metrics import Metrics
from pocketchat.records import DocumentRecord
from pocketchat.settings import Settings
from pocketchat.store import NotIndexing, Store
from utils.embeddings import Embedder, EmbeddingProvider, LocalEmbedder, RemoteEmbedder
from utils.read_document import Page, UnreadableDocument, kind_of, read_document
from utils.retrieval import VectorCache

logger = logging.getLogger("pocketchat")
# With replicas: an indexing that gave no sign of life this long lost its replica. Its sign of life is
# written every LIVE_SECONDS whatever it waits on (a remote embedder silent up to --idle-limit, a job
# worker cutting a big file), so the cutoff does not grow with those waits.
STALE_SECONDS = 20.0
LIVE_SECONDS = 2.0
SWEEP_SECONDS = 3.0  # how often a replica looks for them: a dead replica's document fails 18-23 s on
REPORT_SECONDS = 0.5  # progress is told (and written) at most this often
# Why an indexing stops when one of its writes is refused (for the log).
NOT_INDEXING = "its write was refused: it is no longer indexing (removed, or marked failed by another replica)"
# What the user reads of an indexing that failed on the server's side (the database, a bug): the error
# itself is for the log. A job's or the provider's failure is said in its own words.
SERVER_FAILED = "Indexing failed because of an error on the server. Remove it and attach it again."
NAME_CHARACTERS = 200
JOINERS = "\u200c\u200d"  # format characters a name keeps: they join emoji and the letters of some scripts


class UploadRefused(Exception):
    """An upload (a document, an image) that is not taken: `status` is its HTTP status, `message` says why,
    for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_read(name: str, error: JobFailed) -> UploadRefused:
    """The refusal of an upload whose job did not finish: over its budget (the file's doing), or failed."""
    return UploadRefused(422 if isinstance(error, OverBudget) else 500, f"“{name}” could not be read: {error.message}")


def make_embedder(settings: Settings, provider: Any) -> Embedder:
    """The local model, or the provider's /v1/embeddings when --embedding-model names a model."""
    if settings.embedding_model is None:
        return LocalEmbedder()
    remote = getattr(provider, "remote", provider)  # the remote half of a provider with the embedded model
    if not hasattr(remote, "embeddings"):
        raise ValueError("--embedding-model needs an OpenAI-compatible provider (--base-url or an API key)")
    embedding_provider: EmbeddingProvider = remote
    return RemoteEmbedder(embedding_provider, settings.embedding_model)


def file_name(raw: str | None, default: str = "document.txt") -> str:
    """The name an upload is shown by: its last path part, without control or format characters (a
    right-to-left override would show `invoice\u202etxt.exe.md` as "invoicedm.exe.txt"), 200 characters at
    most, cut before its suffix (which says its kind)."""
    name = PurePosixPath((raw or "").replace("\\", "/")).name
    name = name.encode("utf-8", "replace").decode()
    name = "".join(char for char in name if char in JOINERS or unicodedata.category(char) not in ("Cc", "Cf")).strip()
    if len(name) > NAME_CHARACTERS:
        path = PurePosixPath(name)
        suffix = path.suffix if len(path.suffix) <= 20 else ""
        name = path.name[: len(path.name) - len(suffix)][: NAME_CHARACTERS - len(suffix)].rstrip() + suffix
    return name or default


class Library:
    """The documents of every conversation this process serves."""

    def __init__(
        self, settings: Settings, store: Store, provider: Any, metrics: Metrics, jobs: Jobs, indexing: FlowFactory
    ) -> None:
        self.settings = settings
        self.store = store
        self.indexing = indexing(settings)  # flow.py's create_indexing_flow: built once, run on copies
        self.jobs = jobs  # a file is read, and cut into passages, by the job workers
        self.metrics = metrics
        self.embedder = make_embedder(settings, provider)
        self.vectors = VectorCache(store)
        # Told each document frame: the app sends it to the conversation's sockets, here and elsewhere.
        self.tell: Callable[[str, dict[str, Any]], None] = lambda conversation_id, frame: None
        self._indexing: dict[str, tuple[str, asyncio.Task[None]]] = {}  # by document id: (conversation, task)
        self._uploads = asyncio.Lock()  # a user's limits are checked and taken one upload at a time
        self._sweeping: asyncio.Task[None] | None = None
        # The local model, in this process's memory: a provider's embeddings load nothing here.
        metrics.embedding_model_loaded.set_function(lambda: float(getattr(self.embedder, "loaded", False)))

    async def start(self) -> None:
        """Documents a stopped process left `indexing` are marked failed: one process alone, all of them
        at start; with replicas, those whose indexing stopped giving signs of life (another replica may be
        at it), at start and every SWEEP_SECONDS."""
        if not self.settings.clustered:
            await self._sweep(time.time())
            return
        await self._sweep(time.time() - STALE_SECONDS)
        self._sweeping = asyncio.create_task(self._sweep_now_and_then())

    async def _sweep_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self._sweep(time.time() - STALE_SECONDS)
            except Exception as error:  # the database is down: the next round tries again
                logger.warning("could not look for documents left indexing: %s", error)

    async def _sweep(self, stale_before: float) -> None:
        for document in await self.store.sweep_documents(stale_before):
            self.metrics.documents_failed.inc()
            self._told(document)
            logger.warning("document %s… was left indexing by a stopped process: marked failed", document.id[:6])

    async def add(
        self, conversation_id: str, owner: str, raw_name: str | None, file: BinaryIO, size: int
    ) -> DocumentRecord:
        """Check an upload, read its text, store it as `indexing` and index it in the background; or
        raise UploadRefused, having stored nothing."""
        name = file_name(raw_name)
        settings = self.settings
        try:
            kind_of(name)
        except UnreadableDocument as error:
            raise UploadRefused(415, str(error)) from None
        if size > settings.limit_document_bytes:
            raise UploadRefused(
                413, f"“{name}” is over the limit of {megabytes(settings.limit_document_bytes)} a file."
            )
        if size == 0:
            raise UploadRefused(422, f"“{name}” is empty.")
        await self.room(conversation_id, owner, size)  # before the file is read: reading costs
        data = await asyncio.to_thread(file.read)  # spooled to a temporary file as it came in
        try:
            pages = await self.jobs.run(owner, read_document, io.BytesIO(data), name)
        except UnreadableDocument as error:
            raise UploadRefused(422, f"“{name}”: {error}") from None
        except JobFailed as error:
            raise not_read(name, error) from None
        async with self._uploads:
            await self.room(conversation_id, owner, size)  # again: another upload may have come meanwhile
            document = DocumentRecord(conversation_id, owner, name, size, embedder=self.embedder.name)
            await self.store.add_document(document)
        self._told(document)
        self._indexing[document.id] = (conversation_id, asyncio.create_task(self._index(document, pages)))
        return document

    async def room(self, conversation_id: str, owner: str, size: int) -> int | None:
        """The bytes the user's documents may still take (None: no limit); UploadRefused if the conversation
        has its most documents, or `size` more would take the user's over their limit."""
        settings = self.settings
        count, used = await self.store.document_usage(conversation_id, owner)
        if settings.limit_documents_per_conversation and count >= settings.limit_documents_per_conversation:
            limit = settings.limit_documents_per_conversation
            raise UploadRefused(409, f"This conversation has {count} documents, the most it may have ({limit}).")
        if settings.limit_document_bytes_per_user and used + size > settings.limit_document_bytes_per_user:
            limit = megabytes(settings.limit_document_bytes_per_user)
            raise UploadRefused(
                409,
                f"Your documents would take more than your {limit}; remove some first ({megabytes(used)} now).",
            )
        return settings.limit_document_bytes_per_user - used if settings.limit_document_bytes_per_user else None

    async def _index(self, document: DocumentRecord, pages: list[Page]) -> None:
        """Run the indexing flow; whatever stops it, the document ends ready or failed, never half."""
        started = time.monotonic()
        shared = self.new_shared(document, pages)
        beating = asyncio.create_task(self._keep_alive(document))
        try:
            await self.indexing.run_async(shared)
        except asyncio.CancelledError:
            raise  # stopped (`stop`), or the process stops: the start of the next one marks it failed
        except NotIndexing:
            self.stop(document.id, NOT_INDEXING)
            return
        except Exception as error:
            logger.exception("document %s… failed to index", document.id[:6])
            document.status, document.error = "failed", failure_message(error)
            with contextlib.suppress(Exception):  # unwritten: the next start, or another replica, marks it failed
                if not await self.store.finish_document(document):
                    self.stop(document.id, NOT_INDEXING)
                    return
        finally:
            beating.cancel()
            self._indexing.pop(document.id, None)
        if document.status == "ready":
            self.metrics.documents_indexed.inc()
            self.metrics.document_chunks.inc(document.chunks)
        else:
            self.metrics.documents_failed.inc()
        self._told(document)
        logger.info(
            "document %s… conversation %s… status=%s chunks=%d duration_ms=%d",
            document.id[:6],
            document.conversation_id[:6],
            document.status,
            document.chunks,
            (time.monotonic() - started) * 1000,
        )

    async def _keep_alive(self, document: DocumentRecord) -> None:
        """The indexing's sign of life, every LIVE_SECONDS while it runs, whatever it waits on."""
        while True:
            await asyncio.sleep(LIVE_SECONDS)
            self._write_progress(document, tell=False)

    def new_shared(self, document: DocumentRecord, pages: list[Page]) -> dict[str, Any]:
        """The shared store the indexing flow runs on."""
        return {
            "settings": self.settings,  # Settings
            "store": self.store,  # Store: where StoreChunks writes
            "jobs": self.jobs,  # Jobs: the workers ChunkDocument cuts the text in
            "embedder": self.embedder,  # Embedder: the local model, or the provider's
            "document": document,  # DocumentRecord: its state, which the nodes move on
            "pages": pages,  # list[Page]: its text, read at upload
            "report": self._progress(document),  # Callable[[float], None]: how far it went, from 0 to 1
            "chunks": [],  # list[Chunk]: ChunkDocument's passages
            "vectors": None,  # np.ndarray: EmbedChunks' vectors, one row per passage
        }

    def _progress(self, document: DocumentRecord) -> Callable[[float], None]:
        """A level, not an event: told again (a retried batch), it says the same. Written (as the
        indexing's sign of life too), then told to the sockets, at most every REPORT_SECONDS."""
        last = 0.0

        def report(progress: float) -> None:
            nonlocal last
            document.progress = max(0.0, min(progress, 0.99))  # 1 is for ready
            now = time.monotonic()
            if now - last >= REPORT_SECONDS:
                last = now
                self._write_progress(document, tell=True)

        return report

    def _write_progress(self, document: DocumentRecord, tell: bool) -> None:
        """Write the indexing's progress; once it lands, tell the sockets (`tell`), or if it was refused (the
        document is no longer indexing), stop the indexing: no page is told it indexes again."""

        def written(write: asyncio.Future[bool]) -> None:
            if write.cancelled() or write.exception() is not None:
                return  # the database fails: the store logs it, and the next write tries again
            if not write.result():
                self.stop(document.id, NOT_INDEXING)
            elif tell and document.id in self._indexing:
                self._told(document)

        self.store.document_progress(document).add_done_callback(written)

    def _told(self, document: DocumentRecord) -> None:
        self.tell(document.conversation_id, protocol.document(document.conversation_id, document.to_wire()))

    def stop(self, document_id: str, why: str) -> None:
        """Stop indexing a document here, if it is, writing and telling nothing more of it."""
        if (indexing := self._indexing.pop(document_id, None)) is None:
            return
        if indexing[1] is not asyncio.current_task():  # (the indexing itself, refused, just returns)
            indexing[1].cancel()
        logger.info("document %s… no longer indexed here: %s", document_id[:6], why)

    def removed_elsewhere(self, conversation_id: str, document_id: str | None) -> None:
        """Another replica removed a document (None: deleted the conversation, and its documents with it)."""
        if document_id is None:
            self.forget_conversation(conversation_id, "its conversation was deleted on another replica")
        else:
            self.stop(document_id, "it was removed on another replica")

    async def remove(self, conversation_id: str, document_id: str) -> bool:
        """Delete a document of the conversation (its indexing stopped, its passages gone); whether it was there."""
        self.stop(document_id, "it was removed")
        removed = await self.store.delete_document(conversation_id, document_id)
        if removed:
            self.tell(conversation_id, protocol.document(conversation_id, {"id": document_id, "status": "removed"}))
        return removed

    def forget_conversation(self, conversation_id: str, why: str = "its conversation was deleted") -> None:
        """Stop indexing the documents of a deleted conversation (the database deleted them with it)."""
        for document_id, (of, _) in list(self._indexing.items()):
            if of == conversation_id:
                self.stop(document_id, why)

    async def aclose(self) -> None:
        tasks = [task for _, task in self._indexing.values()]
        if self._sweeping is not None:
            tasks.append(self._sweeping)
        await cancel_and_wait(tasks, patience=CLEANUP_SECONDS)
        self.embedder.close()


def failure_message(error: Exception) -> str:
    """What the user reads of an indexing that failed: a job's or the provider's words (a file too slow to
    cut, an embedder that said no); of anything else (the database's error, a bug), that the server failed."""
    if isinstance(error, JobFailed | ProviderError):
        return f"Indexing failed: {error.message}"
    return SERVER_FAILED


def megabytes(size: int) -> str:
    return f"{size / 1_000_000:g} MB"
