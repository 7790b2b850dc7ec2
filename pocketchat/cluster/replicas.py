"""Replicas: what lets any replica serve any conversation (`--redis-url`; the store is PostgreSQL then).

A turn runs on the replica whose socket started it: the producer. Its frames go to its own sockets
at once, and to the turn's Redis stream once per event-loop tick. Every other replica with sockets on
that conversation mirrors the stream into a local log, which its sockets follow exactly as they
follow a local turn: the same bytes, the same seqs, and a reconnect to any replica resumes.

    socket on A --message--> A claims the lease, runs the flow --chunk--> A's log --> A's sockets
        A's log --once per tick--> turn:<id> --XREAD--> B's mirror --> B's sockets
    socket on B --message--> B claims the lease? taken --> error turn_in_progress
    socket on B --stop--> events --XREAD--> A stops the turn
    A dies --> its lease expires --> B's watchdog ends the turn `interrupted` and stores the reply

One multiplexed reader per replica (`XREAD BLOCK` over the events stream and every mirrored turn,
`reader.py`) feeds everything; `LocalCoordinator` (`local.py`) is the same interface for one process,
where it all stays local.

`Replicas` is the coordinator: its lifecycle, the turns that run here, the events, the new
conversations. It owns what its parts share (the turns produced here, those running elsewhere, those
finishing) and hands it to them: `Mirrors` (turns that run elsewhere, followed here), `Reader`,
`Watchdog`, and the `Copier` of the produced logs.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Collection, Coroutine
from dataclasses import asdict
from typing import Any

from pocketchat import protocol
from pocketchat.background import Background
from pocketchat.cluster.counters import RedisCounters
from pocketchat.cluster.mirrors import Elsewhere, Mirrors
from pocketchat.cluster.produced_log import Copier, ProducedLog
from pocketchat.cluster.reader import Reader
from pocketchat.cluster.redis_link import (
    ENDED_STREAM_MS,
    LEASE_MS,
    REDIS_FAILURES,
    RENEW_SECONDS,
    TAKEN_OVER,
    Fenced,
    RedisLink,
)
from pocketchat.cluster.watchdog import Sight, Watchdog
from pocketchat.conversations import UNSTORED_KEEP_SECONDS, Conversation, Hub, Turn, TurnIds
from pocketchat.errors import TurnInProgress, Unavailable
from pocketchat.limits import Lease, Limits, Taken
from pocketchat.records import RECORD_FIELDS, ConversationRecord, new_id
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.turn_log import TurnLog

logger = logging.getLogger("pocketchat")

UNSTORED_KEEP = int(UNSTORED_KEEP_SECONDS)
DELETED_PER_EVENT = 500  # the ids a `deleted` event names at most
DELETE_MS = 30_000  # a deleted conversation's lease is held this long: no turn starts on it meanwhile
IMPORT_QUIET_SECONDS = 10.0  # an import that has told nothing for this long, its replica gone, has stopped
SWITCH_MS = 10_000  # at most, should the replica die while it switches (it lets go once its write lands)
LOST_REDIS = "PocketChat lost its connection to Redis, which links its replicas: {}. The reply so far is kept."

# A turn that runs here: (turn, conversation id, lease value).
Produced = tuple[Turn, str, str]


class Errands:
    """Work run without waiting for it (telling the other replicas, storing a reply taken over)."""

    def __init__(self) -> None:
        self._pending: set[asyncio.Task[None]] = set()

    def run(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` without waiting for it; kept referenced until done (the loop holds tasks weakly)."""
        task = asyncio.create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("replica work failed", exc_info=error)


class Replicas:
    """The coordinator of one replica among several, linked through Redis."""

    def __init__(self, settings: Settings, url: str, hub: Hub, store: Store) -> None:
        self.url = url
        self.link = RedisLink(url, settings.redis_prefix, replica=new_id()[:12])
        self.replica = self.link.replica
        self.counters = RedisCounters(self.link)
        self.limits = Limits(settings, self.counters)  # a user's limits hold across replicas
        self.hub = hub
        self._produced: dict[str, Produced] = {}  # by turn id
        self._copier = Copier(self.link, self._lost)
        # Turns running on other replicas, by turn id: watched, and followed here if a socket here wants them.
        self._elsewhere: dict[str, Elsewhere] = {}
        self._finishing: dict[str, asyncio.Future[None]] = {}  # by conversation: a turn copying its end
        self._claims: dict[str, tuple[str, str]] = {}  # turn id: (conversation, lease), until its log is made
        self._errands = Errands()
        self._mirrors = Mirrors(self.link, hub, self._produced, self._elsewhere, self._finishing, self._errands.run)
        sight = Sight()
        self._reader = Reader(self.link, self._mirrors, self._on_event, sight)
        self._watchdog = Watchdog(self.link, store, self._mirrors, self._elsewhere, sight, self._errands.run)
        self._tasks = Background()
        self.on_documents_removed: Callable[[str, str | None], None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self.link.start_heartbeat(self.url)
        try:
            await self._reader.from_now()
            await self._watchdog.find_running_turns()
        except REDIS_FAILURES as error:
            self._reader.failure = str(error)  # ready says so; the reader keeps trying
            logger.warning("Redis is unreachable at start-up: %s", error)
        self._tasks.keep("the Redis reader", self._reader.read)
        self._tasks.keep("the watchdog of turns running elsewhere", self._watchdog.watch)
        self._tasks.keep("the renewal of leases", self._renew)
        self._tasks.keep("the refresh of the limits' counts", self.counters.refresh_counts)

    async def aclose(self) -> None:
        await self._tasks.aclose()
        await self.link.aclose()

    @property
    def failure(self) -> str | None:
        """Why Redis cannot be reached now, as the reader found."""
        return self._reader.failure

    @property
    def on_lag(self) -> Callable[[float], None] | None:
        """Told how far behind the producer a read of a mirrored turn was."""
        return self._reader.on_lag

    @on_lag.setter
    def on_lag(self, observe: Callable[[float], None] | None) -> None:
        self._reader.on_lag = observe

    @property
    def stopped(self) -> str | None:
        """Which of this replica's background work ended, if any did (/healthz fails then)."""
        parts = [self._tasks.failure]
        if self._copier.stopped is not None:
            parts.append(f"copying to Redis stopped ({self._copier.stopped})")
        if self.link.heartbeat_stopped:
            parts.append("the heartbeat thread stopped")
        return "; ".join(part for part in parts if part) or None

    # ---- turns that run here -------------------------------------------------------------------

    def new_log(self, turn_id: str) -> TurnLog:
        conversation_id, lease = self._claims.pop(turn_id, ("", ""))  # the log is born holding its lease
        return ProducedLog(turn_id, conversation_id, lease, self._copier)

    async def claim(self, conversation: Conversation, ids: TurnIds, user: str) -> Taken:
        """Take the conversation's lease for a new turn, the one arbiter of a running turn cluster-wide,
        with the user's limits: one Redis call, the only one before the turn's provider request."""
        lease = Lease(self.link.lease(conversation.id), f"{ids.turn} {ids.reply} {self.link.replica}", LEASE_MS)
        if (finishing := self._finishing.get(conversation.id)) is not None:
            await asyncio.shield(finishing)  # the turn that just ended here still holds the lease
        try:
            taken = await self.limits.take_message(user, lease)
        except REDIS_FAILURES as error:
            raise Unavailable(
                f"PocketChat cannot start a reply now: Redis, which links its replicas, is unreachable ({error}). "
                "Try again in a moment."
            ) from None
        self._claims[ids.turn] = (conversation.id, lease.value)
        return taken

    async def release_claim(self, conversation: Conversation, taken: Taken) -> None:
        """The turn could not begin after all: its lease and its count go back before the client is
        told, so that a message sent at once after the error is not refused on their account."""
        assert taken.lease is not None
        self._claims.pop(taken.lease.value.partition(" ")[0], None)
        await asyncio.gather(self._release(conversation.id, taken.lease.value), self.limits.give_back(taken))

    async def _release(self, conversation_id: str, lease: str) -> None:
        with contextlib.suppress(*REDIS_FAILURES):
            await self.link.renew(conversation_id, lease, 0)

    async def started(self, conversation: Conversation, turn: Turn, lease: str) -> None:
        self._produced[turn.id] = (turn, conversation.id, lease)
        # Told without holding up the turn: a burst of turns waiting for this spread their provider
        # requests over a second and more, and the late ones waited behind the early ones' streams.
        self._errands.run(self._announce(conversation, turn))

    async def _announce(self, conversation: Conversation, turn: Turn) -> None:
        """Tell the other replicas of a turn that runs here."""
        event = {"kind": "turn", "conversation": conversation.id, "turn": turn.id, "reply": turn.reply.id}
        try:
            assert isinstance(turn.log, ProducedLog)
            await turn.log.copied()  # turn_start first: a replica told of the turn finds it in the stream
            await self.link.publish(event)
            # The conversation's last turn, for as long as its stream is kept: a replica that loads the
            # conversation once the turn has ended, before its final save lands, reads it there.
            last = f"{turn.id} {turn.reply.id}"
            await self.link.client.set(self.link.last_turn_key(conversation.id), last, px=ENDED_STREAM_MS)
        except REDIS_FAILURES as error:
            self._lost(turn.id, error)

    async def _renew(self) -> None:
        """Renew the leases of every turn running here, in one round trip (a round of the renewals)."""
        await asyncio.sleep(RENEW_SECONDS)
        produced = list(self._produced.items())
        if not produced:
            return
        try:
            held = await self.link.renew_all([(conversation, lease) for _, (_, conversation, lease) in produced])
        except REDIS_FAILURES as error:
            for turn_id, _ in produced:
                self._lost(turn_id, error)
            return
        for (turn_id, _), still in zip(produced, held, strict=True):
            if not still:
                self._lost(turn_id, Fenced("its lease was taken"))

    def _lost(self, turn_id: str, error: Exception) -> None:
        """Redis failed, or another replica ended this turn: stop it; run_turn records why."""
        if (produced := self._produced.get(turn_id)) is None:
            return
        turn = produced[0]
        turn.fenced = turn.fenced or isinstance(error, Fenced)  # its record is the other replica's to write
        if turn.failure is None:
            logger.warning("turn %s lost Redis: %s", turn_id, error)
            turn.failure = TAKEN_OVER if isinstance(error, Fenced) else LOST_REDIS.format(error)
        turn.stop.set()

    async def finished(self, conversation: Conversation, turn: Turn) -> None:
        """The turn's `turn_end` is in its log: copy the rest to Redis, letting the lease go with it.
        A socket here sees turn_end before that; a turn it starts meanwhile waits for it (`claim`)."""
        self._produced.pop(turn.id, None)
        log = turn.log
        assert isinstance(log, ProducedLog)
        finishing = self._finishing[conversation.id] = asyncio.ensure_future(log.finish())
        try:
            await finishing
        finally:
            if self._finishing.get(conversation.id) is finishing:
                del self._finishing[conversation.id]

    def stop(self, turn: Turn) -> None:
        if turn.id in self._produced:
            turn.stop.set()
        else:
            mirror = self._mirrors.get(turn.id)
            conversation_id = mirror.conversation.id if mirror is not None else ""
            self._errands.run(self._publish({"kind": "stop", "turn": turn.id, "conversation": conversation_id}))

    def stop_unseen(self, conversation: Conversation, turn_id: str) -> None:
        """A stop for a turn this replica has not heard of yet (its client saw turn_start from another
        replica first): passed on all the same, to whichever replica runs it, if one does."""
        self._errands.run(self._publish({"kind": "stop", "turn": turn_id, "conversation": conversation.id}))

    # ---- turns that run elsewhere (`mirrors.py`) -------------------------------------------------

    async def adopt(self, conversation: Conversation) -> None:
        """A conversation just loaded: if its turn runs on another replica, follow it from here."""
        await self._mirrors.adopt(conversation)

    # ---- conversation events -------------------------------------------------------------------

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        """Tell the other replicas of the fields changed here, and of those only: another field of this
        copy may be older than theirs."""
        fields = {name: getattr(conversation.record, name) for name in names}
        self._errands.run(self._publish({"kind": "changed", "conversation": conversation.id, **fields}))

    async def hold_for_switch(self, conversation_id: str) -> str | None:
        """Take the conversation's lease for the switch, as a turn does: a turn started on another replica
        before the switch's write lands would have its own write (the path: the latest) overwritten by it."""
        held = f"switching {new_id()} {self.link.replica}"
        if (finishing := self._finishing.get(conversation_id)) is not None:
            await asyncio.shield(finishing)  # the turn that just ended here still holds the lease
        try:
            taken = await self.link.client.set(self.link.lease(conversation_id), held, px=SWITCH_MS, nx=True)
        except REDIS_FAILURES as error:
            raise Unavailable(f"PocketChat cannot switch versions now: Redis is unreachable ({error}).") from None
        if not taken:
            raise TurnInProgress()
        return held

    async def let_go(self, conversation_id: str, held: str | None) -> None:
        if held is not None:
            await self._release(conversation_id, held)

    def switched(self, conversation_id: str, leaf_id: str | None, version: int) -> None:
        event = {"kind": "switched", "conversation": conversation_id, "leaf": leaf_id, "version": version}
        self._errands.run(self._publish(event))

    def pressed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        self._errands.run(self._publish({"kind": "pressed", "conversation": conversation_id, "frame": frame}))

    def documents_changed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        """Tell the other replicas' sockets on the conversation of a document's new state (`document` frame)."""
        self._errands.run(self._publish({"kind": "document", "conversation": conversation_id, "frame": frame}))

    async def deleting(self, conversation_id: str) -> None:
        """About to delete it: take its lease for a while, so that no replica starts a turn meanwhile
        (one that just started is fenced: it can append nothing more), and forget it as new."""
        try:
            await self.link.client.set(self.link.lease(conversation_id), f"deleting {self.link.replica}", px=DELETE_MS)
            await self.link.client.delete(self.link.new_conversation_key(conversation_id))
        except REDIS_FAILURES as error:
            raise Unavailable(f"PocketChat cannot delete it now: Redis is unreachable ({error}).") from None

    def deleted(self, conversation_ids: list[str]) -> None:
        # A failed import's thousands go a few hundred an event: not a task and a message each.
        for start in range(0, len(conversation_ids), DELETED_PER_EVENT):
            chunk = conversation_ids[start : start + DELETED_PER_EVENT]
            self._errands.run(self._publish({"kind": "deleted", "conversations": chunk}))

    async def _publish(self, event: dict[str, Any]) -> None:
        try:
            await self.link.publish(event)
        except REDIS_FAILURES as error:
            logger.warning("could not tell the other replicas (%s): %s", event["kind"], error)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("replica") == self.link.replica:
            return
        kind, conversation_id = event["kind"], event.get("conversation", "")
        live = self.hub.live(conversation_id)
        if kind == "turn":
            self._elsewhere[event["turn"]] = (conversation_id, event["reply"], event["replica"])
            if live is not None:
                live.stored = True  # the replica running the turn stored it
                self._errands.run(self._mirrors.follow(live, event["turn"], event["reply"]))
        elif kind == "stop" and (produced := self._produced.get(event["turn"])) is not None:
            # A stop names its conversation when a client's turn id came with it: a turn id alone
            # stops nothing in another user's conversation.
            if conversation_id in ("", produced[1]):
                produced[0].stop.set()
        elif kind == "changed" and live is not None:
            for name in RECORD_FIELDS:
                if name in event:
                    setattr(live.record, name, event[name])
            live.broadcast(protocol.conversation(live.record))
        elif kind == "document":
            if live is not None:
                live.stored = True  # the replica that took the upload stored it first
                live.tell_document(event["frame"])
            state = event["frame"]["document"]
            if state["status"] == "removed" and self.on_documents_removed is not None:
                self.on_documents_removed(conversation_id, state["id"])  # its indexing here stops
        elif kind == "pressed" and live is not None:
            live.keep_press(event["frame"])
        elif kind == "switched" and live is not None:
            self.hub.paths.told(live, event["leaf"], event.get("version"))
        elif kind == "deleted":
            # One id under "conversation" from a replica of the version before (a rolling upgrade).
            for deleted_id in event.get("conversations") or [conversation_id]:
                self.hub.gone(deleted_id)
                if self.on_documents_removed is not None:
                    self.on_documents_removed(deleted_id, None)

    # ---- imports (the database is their record: transfer/imports.py) ----------------------------

    async def replica_gone(self, replica: str, quiet_for: float) -> bool:
        # A heartbeat alone can be missing from a live replica for a moment (Redis restarted, say): an import
        # stopped once its replica's heartbeat is gone and it has written nothing for a while. (Were it
        # alive all the same, its next batch finds its import undone, and fails whole.)
        if replica == self.link.replica or quiet_for < IMPORT_QUIET_SECONDS:
            return False
        try:
            return not await self.link.alive(replica)
        except REDIS_FAILURES:
            return False  # not known: its import may still run

    # ---- new conversations (stored with their first turn) ---------------------------------------

    async def remember_new(self, record: ConversationRecord) -> None:
        # Without Redis, only this replica has it, as with every conversation then; and a new chat
        # does not wait on a Redis known to be down.
        if self.failure is not None:
            return
        with contextlib.suppress(*REDIS_FAILURES):
            key = self.link.new_conversation_key(record.id)
            # Without `importing` nor `path_version` (a new conversation's are False and 0): a replica of a
            # version before, which reads this as ConversationRecord(**...), knows no such field.
            left_out = ("importing", "path_version")
            kept = {name: value for name, value in asdict(record).items() if name not in left_out}
            await self.link.client.set(key, json.dumps(kept), ex=UNSTORED_KEEP)

    def refresh_new(self, record: ConversationRecord) -> None:
        self._errands.run(self.remember_new(record))

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        try:
            found = await self.link.client.get(self.link.new_conversation_key(conversation_id))
        except REDIS_FAILURES:
            return None
        return ConversationRecord(**json.loads(found)) if found is not None else None
