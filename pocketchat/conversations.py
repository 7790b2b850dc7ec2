"""The live conversations of this process: their history, the sockets attached, the running turn.

A turn belongs to its conversation, not to the socket that started it: it runs to its end when
every socket has gone. A conversation stays in memory while a socket is attached, a turn runs, an
HTTP request uses it or its writes wait for the database: one copy, whoever asks. A new conversation
(not stored until its first turn or change) is kept for UNSTORED_KEEP_SECONDS after its last socket
leaves, so that a page that lost its connection can come back to it.
"""

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pocketchat import errors, protocol
from pocketchat.errors import ImportUnderWay, NothingToRegenerate, TurnInProgress, UnknownConversation
from pocketchat.paths import Again, Paths
from pocketchat.records import ConversationRecord, ImageRecord, Message, new_id, possible_id
from pocketchat.store import Store
from pocketchat.turn_log import InProcessTurnLog, TurnLog
from pocketchat.versions import Tree
from utils.llm_stream import StopSignal

if TYPE_CHECKING:
    from pocketchat.tools.client import ClientTools

UNKNOWN = "No conversation has that id; it may have been deleted."
UNSTORED_KEEP_SECONDS = 600.0
MAX_UNSTORED = 10_000  # new conversations kept without a socket; the oldest are let go first
DOCUMENTS_RECHECK_SECONDS = 30.0  # see Conversation.knows_no_documents
DOCUMENT_STAGES = {"indexing": 0, "ready": 1, "failed": 1, "removed": 2}  # a document's state only moves on


class Subscriber(Protocol):
    """A socket attached to a conversation. Neither method waits for the socket: each queues."""

    def follow(self, log: TurnLog, after_seq: int) -> None:
        """Send the log's frames after chunk `after_seq`, once whatever this subscriber is sending is sent."""

    def send(self, frame: dict[str, Any]) -> None: ...

    def send_text(self, text: str) -> None:
        """`send`, for a frame encoded already."""

    def detach(self) -> None:
        """Leave the conversation."""


@dataclass(frozen=True)
class TurnIds:
    """A turn's id and its reply's, made before the turn begins (a replica claims the turn by them)."""

    turn: str = field(default_factory=new_id)
    reply: str = field(default_factory=new_id)


@dataclass
class Turn:
    user_message: Message
    reply: Message
    log: TurnLog
    # What started it: a new message; a regenerate (a new version of the reply to a stored message); an
    # edit (a new version of a message, with copies of its images).
    kind: Literal["message", "regenerate", "edit"] = "message"
    id: str = field(default_factory=new_id)
    stop: StopSignal = field(default_factory=StopSignal)
    started_at: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    failure: str | None = None  # why the turn could not go on (Redis lost, with replicas)
    # With replicas: another replica ended this turn (this one looked dead), and stored it as its
    # sockets saw it; the turn's record is no longer this replica's to write.
    fenced: bool = False
    error_kind: str | None = None  # what failed the provider, if it failed (for /metrics)
    client_tools: "ClientTools | None" = None  # of the socket that started it: the tools its client declared
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when it has ended, here or elsewhere
    image_copies: list[tuple[str, str]] = field(default_factory=list)  # an edit's: (original id, copy id)
    awaiting: dict[str, asyncio.Future[str]] = field(default_factory=dict)  # presses its nodes wait for, by step

    def sync_reply(self) -> Message:
        """Bring the reply up to the text, reasoning and steps its log holds now (it changes the reply), and
        give it."""
        snapshot = self.log.snapshot()
        self.reply.content, self.reply.reasoning = snapshot["content"], snapshot["reasoning"]
        if snapshot["steps"]:
            self.reply.meta["steps"] = snapshot["steps"]
        return self.reply

    def reply_taken_over(self) -> Message:
        """The reply of a fenced turn, as the replica that took it over stored it: what reached the
        shared log, interrupted."""
        reply = self.sync_reply()
        reply.status, reply.error = "interrupted", self.failure
        return reply


class Conversation:
    def __init__(
        self,
        record: ConversationRecord,
        messages: list[Message],
        stored: bool = True,
        new_log: Callable[[str], TurnLog] = InProcessTurnLog,
    ) -> None:
        self.record = record
        self.tree = Tree(messages)  # every message, every version
        # The path shown (to `record.leaf_id`): what `ready`, the prompt and the export read. While a
        # turn runs it ends with the turn's user message; its reply joins it at the end (`add_reply`).
        self.history = self.tree.path(record.leaf_id)
        self.new_log = new_log  # the log a turn gets: shared with other replicas or not
        # A new conversation is stored with its first turn or change, so that opening the page or
        # pressing New chat leaves no empty conversations behind.
        self.stored = stored
        self.subscribers: set[Subscriber] = set()
        self.turn: Turn | None = None
        self.borrowers = 0  # HTTP requests using it now
        self.deleting = False  # a DELETE is under way: no new turn, no new socket
        self.writing_paths: set[int] = set()  # the path versions this copy's queued writes would store
        self._encoded_history: tuple[list[tuple[Any, ...]], int, str] | None = None  # see `history_json`
        # When this process last knew the conversation to have no document ready, so that a turn
        # need not read its documents (README, Benchmarks): one not stored yet has none (an upload
        # stores it first). Any document frame, this replica's or another's, undoes it; and it is
        # trusted for DOCUMENTS_RECHECK_SECONDS only, in case another replica's frame was lost.
        self._without_documents_at = None if stored else time.monotonic()
        self.documents_told = 0  # document frames seen: a look begun before one tells nothing
        self._document_stages: dict[str, int] = {}  # by document id: how far the frames told have taken it

    @property
    def id(self) -> str:
        return self.record.id

    def knows_no_documents(self) -> bool:
        """Whether a turn may skip reading the documents: none was ready a moment ago."""
        known = self._without_documents_at
        return known is not None and time.monotonic() - known < DOCUMENTS_RECHECK_SECONDS

    def found_no_documents(self, told_before: int) -> None:
        """A turn read the documents and none was ready; `told_before`: `documents_told` before the read."""
        if told_before == self.documents_told:
            self._without_documents_at = time.monotonic()

    def documents_changed(self) -> None:
        """A document of the conversation was added, indexed, failed or removed."""
        self.documents_told += 1
        self._without_documents_at = None

    def tell_document(self, frame: dict[str, Any]) -> None:
        """A `document` frame, this replica's or another's, to the sockets; unless it would take the document
        back (indexing after failed, anything after removed): the late word of a replica that was indexing
        a document another replica marked failed, or removed, can cross Redis after that replica's."""
        self.documents_changed()
        state = frame["document"]
        stage = DOCUMENT_STAGES.get(state["status"], 0)
        if stage < self._document_stages.get(state["id"], 0):
            return
        self._document_stages[state["id"]] = stage
        self.broadcast(frame)

    def ready_frame(self, provider: dict[str, Any]) -> tuple[str, TurnLog | None, int]:
        """The `ready` frame, encoded, and the log and seq to follow after, so that nothing is lost or
        repeated."""
        turn = self.turn
        running = {**turn.log.snapshot(resume=True), "message_id": turn.reply.id} if turn else None
        if turn is not None and running is not None:
            running |= self._versions(turn.reply)
        # The running turn's reply reaches the client as `running`, never also as history.
        history = self.history_json(turn.reply if turn else None)
        record = self.record
        text = protocol.ready_text(
            self.id,
            record.title,
            record.model,
            record.system_prompt,
            history,
            running,
            provider,
            record.tools_off,
            record.sampling,
            record.flow,
        )
        if turn is None or running is None:
            return text, None, 0
        return text, turn.log, running["seq"]

    def history_json(self, leave_out: Message | None = None) -> str:
        """The history as `ready` sends it, encoded once per change of it: a hello again for an unchanged
        conversation (a reconnect, a second tab, a client that says hello over and over) reuses the
        text rather than encoding megabytes again."""
        messages = [m for m in self.history if m is not leave_out]
        # What each message's wire form is made of. Messages have their fields replaced, never changed
        # in place (a reply's text and meta are set anew when it ends), so comparing by identity tells
        # whether any of them changed; a new list of the same messages is the same history.
        parts = [(m, m.id, m.role, m.content, m.status, m.reasoning, m.error, m.meta, m.images) for m in messages]
        cached = self._encoded_history
        # The tree's changes too: a new version of a message changes its `versions`.
        if (
            cached is not None
            and cached[1] == self.tree.changes
            and len(cached[0]) == len(parts)
            and all(map(_same, cached[0], parts))
        ):
            return cached[2]
        text = protocol.encode(self.wire_history(messages))
        self._encoded_history = (parts, self.tree.changes, text)
        return text

    def wire_history(self, messages: list[Message] | None = None) -> list[dict[str, Any]]:
        """The messages (by default the path shown) as `ready` sends them, each with its `versions`."""
        return [self.wire(message) for message in (self.history if messages is None else messages)]

    def wire(self, message: Message) -> dict[str, Any]:
        """A message as sent, with the ids of its versions when it has more than one."""
        return message.to_wire() | self._versions(message)

    def _versions(self, message: Message) -> dict[str, list[str]]:
        versions = self.tree.versions(message)
        return {"versions": versions} if len(versions) > 1 else {}

    def path_frame(self) -> str:
        """The `path` frame, encoded: the path shown, after a switch."""
        return protocol.path_text(self.id, self.history_json())

    def _begin(self, user_message: Message, kind: Literal["message", "regenerate", "edit"], ids: "TurnIds") -> Turn:
        if self.deleting:
            raise UnknownConversation("This conversation is being deleted.")
        if self.turn is not None:
            raise TurnInProgress()
        turn_id = ids.turn
        if kind != "regenerate":
            user_message.turn_id = turn_id  # a regenerate's was stored with the turn that first answered it
        reply = Message(
            role="assistant",
            content="",
            status="streaming",
            turn_id=turn_id,
            id=ids.reply,
            meta={"model": self.record.model},
            parent_id=user_message.id,
        )
        log = self.new_log(turn_id)
        turn = Turn(user_message=user_message, reply=reply, log=log, kind=kind, id=turn_id)
        self.tree.add(user_message)
        self.tree.add(reply)  # stored as the turn opens; shown in the history once it ends
        self.record.leaf_id = None  # the latest: this turn's reply (`Hub.open_turn` stores it so)
        self.history = self.tree.path(user_message.id)
        self.turn = turn
        reply_wire = {"id": reply.id, **self._versions(reply)}
        log.append(protocol.turn_start(turn_id, self.turn_start_message(user_message), reply_wire))
        for subscriber in self.subscribers:
            subscriber.follow(log, 0)
        return turn

    def turn_start_message(self, user_message: Message) -> dict[str, Any]:
        """The user message as `turn_start` carries it: with its parent, after which a client drops what it shows."""
        return {**self.wire(user_message), "parent_id": user_message.parent_id}

    def begin_message(
        self, content: str, images: list[ImageRecord] | None = None, ids: "TurnIds | None" = None
    ) -> Turn:
        """Start a turn for a new user message (with the images it carries, waiting in this conversation)."""
        parent = self.history[-1].id if self.history else None
        message = Message(role="user", content=content, images=images or [], parent_id=parent)
        return self._begin(message, "message", ids or TurnIds())

    def begin_regenerate(self, ids: "TurnIds | None" = None) -> Turn:
        """Start a turn that answers the last user message of the path again: a new version of its reply."""
        return self._begin(self.to_regenerate(), "regenerate", ids or TurnIds())

    def begin_edit(self, message_id: str, content: str, ids: "TurnIds | None" = None) -> Turn:
        """Start a turn for a new version of a user message, with new text and copies of its images."""
        original = self.to_edit(message_id)
        edited = Message(role="user", content=content, parent_id=original.parent_id)
        copies = [(image.id, new_id()) for image in original.images]
        edited.images = [
            dataclasses.replace(image, id=copy, message_id=edited.id)
            for image, (_, copy) in zip(original.images, copies, strict=True)
        ]
        turn = self._begin(edited, "edit", ids or TurnIds())
        turn.image_copies = copies
        return turn

    def to_regenerate(self) -> Message:
        """The user message a regenerate answers again: the path's last."""
        if self.turn is not None:
            raise TurnInProgress()
        last_user = next((m for m in reversed(self.history) if m.role == "user"), None)
        if last_user is None:
            raise NothingToRegenerate("This conversation has no message to answer again.")
        return last_user

    def to_edit(self, message_id: str) -> Message:
        """The user message an edit makes a new version of: any of the conversation's."""
        if self.turn is not None:
            raise TurnInProgress()
        if not any(m.role == "user" for m in self.tree):
            raise NothingToRegenerate("This conversation has no message to answer again.")
        message = self.tree.get(message_id)
        if message is None or message.role != "user":
            raise errors.BadFrame("This conversation has no message of yours with that id to edit.")
        return message

    def add_reply(self, reply: Message) -> None:
        """The turn's reply, ended: it joins the path shown."""
        self.tree.add(reply)
        if not self.history or self.history[-1] is not reply:
            self.history = self.tree.path(reply.id)

    def switch(self, message_id: str) -> None:
        """Show the path through the message: the one shown, if it goes through it; else the newest
        message that follows it."""
        if self.turn is not None:
            raise TurnInProgress()
        message = self.tree.get(message_id)
        if message is None:
            raise errors.BadFrame("This conversation has no message with that id.")
        if not any(shown is message for shown in self.history):
            self.show(self.tree.newest_under(message).id)

    def show(self, leaf_id: str | None) -> None:
        """Show the path to `leaf_id` (None: to the latest message)."""
        self.record.leaf_id = leaf_id
        self.history = self.tree.path(leaf_id)

    def follow_turn(self, turn: Turn, user_message: Message) -> None:
        """A turn that runs on another replica started: its user message (known, for a regenerate) joins
        the tree, the path goes through it, and the rows of the turn read from the database (its reply
        so far) give way to what the turn's log says."""
        self.tree.drop({m.id for m in self.tree if m.turn_id == turn.id and m.id != user_message.id})
        turn.user_message = self.tree.get(user_message.id) or user_message
        turn.reply.parent_id = turn.user_message.id
        self.tree.add(turn.user_message)
        self.tree.add(turn.reply)
        self.record.leaf_id = None
        self.history = self.tree.path(turn.user_message.id)
        self.turn = turn
        for subscriber in self.subscribers:
            subscriber.follow(turn.log, 0)

    def end(self, turn: Turn) -> None:
        turn.log.close()
        turn.done.set()
        if self.turn is turn:
            self.turn = None

    def keep_press(self, frame: dict[str, Any]) -> None:
        """A reply's button was pressed (a `pressed` frame, here or on another replica): kept, and told."""
        message = self.tree.get(frame["message_id"])
        if message is not None:
            presses = {**message.meta.get("presses", {}), frame["step"]: frame["button"]}
            message.meta = {**message.meta, "presses": presses}
        self.broadcast(frame)

    def broadcast(self, frame: dict[str, Any]) -> None:
        """Queue a frame for every attached socket; a slow socket holds up nobody."""
        self.broadcast_text(protocol.encode(frame))

    def broadcast_text(self, text: str) -> None:
        """`broadcast`, for a frame encoded already."""
        for subscriber in list(self.subscribers):
            subscriber.send_text(text)


def _same(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    return all(a is b for a, b in zip(old, new, strict=True))


class HubCoordinator(Protocol):
    """What the hub asks of the app's coordinator (`pocketchat/cluster/`, whose `Coordinator` is this and
    more): the log a turn gets, to follow a turn that runs elsewhere when it loads a conversation, and
    to find new conversations made on other replicas."""

    def new_log(self, turn_id: str) -> TurnLog: ...

    async def adopt(self, conversation: "Conversation") -> None: ...

    async def remember_new(self, record: ConversationRecord) -> None:
        """Keep a new conversation where other replicas find it (for UNSTORED_KEEP_SECONDS); returns
        once they can."""

    def refresh_new(self, record: ConversationRecord) -> None:
        """`remember_new` again, from now, not waited for."""

    async def find_new(self, conversation_id: str) -> ConversationRecord | None: ...

    def switched(self, conversation_id: str, leaf_id: str | None, version: int) -> None:
        """This path (`leaf_id`, at `version`) was stored from here: the other replicas show it."""


class NoOtherReplicas:
    """The hub's coordinator in one process (`pocketchat/cluster/local.py` is this and the rest of the
    coordinator): every turn's log is in memory here, and no conversation is anywhere else."""

    def new_log(self, turn_id: str) -> TurnLog:
        return InProcessTurnLog(turn_id)

    async def adopt(self, conversation: "Conversation") -> None:
        return None

    async def remember_new(self, record: ConversationRecord) -> None:
        return None

    def refresh_new(self, record: ConversationRecord) -> None:
        return None

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        return None

    def switched(self, conversation_id: str, leaf_id: str | None, version: int) -> None:
        return None


class Hub:
    """Finds a conversation in memory or loads it from the store, so that every socket shares one copy."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # A conversation kept in memory for its refused writes is let go once they land.
        store.on_written = self._written
        # Until the app gives it the app's coordinator (`AppState`), made after the hub: the replicas'
        # one needs the hub.
        self.coordinator: HubCoordinator = NoOtherReplicas()
        self.paths = Paths(self)  # the writes of the paths shown, refused when they land out of order
        self._live: dict[str, Conversation] = {}
        self._loading: dict[str, asyncio.Future[Conversation | None]] = {}
        # New conversations that no socket holds, with when they are let go, the soonest first.
        self._unstored: OrderedDict[str, float] = OrderedDict()

    @property
    def running_turns(self) -> list[Turn]:
        return [c.turn for c in self._live.values() if c.turn is not None]

    def _written(self, conversation_id: str) -> None:
        if (conversation := self._live.get(conversation_id)) is not None:
            self.release(conversation)

    def _new_log(self, turn_id: str) -> TurnLog:
        return self.coordinator.new_log(turn_id)  # the coordinator's now, whenever the conversation was made

    def live(self, conversation_id: str) -> Conversation | None:
        """The conversation if it is in memory now."""
        return self._live.get(conversation_id)

    @property
    def conversations(self) -> list[Conversation]:
        """The conversations in memory now."""
        return list(self._live.values())

    def create(self, owner: str, model: str, system_prompt: str) -> Conversation:
        """A new conversation, in memory until `ensure_stored`; only here until `share`."""
        record = ConversationRecord(model=model, system_prompt=system_prompt, owner=owner)
        conversation = Conversation(record, [], stored=False, new_log=self._new_log)
        self._live[conversation.id] = conversation
        self._let_go_of_old_unstored()
        return conversation

    async def share(self, conversation: Conversation) -> None:
        """Let the other replicas find a new conversation. Its id must not go out before: a page that
        has it may open it through any replica at once (a second tab, a reconnect)."""
        await self.coordinator.remember_new(conversation.record)

    def open_turn(self, conversation: Conversation, turn: Turn) -> asyncio.Future[Any]:
        """Queue the writes that start a turn (and store a new conversation with it); the last one's
        future (they land in order)."""
        new = None if conversation.stored else conversation.record
        conversation.stored = True
        user = turn.user_message
        # The path becomes the turn's over the version this copy knows; while the turn runs (it holds the
        # conversation's lease), a refused write is written again over the stored one (pocketchat/paths.py).
        path = self.paths.begin(conversation, Again(lambda: conversation.turn is turn and not turn.fenced), tell=False)
        # A regenerate's user message is stored already: its reply is a new version.
        messages = [turn.reply] if turn.kind == "regenerate" else [user, turn.reply]
        opened = self.store.open_turn(conversation.id, new, messages, path.expected, path.landed)
        # Queued right behind it (the queue keeps a conversation's writes in order).
        if turn.image_copies:
            return self.store.copy_images(conversation.id, user.id, turn.image_copies)
        if turn.kind == "message" and (images := [image.id for image in user.images]):
            # The images are the message's from then on, and no longer wait for the next one.
            return self.store.attach_images(conversation.id, user.id, images)
        return opened

    async def ensure_stored(self, conversation: Conversation) -> None:
        if not conversation.stored:
            # Marked first: the writer runs jobs in order, so later writes land after this insert.
            conversation.stored = True
            await self.store.create_conversation(conversation.record)

    async def open(self, conversation_id: str, owner: str) -> Conversation:
        """The conversation, if `owner` owns it. Anyone else is told exactly what they would be told
        for an id that does not exist: nothing says it exists."""
        if not possible_id(conversation_id):
            raise UnknownConversation(UNKNOWN)
        if (live := self._live.get(conversation_id)) is None:
            # Two sockets opening the same conversation at once must get the same object.
            if (loading := self._loading.get(conversation_id)) is None:
                loading = asyncio.ensure_future(self._load(conversation_id))
                self._loading[conversation_id] = loading
            loaded = await asyncio.shield(loading)
            # Another socket may have let it go while we waited; whoever holds it now shares this one.
            live = None if loaded is None else self._live.setdefault(conversation_id, loaded)
        if live is None or live.deleting or live.record.owner != owner:
            if live is not None:
                self.release(live)  # loaded for nobody: not kept
            raise UnknownConversation(UNKNOWN)
        return live

    async def _load(self, conversation_id: str) -> Conversation | None:
        try:
            loaded = await self.store.load(conversation_id)
            stored = loaded is not None
            if loaded is None:
                # Made on another replica and not stored yet (no message so far)?
                record = await self.coordinator.find_new(conversation_id)
                if record is None:
                    return None
                loaded = record, []  # its first turn may have started there, its rows not landed yet
            record, history = loaded
            conversation = Conversation(record, history, stored=stored, new_log=self._new_log)
            if not stored:
                # Made on another replica, which may have taken an upload while this one loaded it:
                # frames this replica could not take then. Its first turn here reads its documents.
                conversation.documents_changed()
            # Its turn may run on another replica, or have ended there since the store was read.
            await self.coordinator.adopt(conversation)
            running = conversation.turn.reply if conversation.turn is not None else None
            for message in conversation.tree:
                # Not running, here or elsewhere (a turn followed from another replica is): whatever cut
                # it short, it was interrupted.
                if message.status == "streaming" and message is not running:
                    message.status = "interrupted"
            return self._keep(conversation)
        finally:
            del self._loading[conversation_id]

    def _keep(self, conversation: Conversation) -> Conversation:
        self._live[conversation.id] = conversation
        return conversation

    @asynccontextmanager
    async def borrow(self, conversation_id: str, owner: str) -> AsyncIterator[Conversation]:
        """The conversation, kept in memory while the block runs (an HTTP request's), so that a socket
        opening it meanwhile gets this same copy rather than a second one loaded from the store."""
        conversation = await self.open(conversation_id, owner)
        conversation.borrowers += 1
        try:
            yield conversation
        finally:
            conversation.borrowers -= 1
            self.release(conversation)

    def release(self, conversation: Conversation) -> None:
        """Forget a conversation nobody is looking at and nothing is writing to (a new one, later)."""
        if self._live.get(conversation.id) is not conversation or not self._idle(conversation):
            return
        if conversation.stored or conversation.deleting:
            del self._live[conversation.id]
            return
        self._unstored[conversation.id] = time.monotonic() + UNSTORED_KEEP_SECONDS
        self._unstored.move_to_end(conversation.id)
        self.coordinator.refresh_new(conversation.record)  # ten minutes from now, there too
        self._let_go_of_old_unstored()

    def _idle(self, conversation: Conversation) -> bool:
        busy = conversation.subscribers or conversation.turn is not None or conversation.borrowers
        return not busy and not self.store.unwritten(conversation.id)

    def _let_go_of_old_unstored(self) -> None:
        now = time.monotonic()
        while self._unstored:
            conversation_id, until = next(iter(self._unstored.items()))
            if until > now and len(self._unstored) <= MAX_UNSTORED:
                return
            del self._unstored[conversation_id]
            conversation = self._live.get(conversation_id)
            if conversation is not None and not conversation.stored and self._idle(conversation):
                del self._live[conversation_id]

    def forget(self, conversation_id: str) -> None:
        self._live.pop(conversation_id, None)
        self._unstored.pop(conversation_id, None)

    def gone(self, conversation_id: str) -> None:
        """It was deleted (here, or by another replica, or with a failed import): its sockets here are
        told, and let go, and it is forgotten."""
        if (live := self._live.get(conversation_id)) is not None:
            live.deleting = True  # whoever still holds this copy (a hello that was loading it) cannot use it
            live.broadcast(protocol.deleted(conversation_id))
            for subscriber in list(live.subscribers):
                subscriber.detach()
        self.forget(conversation_id)

    async def check_changeable(self, conversation: Conversation) -> None:
        """ImportUnderWay if an import is still writing the conversation: a failed import deletes it whole,
        so a message, an upload or a setting of the user's there would go with it. Asked of the database
        only for a conversation loaded while its import ran, until that has ended."""
        if conversation.record.importing:
            state = await self.store.import_state(conversation.id)
            if state == "gone":  # the import failed, and this copy was not told (another replica's news lost)
                self.gone(conversation.id)
                raise UnknownConversation(UNKNOWN)
            if state == "importing":
                raise ImportUnderWay()
            conversation.record.importing = False
