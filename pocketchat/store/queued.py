"""The writes of the Store API, once for both stores: what each write is queued as (which conversation
it holds up if refused, whether it is written again after a refusal, when it is stamped) and what its
caller waits for. A store supplies only the statements, in its own SQL, as work for its write
connection (`_insert`, `_save`, ...); its reads are its own.
"""

import asyncio
import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pocketchat.hashes import session_hash
from pocketchat.records import RECORD_FIELDS, ConversationRecord, Message
from pocketchat.store.writes import D, Job, WriteQueue

Work = Callable[[Any], Any]  # what the write connection runs for one job (a coroutine function on PostgreSQL)
Row = tuple[Any, ...]  # a message as both stores write it (`Message.to_row`)
Landed = Callable[[Any], None]  # told what a write gave once it lands (also after its caller was told it failed)


@dataclass(frozen=True)
class ChosenPath:
    """A write of the path a conversation shows: its last message (None: the latest), over which stored
    path version (pocketchat/paths.py; None: over any, for a write no replica makes)."""

    leaf_id: str | None
    expected: int | None


def merged_meta(stored: str | None, message: Message) -> str | None:
    """The meta to store for a reply taken over: as stored (its model, its usage so far), with what the
    taken-over reply knows over it (its steps, as its stream had them); None: leave it as it is."""
    return None if stored is None else json.dumps(json.loads(stored) | message.meta)


def _rows(conversation_id: str, messages: list[Message]) -> list[Row]:
    # Taken now, as queued: a reply goes on changing after its checkpoint is queued.
    return [message.to_row(conversation_id) for message in messages]


class QueuedStore(WriteQueue[D]):
    """A store's writes, queued in order on its one writer (see `WriteQueue`)."""

    # ---- conversations and messages --------------------------------------------------------------

    async def create_conversation(self, record: ConversationRecord) -> None:
        await self._write(self._insert(record), record.id)

    def update_conversation(
        self, record: ConversationRecord, fields: Collection[str] = RECORD_FIELDS
    ) -> asyncio.Future[Any]:
        """Write these fields of the record (of `RECORD_FIELDS`), and only these."""
        record.updated_at = time.time()
        names = [name for name in RECORD_FIELDS if name in fields]  # named here, never by the caller
        return self._write(self._update(record, names), record.id)

    async def record_press(self, conversation_id: str, message_id: str, step: str, button: str) -> bool:
        return await self._write(self._press(conversation_id, message_id, step, button), conversation_id, retry=False)

    def _press(self, conversation_id: str, message_id: str, step: str, button: str) -> Work:
        """Add `step: button` to the message's `meta.presses` if `step` is not there yet; whether it was added."""
        raise NotImplementedError

    def name_conversation(self, record: ConversationRecord, replacing: str | None = None) -> asyncio.Future[Any]:
        """Write the record's title if the stored one is still `replacing` (none, for the first: a turn naming
        the conversation; its first message's start, for the model's title after it): a rename meanwhile, on
        any replica, wins."""
        record.updated_at = time.time()
        return self._write(self._name(record, replacing), record.id)

    async def delete_conversation(self, conversation_id: str) -> bool:
        # Not written again later: the caller tells the user it failed, and the conversation stays.
        return await self._write(self._delete(conversation_id), conversation_id, retry=False)

    def open_turn(
        self,
        conversation_id: str,
        new: ConversationRecord | None,
        messages: list[Message],
        expected: int | None = None,
        landed: Landed | None = None,
    ) -> asyncio.Future[None]:
        """Queue, at once, what a turn starts with: the conversation if it is `new`, its messages saved, and
        the path shown the latest (the turn's), over path version `expected` only (None: over any, as a
        test writes). `landed` is told whether the path was written, once the write lands. Later writes
        land after it, so the turn need not wait for it."""
        work = self._save(conversation_id, _rows(conversation_id, messages), new, ChosenPath(None, expected))
        return self._write(work, conversation_id, landed=landed)

    async def save_messages(self, conversation_id: str, messages: list[Message]) -> None:
        """Insert or update these messages, in order, in one transaction."""
        work = self._save(conversation_id, _rows(conversation_id, messages), None, None)
        await self._write(work, conversation_id)

    def checkpoint(self, conversation_id: str, message: Message) -> None:
        """Queue a save of a reply in progress without waiting for it (a crash then loses little)."""
        work = self._save(conversation_id, _rows(conversation_id, [message]), None, None)
        self._queue(Job(work, None, conversation_id))

    def choose_path(
        self, record: ConversationRecord, expected: int | None = None, landed: Landed | None = None
    ) -> asyncio.Future[Any]:
        """Write which path the conversation shows (`leaf_id`), and nothing else of it, over path version
        `expected` only (None: over any); `landed` is told whether it was written, once it lands."""
        return self._write(self._choose(record.id, ChosenPath(record.leaf_id, expected)), record.id, landed=landed)

    async def save_interrupted(
        self,
        conversation_id: str,
        message: Message,
        opening: tuple[ConversationRecord, Message] | None = None,
        landed: Landed | None = None,
    ) -> None:
        """Store a reply whose replica died as interrupted, unless its replica stored it since. With
        `opening` (its conversation and user message, as another replica followed the turn), what the
        turn's own opening write held is stored too, where it never landed: the path the latest over the
        record's path version only, `landed` told whether it was written (None: no opening was written)."""
        if opening is None:
            await self._write(self._interrupt(message), conversation_id)
            return
        record, user_message = opening
        rows = _rows(conversation_id, [user_message, message])
        work = self._interrupt_or_open(conversation_id, message, rows, record)
        await self._write(work, conversation_id, landed=landed)

    # ---- sign-in: never written again after a refusal (its caller answers the user now) -----------

    async def secret(self, name: str, make: Callable[[], str]) -> str:
        """The secret `name`, made by `make()` and kept the first time it is asked for."""
        return await self._write(self._keep_secret(name, make()), None, retry=False)

    async def set_secret(self, name: str, value: str) -> None:
        """Replace the secret `name` (or keep it, the first time)."""
        await self._write(self._replace_secret(name, value), None, retry=False)

    async def create_session(self, session_id: str, user: str, lifetime: float) -> None:
        now = time.time()
        await self._write(self._add_session((session_hash(session_id), user, now, now + lifetime)), None, retry=False)

    async def revoke_sessions(self, session_id: str | None = None) -> int:
        """Revoke one session, or every one; how many were live."""
        id_hash = session_hash(session_id) if session_id else None
        return await self._write(self._revoke(id_hash), None, retry=False)

    # ---- the statements, in the store's SQL ------------------------------------------------------

    def _insert(self, record: ConversationRecord) -> Work:
        """Store a new conversation, unless it is stored already or was deleted (replicas race)."""
        raise NotImplementedError

    def _update(self, record: ConversationRecord, names: list[str]) -> Work:
        """Write `updated_at` and the fields `names` of the record."""
        raise NotImplementedError

    def _name(self, record: ConversationRecord, replacing: str | None) -> Work:
        """Write the title and `updated_at` if the stored title is still `replacing` (NULL for None)."""
        raise NotImplementedError

    def _delete(self, conversation_id: str) -> Work:
        """Delete the conversation (its messages with it) and remember its id; give whether it was there."""
        raise NotImplementedError

    def _save(
        self, conversation_id: str, rows: list[Row], new: ConversationRecord | None, path: ChosenPath | None
    ) -> Work:
        """Store `new` (as `_insert`), write the messages' rows (a final reply is never written over), and
        touch the conversation's `updated_at`; with `path` (a turn's opening), write it as `_choose` does,
        and give whether it was written."""
        raise NotImplementedError

    def _choose(self, conversation_id: str, path: ChosenPath) -> Work:
        """Write the conversation's `leaf_id` and the next path version, if the stored version is the one
        the path expects (or it expects none); give whether it was written."""
        raise NotImplementedError

    def _interrupt(self, message: Message) -> Work:
        """Write the message's text, reasoning and error with the status interrupted, if it still streams,
        and its meta's keys over the stored meta's (`merged_meta`)."""
        raise NotImplementedError

    def _interrupt_or_open(
        self, conversation_id: str, message: Message, rows: list[Row], record: ConversationRecord
    ) -> Work:
        """`_interrupt` if the reply's row is there (giving None); else `_save` the turn's `rows` as its
        opening would, over the record's path version (giving whether the path was written)."""
        raise NotImplementedError

    def _keep_secret(self, name: str, value: str) -> Work:
        """Store the secret unless one of that name is stored; give the one stored."""
        raise NotImplementedError

    def _replace_secret(self, name: str, value: str) -> Work:
        raise NotImplementedError

    def _add_session(self, row: tuple[str, str, float, float]) -> Work:
        """Store a session: (id hash, user, created at, expires at)."""
        raise NotImplementedError

    def _revoke(self, id_hash: str | None) -> Work:
        """Revoke the session of this id hash (every one, for None) that is not revoked yet; give how many."""
        raise NotImplementedError
