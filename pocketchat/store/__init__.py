"""What the app needs of its database, and the one that the settings pick.

Two stores keep the same records the same way: `SqliteStore` (one file, one process: the default)
and `PostgresStore` (`--database-url`, shared by replicas). Both queue writes in order on one writer
(`open_turn`, `update_conversation` and `checkpoint` return before the write lands; later writes land
after them), commit them in groups, and keep a write the database refuses until it lands.
"""

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from pocketchat.records import (
    RECORD_FIELDS,
    ConversationRecord,
    DocumentRecord,
    ImageRecord,
    Message,
    MessageHit,
    Passage,
    ShareRecord,
)
from pocketchat.search import SearchHit, SearchQuery
from pocketchat.settings import Settings
from pocketchat.store.memory import Fact, Memory
from pocketchat.store.transfer import ImportState, StoredImport
from pocketchat.transfer.tree import ConversationTree, TreeMessage


class Store(Protocol):
    failure: str | None  # why writes fail now (None: they do not)
    # Called on the event loop with a conversation whose kept writes have all landed at last.
    on_written: Callable[[str], None] | None
    timing: Callable[[float], None] | None  # told how long each group of writes took (for /metrics)

    async def open(self, sweep_streaming: bool = True) -> int:
        """Migrate, start the writer; with `sweep_streaming`, mark replies left streaming as interrupted."""

    async def close(self) -> None: ...

    def unwritten(self, conversation_id: str) -> bool:
        """Whether writes of this conversation wait for the database to recover."""

    def stalled_for(self) -> float:
        """How long the writes in flight have waited for the database (0: none are in flight)."""

    async def create_conversation(self, record: ConversationRecord) -> None: ...

    def update_conversation(
        self, record: ConversationRecord, fields: Collection[str] = RECORD_FIELDS
    ) -> asyncio.Future[Any]:
        """Write these fields of the record (of `RECORD_FIELDS`), and only these."""

    async def record_press(self, conversation_id: str, message_id: str, step: str, button: str) -> bool:
        """Keep that `button` of the reply's step `step` was pressed (`meta.presses`), unless one of its buttons
        was already (then False: a press is once)."""

    def name_conversation(self, record: ConversationRecord, replacing: str | None = None) -> asyncio.Future[Any]:
        """Write the record's title if the stored conversation has none yet (a turn naming it)."""

    async def delete_conversation(self, conversation_id: str) -> bool: ...

    async def list_conversations(self, owner: str) -> list[ConversationRecord]: ...

    async def load(self, conversation_id: str) -> tuple[ConversationRecord, list[Message]] | None: ...

    def open_turn(
        self,
        conversation_id: str,
        new: ConversationRecord | None,
        messages: list[Message],
        expected: int | None = None,
        landed: Callable[[bool], None] | None = None,
    ) -> asyncio.Future[None]:
        """Store `new`, if given, and the turn's `messages`; the path shown becomes the latest (`leaf_id`
        NULL) if the stored path version is `expected` (None: whatever it is), and the version the next.
        `landed` is told whether the path was written, once the write lands (pocketchat/paths.py)."""

    def choose_path(
        self, record: ConversationRecord, expected: int | None = None, landed: Callable[[bool], None] | None = None
    ) -> asyncio.Future[Any]:
        """Write the record's `leaf_id` (which versions the conversation shows), and nothing else of it, as
        `open_turn` writes its path: over path version `expected` only."""

    async def save_messages(self, conversation_id: str, messages: list[Message]) -> None: ...

    def checkpoint(self, conversation_id: str, message: Message) -> None: ...

    async def save_interrupted(
        self,
        conversation_id: str,
        message: Message,
        opening: tuple[ConversationRecord, Message] | None = None,
        landed: Callable[[bool | None], None] | None = None,
    ) -> None:
        """Store a reply whose replica died (its text and steps, status interrupted), unless it was stored
        since; with `opening`, its conversation and user message too, where they are not stored, and the
        path the latest over the record's path version (`landed` told whether it was written; None: the
        opening was stored already, nothing was)."""

    async def secret(self, name: str, make: Any) -> str:
        """The secret `name`, made by `make()` and kept the first time it is asked for."""

    async def set_secret(self, name: str, value: str) -> None: ...

    async def read_secret(self, name: str) -> str | None: ...

    async def create_session(self, session_id: str, user: str, lifetime: float) -> None: ...

    async def session_user(self, session_id: str) -> str | None: ...

    async def revoke_sessions(self, session_id: str | None = None) -> int: ...

    async def dead_sessions(self, session_ids: list[str]) -> set[str]: ...

    # Import and JSON export (`transfer/`): conversations whole, every branch of their messages.

    def claim_import(self, import_id: str, owner: str, replica: str) -> asyncio.Future[bool]:
        """List an import of the owner's as running on that replica (`running_imports`), until it is
        finished or undone, unless one of theirs is listed (then False: one import at a time, whichever
        replica each reaches)."""

    def import_read(self, import_id: str, total: int, dropped: dict[str, int]) -> asyncio.Future[None]:
        """The claimed import's file was read: how many conversations it holds, what was left out."""

    def release_import(self, import_id: str) -> asyncio.Future[None]:
        """The claimed import never began: no longer listed (written again until it lands)."""

    def import_conversations(
        self, owner: str, trees: list[ConversationTree], import_id: str, partial: bool = False
    ) -> asyncio.Future[None]:
        """Write these conversations (new ids) as the owner's, in one transaction, listed as the running
        import's (ImportStopped if it is not running any more); not written again if refused. `partial`:
        the first part of a long one, hidden (not listed, opened or found) until its last part is in."""

    def import_messages(
        self, conversation_id: str, messages: list[TreeMessage], import_id: str, last: bool, leaf_id: str | None
    ) -> asyncio.Future[None]:
        """More messages of a partial conversation, in a transaction of their own; with the `last`, the
        path it shows (`leaf_id`), and it is shown."""

    def finish_import(self, import_id: str) -> asyncio.Future[None]:
        """The import ended whole: no longer listed, kept as done (`ended_imports`, for KEEP_SECONDS)."""

    def undo_import(self, import_id: str, error: str) -> asyncio.Future[list[str]]:
        """Delete the conversations the unfinished import wrote, and stop it writing more (kept as failed,
        with `error`); their ids."""

    async def find_import(self, import_id: str) -> StoredImport | None:
        """The import by that id, running or ended (for KEEP_SECONDS): what any replica answers for it."""

    async def import_state(self, conversation_id: str) -> ImportState:
        """What became of a conversation an import wrote: still being written (it goes whole if the import
        fails), kept (the import ended), or gone (the import failed)."""

    async def running_imports(self) -> list[tuple[str, str, float]]:
        """Each unfinished import: its id, the replica writing it, when its last batch landed (time.time())."""

    async def conversation_tree(self, conversation_id: str, owner: str) -> ConversationTree | None: ...

    # Documents: written through the same queue, behind the conversation's other writes.

    def add_document(self, document: DocumentRecord) -> asyncio.Future[Any]: ...

    # A document's indexing writes only while it is `indexing` (each write checks, in its transaction):
    # each says whether it landed. One refused means another replica marked it failed, or it was removed.

    def document_progress(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Write how far its indexing went, and that it goes on (its `updated_at`)."""

    def add_chunks(
        self, document: DocumentRecord, rows: list[tuple[int, int | None, str, bytes]]
    ) -> asyncio.Future[bool]:
        """Store passages (seq, page, text, vector): all of them, or (refused) none."""

    def finish_document(self, document: DocumentRecord) -> asyncio.Future[bool]:
        """Mark it ready or failed (its passages deleted)."""

    def delete_document(self, conversation_id: str, document_id: str) -> asyncio.Future[bool]: ...

    def sweep_documents(self, stale_before: float) -> asyncio.Future[list[DocumentRecord]]:
        """Mark failed the documents left indexing with no sign of life since `stale_before`."""

    async def list_documents(self, conversation_id: str, owner: str) -> list[DocumentRecord]: ...

    async def document_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        """How many documents the conversation has, and how many bytes the owner's documents take."""

    async def document_vectors(self, document_id: str) -> tuple[list[int], list[bytes]]: ...

    async def search_passages(self, document_ids: list[str], terms: list[str], most: int) -> list[int]: ...

    async def passages(self, owner: str, ids: list[int]) -> list[Passage]: ...

    # Images: written through the same queue. `load` gives each user message its images.

    def add_image(self, image: ImageRecord, data: bytes) -> asyncio.Future[Any]: ...

    def attach_images(self, conversation_id: str, message_id: str, image_ids: list[str]) -> asyncio.Future[Any]:
        """Make these waiting images the message's (queued after the turn's opening write)."""

    def copy_images(self, conversation_id: str, message_id: str, copies: list[tuple[str, str]]) -> asyncio.Future[Any]:
        """Give the message a copy of each image `(original id, copy id)` (an edited message's new version)."""

    def delete_image(self, conversation_id: str, image_id: str) -> asyncio.Future[bool]:
        """Delete an image still waiting to be sent; whether there was one."""

    async def waiting_images(self, conversation_id: str, owner: str) -> list[ImageRecord]:
        """The images of the conversation waiting to go with its next message, oldest first."""

    async def image_usage(self, conversation_id: str, owner: str) -> tuple[int, int]:
        """How many images wait in the conversation, and how many bytes the owner's images take."""

    async def image(self, conversation_id: str, image_id: str, owner: str) -> tuple[ImageRecord, bytes] | None: ...

    async def image_data(self, owner: str, ids: list[str]) -> dict[str, tuple[str, bytes]]:
        """The type and bytes of these images, if `owner` owns them, by id."""

    async def search(self, owner: str, query: SearchQuery, limit: int) -> list[SearchHit]:
        """The owner's conversations that hold every word of the query, best first (pocketchat/search.py)."""

    async def search_messages(self, owner: str, terms: list[str], most: int, leave_out_turn: str) -> list[MessageHit]:
        """The owner's newest messages holding every term (by its stem, as `search` matches), but those of
        one turn."""

    # Share links: written through the same queue; a link is read from the database at every visit.

    def add_share(self, share: ShareRecord, token_hash: str, snapshot: str, most: int) -> asyncio.Future[bool]:
        """Store a link, unless its conversation has `most` already; whether it was stored."""

    def delete_share(self, conversation_id: str, share_id: str) -> asyncio.Future[bool]: ...

    async def list_shares(self, conversation_id: str, owner: str) -> list[ShareRecord]: ...

    async def shared(self, token_hash: str) -> tuple[str, float] | None:
        """The snapshot (JSON text) and creation time of the live link with this token hash."""

    # A user's memory (the memory flow): written through the same queue, every statement for its owner only.

    async def read_memory(self, owner: str, even_off: bool = False) -> Memory:
        """Whether the owner's memory is on, and then their facts, oldest first (off: none are read, unless
        `even_off`: the page lists them, to edit, export or forget)."""

    def add_facts(self, owner: str, facts: list[Fact], most: int) -> asyncio.Future[list[str]]:
        """Keep these facts of the owner's while their memory is on and holds fewer than `most`, as many as fit;
        the ids of those kept."""

    def change_fact(
        self, owner: str, fact_id: str, text: str, vector: bytes, embedder: str
    ) -> asyncio.Future[Fact | None]:
        """The owner's fact with a new text and vector, as stored; None if they have none by that id."""

    def delete_fact(self, owner: str, fact_id: str) -> asyncio.Future[bool]: ...

    def forget_facts(self, owner: str) -> asyncio.Future[int]:
        """Delete every fact of the owner's; how many there were."""

    def turn_memory(self, owner: str, on: bool) -> asyncio.Future[Any]:
        """Turn the owner's memory on or off (off: the memory flow neither reads nor keeps their facts)."""


class NotIndexing(Exception):
    """A write of a document's indexing was refused: the document is no longer `indexing` (another replica
    marked it failed, or it was removed). Its indexing stops, and writes and tells nothing more."""


TOMBSTONE_SECONDS = 24 * 3600  # how long a deleted conversation's id is remembered


SAVE_WAIT_SECONDS = 2.0  # a database whose writes have not answered for this long does not answer
SAVE_PATIENCE_SECONDS = 30.0  # the longest a turn's end waits for its reply's save, however busy


async def save_reply(store: Store, conversation_id: str, reply: Message) -> None:
    """Save a turn's reply, and wait for it while the database answers: a busy one (the writer seconds
    behind, every group of writes landing) is waited for, up to SAVE_PATIENCE_SECONDS; one whose writes
    have not answered for SAVE_WAIT_SECONDS does not hold up the turn's end (TimeoutError; the queued
    write lands later). A refusal raises StorageError."""
    saving = asyncio.ensure_future(store.save_messages(conversation_id, [reply]))  # never cancelled from here
    saving.add_done_callback(lambda done: done.cancelled() or done.exception())  # the store logs a failure
    give_up = time.monotonic() + SAVE_PATIENCE_SECONDS
    while not (await asyncio.wait({saving}, timeout=SAVE_WAIT_SECONDS))[0]:
        if store.stalled_for() >= SAVE_WAIT_SECONDS or time.monotonic() > give_up:
            raise TimeoutError
    saving.result()


def make_store(settings: Settings) -> Store:
    """PostgreSQL when --database-url names one, else the SQLite file at --db-path."""
    if settings.database_url is not None:
        # Imported here: who keeps to SQLite never imports asyncpg.
        from pocketchat.store.postgres import PostgresStore

        return PostgresStore(settings.database_url.get_secret_value())
    from pocketchat.store.sqlite import SqliteStore

    return SqliteStore(settings.db_path)
