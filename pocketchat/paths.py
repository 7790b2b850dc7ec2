"""The path a conversation shows (`leaf_id`), as every replica and the database agree on it.

A path is written by a switch and by a turn's opening write (the turn's path: the latest), with replicas
by whichever replica holds the conversation's lease then. Those writes are queued, so they can land late
(behind a stalled database, once the lease was let go), and a replica's copy can be behind what is
stored (its page switched before it had read a turn another replica just ended). So every write of the
path says which version it replaces: the copy's `ConversationRecord.path_version`, stored with
`leaf_id`. The store writes the path only over that version, and bumps it (`WHERE path_version =
$expected`); a write that would replace a version it did not know is refused, not applied. Then:

- while the refused write's operation still holds the lease (a switch waiting for its write, a turn
  running), its replica reloads the conversation and writes the path again over what is stored (a
  switch is chosen again, on the fresh copy: the path through the message its page asked for);
- else its replica reloads and tells its pages the stored path (a `path` frame).

A switch that lands is told to the other replicas (the `switched` event, with its version), which show
it unless their copy knows a later version. A turn's opening write is not told (a turn's path reaches
every copy with the turn): a copy that did not see it has an older version, and its next switch is
refused once, then written again over the stored one.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pocketchat.errors import ProtocolError
from pocketchat.records import ConversationRecord

if TYPE_CHECKING:
    from pocketchat.conversations import Conversation, Hub

logger = logging.getLogger(__name__)

WRITES = 3  # a path chosen again on a fresh copy is written at most this many times in all


@dataclass
class Again:
    """How an operation that holds the conversation's lease writes its path again after a refusal."""

    holds: Callable[[], bool]  # whether it still holds the lease (else what is stored is told instead)
    choose: Callable[[], None] = lambda: None  # choose the path again on the fresh copy (a ProtocolError: it cannot)


@dataclass
class PathWrite:
    """A queued write of the path a copy shows: the version it replaces, what the store tells once it
    lands (`landed`: whether the path was written), and `done`, which says whether the path stored is
    the one chosen (after writing it again, perhaps), or fails with the store's refusal (the write is
    kept and lands later)."""

    expected: int
    landed: Callable[[bool], None]
    done: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def watch(self, stored: asyncio.Future[Any]) -> None:
        """The store's future of the write: a refusal of it now (it is kept, and lands later) ends `done`."""
        stored.add_done_callback(lambda write: write.cancelled() or _settle(self.done, write.exception()))


def _settle(done: asyncio.Future[bool], outcome: bool | BaseException | None) -> None:
    if done.done() or outcome is None:
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
        done.exception()  # a waiter that gave up need not hear of it again
    else:
        done.set_result(outcome)


class Paths:
    """The hub's writes of the paths its conversations show, and what it does when one is refused."""

    def __init__(self, hub: "Hub") -> None:
        self.hub = hub
        self._work: set[asyncio.Task[None]] = set()

    def begin(
        self,
        conversation: "Conversation",
        again: Again | None = None,
        tell: bool = True,
        writes: int = WRITES,
        done: "asyncio.Future[bool] | None" = None,
    ) -> PathWrite:
        """A write of the path the copy shows now, over the version it knows: the copy is then at the next.
        `tell`: told to the other replicas once it lands; `writes`: how many times it may be written in all,
        chosen again after a refusal (`again`); `done`: the first write's, when this one writes it again."""
        record = conversation.record
        expected, leaf_id = record.path_version, record.leaf_id
        record.path_version = version = expected + 1
        conversation.writing_paths.add(version)

        def landed(written: bool) -> None:
            conversation.writing_paths.discard(version)
            if written:
                if tell:
                    self.hub.coordinator.switched(conversation.id, leaf_id, version)
                _settle(write.done, True)
            else:
                self._run(self._refused(conversation, again, writes - 1, write.done))

        write = PathWrite(expected, landed) if done is None else PathWrite(expected, landed, done)
        return write

    def choose(self, conversation: "Conversation", again: Again | None = None, **begin: Any) -> PathWrite:
        """Queue the write of the path the copy shows (a switch's, or a turn's written again)."""
        write = self.begin(conversation, again, **begin)
        write.watch(self.hub.store.choose_path(conversation.record, write.expected, write.landed))
        return write

    def told(self, conversation: "Conversation", leaf_id: str | None, version: int | None) -> None:
        """Another replica stored this path (`version`: None from a replica of the version before, which
        sends none). Shown unless this copy knows a later version; a version this copy is writing too
        was stored first by the other replica (this copy's write will be refused)."""
        record = conversation.record
        if version is not None:
            if version <= record.path_version and version not in conversation.writing_paths:
                return
            record.path_version = version
        if conversation.turn is not None:
            return  # a turn runs: it shows its own path (its write is refused, if it comes after)
        if leaf_id is not None and conversation.tree.get(leaf_id) is None:
            self.refused(conversation)  # a message this copy has not read yet: what is stored is told
            return
        conversation.show(leaf_id)
        conversation.broadcast_text(conversation.path_frame())

    def refused(self, conversation: "Conversation") -> None:
        """Reload the conversation, and tell its pages the stored path (a write made for this copy was
        refused, and nothing holds the lease for it)."""
        self._run(self._refused(conversation, None, 0, None))

    async def _refused(
        self, conversation: "Conversation", again: Again | None, writes: int, done: "asyncio.Future[bool] | None"
    ) -> None:
        """A write of the copy's path was refused: read the conversation again, then choose the path again
        and write it over the stored version while `again` holds the lease, else show the stored path."""
        stored = await self._reload(conversation)
        chosen_again = stored is not None and again is not None and writes > 0 and again.holds()
        if stored is not None:
            told = "its path is chosen again" if chosen_again else "its pages are told the stored path"
            logger.info(
                "conversation %s…: read again at path version %d: %s", conversation.id[:6], stored.path_version, told
            )
        if chosen_again and again is not None:
            try:
                again.choose()
            except ProtocolError as error:  # the message is gone, a turn came in: what is stored stands
                logger.info("conversation %s…: its path cannot be chosen again: %s", conversation.id[:6], error)
            else:
                self.choose(conversation, again, writes=writes, done=done)
                return
        if stored is not None and conversation.turn is None:
            conversation.show(stored.leaf_id)
            conversation.broadcast_text(conversation.path_frame())
        if done is not None:
            _settle(done, False)

    async def _reload(self, conversation: "Conversation") -> ConversationRecord | None:
        """Read the conversation again: the messages this copy lacks join its tree, and its version is the
        stored one. The stored record, or None if it is gone (or no longer the copy in memory)."""
        try:
            loaded = await self.hub.store.load(conversation.id)
        except Exception as error:  # the database refused the read: this copy shows what it had
            logger.warning("conversation %s…: could not read its stored path: %s", conversation.id[:6], error)
            return None
        if loaded is None or self.hub.live(conversation.id) is not conversation:
            return None
        record, messages = loaded
        for message in messages:
            if conversation.tree.get(message.id) is None:
                if message.status == "streaming":  # a turn not followed here: marked as a load marks it
                    message.status = "interrupted"  # (following the turn puts it right)
                conversation.tree.add(message)
        conversation.record.path_version = record.path_version
        return record

    def _run(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` without waiting for it; kept referenced until done (the loop holds tasks weakly)."""
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: "asyncio.Task[None]") -> None:
        self._work.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("a refused path write was not dealt with", exc_info=error)
