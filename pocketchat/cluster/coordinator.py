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

One multiplexed reader per replica (`XREAD BLOCK` over the events stream and every mirrored turn)
feeds everything; `SingleProcess` is the same interface for one process, where it all stays local.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import asdict
from typing import Any

from pocketchat import protocol
from pocketchat.background import Background
from pocketchat.cluster.counters import RedisCounters
from pocketchat.cluster.redis_log import (
    ALIVE,
    ENDED_STREAM_MS,
    HEARTBEAT_MS,
    HEARTBEAT_SECONDS,
    LEASE_MS,
    REDIS_FAILURES,
    RENEW_SECONDS,
    TAKEN_OVER,
    VANISHED,
    Copier,
    Fenced,
    ProducedLog,
    RedisLink,
    takeover_frames,
)
from pocketchat.conversations import UNSTORED_KEEP_SECONDS, Conversation, Hub, Turn, TurnIds
from pocketchat.errors import StorageError, Unavailable
from pocketchat.limits import Lease, Limits, LocalCounters, Taken
from pocketchat.records import RECORD_FIELDS, ConversationRecord, Message, new_id
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.turn_log import InProcessTurnLog, TurnLog, parse_key

logger = logging.getLogger("pocketchat")

WATCH_SECONDS = 0.5  # how often leases of turns running elsewhere are checked
READ_BLOCK_MS = 100  # a newly mirrored stream joins the next read within this
READ_GATHER_SECONDS = 0.005  # a follower is this much later, and reads many entries per call
GAP_SECONDS = 1.0  # an answer from Redis later than this, or none for this long, is a gap in its sight
# A missing heartbeat says its replica is dead only once Redis has been in sight without a gap for this
# long: a live replica beats within it. After a stall (a frozen Redis expires every heartbeat at once
# when it wakes up) the heartbeats are set again within a beat, and the turns go on.
STEADY_SECONDS = HEARTBEAT_MS / 1000 + HEARTBEAT_SECONDS
UNSTORED_KEEP = int(UNSTORED_KEEP_SECONDS)
DELETE_MS = 30_000  # a deleted conversation's lease is held this long: no turn starts on it meanwhile
LOST_REDIS = "PocketChat lost its connection to Redis, which links its replicas: {}. The reply so far is kept."
LOST_LOG = "Redis, which links PocketChat's replicas, lost this reply's log (it restarted); the reply so far is kept."


class SingleProcess:
    """One process: every turn is local, and there is nobody to tell anything."""

    failure: str | None = None
    stopped: str | None = None

    def __init__(self, settings: Settings) -> None:
        self.limits = Limits(settings, LocalCounters())

    def new_log(self, turn_id: str) -> TurnLog:
        return InProcessTurnLog(turn_id)

    async def claim(self, conversation: Conversation, ids: TurnIds, user: str) -> Taken:
        # The user's limits only: the conversation itself refuses a second turn.
        return await self.limits.take_message(user)

    async def release_claim(self, conversation: Conversation, taken: Taken) -> None:
        await self.limits.give_back(taken)

    async def started(self, conversation: Conversation, turn: Turn, lease: str) -> None:
        return None

    async def finished(self, conversation: Conversation, turn: Turn) -> None:
        return None

    def stop(self, turn: Turn) -> None:
        turn.stop.set()

    def stop_unseen(self, conversation: Conversation, turn_id: str) -> None:
        return None  # every turn is here: one this process has not seen has ended, or never was

    async def adopt(self, conversation: Conversation) -> None:
        return None

    async def remember_new(self, record: ConversationRecord) -> None:
        return None

    def refresh_new(self, record: ConversationRecord) -> None:
        return None

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        return None

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        return None

    def documents_changed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        return None

    async def deleting(self, conversation_id: str) -> None:
        return None

    def deleted(self, conversation_id: str) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class Sight:
    """Since when this replica has seen Redis answer without a gap: the reader's blocking reads and the
    watchdog's checks both say when they were asked and answered."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._last = 0.0

    def answered(self, asked: float) -> None:
        now = time.monotonic()
        if self._since is None or now - asked > GAP_SECONDS or asked - self._last > GAP_SECONDS:
            self._since = now
        self._last = now

    def lost(self) -> None:
        self._since = None

    @property
    def steady(self) -> bool:
        return self._since is not None and time.monotonic() - self._since >= STEADY_SECONDS


class Mirror:
    """A turn that runs on another replica, followed here."""

    def __init__(self, conversation: Conversation, turn: Turn) -> None:
        self.conversation = conversation
        self.turn = turn
        self.last_id = "0-0"
        self.error: str | None = None
        self.ended = False


class Cluster:
    def __init__(self, settings: Settings, url: str, hub: Hub, store: Store) -> None:
        self.url = url
        self.link = RedisLink(url, settings.redis_prefix, replica=new_id()[:12])
        self.counters = RedisCounters(self.link)
        self.limits = Limits(settings, self.counters)  # a user's limits hold across replicas
        self.hub = hub
        self.store = store
        self.failure: str | None = None  # why Redis cannot be reached now
        self._produced: dict[str, tuple[Turn, str, str]] = {}  # turn id: (turn, conversation id, lease)
        self._copier = Copier(self.link, self._lost)
        self._mirrors: dict[str, Mirror] = {}
        # Turns running on other replicas: (conversation, reply, replica).
        self._elsewhere: dict[str, tuple[str, str, str]] = {}
        self._finishing: dict[str, asyncio.Future[None]] = {}  # by conversation: a turn copying its end
        self._claims: dict[str, tuple[str, str]] = {}  # turn id: (conversation, lease), until its log is made
        self._events_from = "0-0"
        self.on_lag: Callable[[float], None] | None = None  # told how far behind the producer a read was
        self._tasks = Background()
        self._sight = Sight()
        self._pending: set[asyncio.Task[None]] = set()

    # ---- lifecycle -----------------------------------------------------------------------------

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` without waiting for it; kept referenced until done (the loop holds tasks weakly)."""
        task = asyncio.create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("replica work failed", exc_info=error)

    async def start(self) -> None:
        self.link.start_heartbeat(self.url)
        try:
            self._events_from = await self.link.last_event_id()
            await self._find_running_turns()
        except REDIS_FAILURES as error:
            self.failure = str(error)  # ready says so; the reader keeps trying
            logger.warning("Redis is unreachable at start-up: %s", error)
        self._tasks.keep("the Redis reader", self._read)
        self._tasks.keep("the watchdog of turns running elsewhere", self._watch)
        self._tasks.keep("the renewal of leases", self._renew)
        self._tasks.keep("the refresh of the limits' counts", self.counters.refresh_counts)

    async def _find_running_turns(self) -> None:
        """Turns that started before this replica did: their leases say where they run."""
        lease_prefix = self.link.lease("")
        async for key in self.link.client.scan_iter(match=lease_prefix + "*", count=500):
            holder = await self.link.client.get(key)
            if holder is not None and not holder.startswith(b"deleting "):
                turn_id, reply_id, replica = holder.decode().split(" ", 2)
                self._elsewhere[turn_id] = (key.decode().removeprefix(lease_prefix), reply_id, replica)

    async def aclose(self) -> None:
        await self._tasks.aclose()
        await self.link.aclose()

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
        self._background(self._announce(conversation, turn))

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
            await self.link.client.set(self._last_key(conversation.id), last, px=ENDED_STREAM_MS)
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
            conversation_id = self._mirrors[turn.id].conversation.id if turn.id in self._mirrors else ""
            self._background(self._publish({"kind": "stop", "turn": turn.id, "conversation": conversation_id}))

    def stop_unseen(self, conversation: Conversation, turn_id: str) -> None:
        """A stop for a turn this replica has not heard of yet (its client saw turn_start from another
        replica first): passed on all the same, to whichever replica runs it, if one does."""
        self._background(self._publish({"kind": "stop", "turn": turn_id, "conversation": conversation.id}))

    # ---- conversation events -------------------------------------------------------------------

    def changed(self, conversation: Conversation, names: Collection[str]) -> None:
        """Tell the other replicas of the fields changed here, and of those only: another field of this
        copy may be older than theirs."""
        fields = {name: getattr(conversation.record, name) for name in names}
        self._background(self._publish({"kind": "changed", "conversation": conversation.id, **fields}))

    def documents_changed(self, conversation_id: str, frame: dict[str, Any]) -> None:
        """Tell the other replicas' sockets on the conversation of a document's new state (`document` frame)."""
        self._background(self._publish({"kind": "document", "conversation": conversation_id, "frame": frame}))

    async def deleting(self, conversation_id: str) -> None:
        """About to delete it: take its lease for a while, so that no replica starts a turn meanwhile
        (one that just started is fenced: it can append nothing more), and forget it as new."""
        try:
            await self.link.client.set(self.link.lease(conversation_id), f"deleting {self.link.replica}", px=DELETE_MS)
            await self.link.client.delete(self._new_key(conversation_id))
        except REDIS_FAILURES as error:
            raise Unavailable(f"PocketChat cannot delete it now: Redis is unreachable ({error}).") from None

    def deleted(self, conversation_id: str) -> None:
        self._background(self._publish({"kind": "deleted", "conversation": conversation_id}))

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
                self._background(self._mirror(live, event["turn"], event["reply"]))
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
        elif kind == "document" and live is not None:
            live.broadcast(event["frame"])
        elif kind == "deleted" and live is not None:
            live.broadcast(protocol.deleted(conversation_id))
            for subscriber in list(live.subscribers):
                subscriber.detach()
            self.hub.forget(conversation_id)

    # ---- new conversations (stored with their first turn) ---------------------------------------

    async def remember_new(self, record: ConversationRecord) -> None:
        # Without Redis, only this replica has it, as with every conversation then; and a new chat
        # does not wait on a Redis known to be down.
        if self.failure is not None:
            return
        with contextlib.suppress(*REDIS_FAILURES):
            await self.link.client.set(self._new_key(record.id), json.dumps(asdict(record)), ex=UNSTORED_KEEP)

    def refresh_new(self, record: ConversationRecord) -> None:
        self._background(self.remember_new(record))

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        try:
            found = await self.link.client.get(self._new_key(conversation_id))
        except REDIS_FAILURES:
            return None
        return ConversationRecord(**json.loads(found)) if found is not None else None

    def _new_key(self, conversation_id: str) -> str:
        return f"{self.link.prefix}new:{conversation_id}"

    # ---- turns that run elsewhere --------------------------------------------------------------

    async def adopt(self, conversation: Conversation) -> None:
        """A conversation just loaded: if its turn runs on another replica, follow it from here."""
        if (finishing := self._finishing.get(conversation.id)) is not None:
            await asyncio.shield(finishing)  # its turn just ended here: not one to follow
        try:
            holder = await self.link.holder(conversation.id)
        except REDIS_FAILURES as error:
            logger.warning("could not ask Redis whether conversation %s… runs a turn: %s", conversation.id[:6], error)
            return
        if holder is not None and not holder.startswith("deleting "):
            turn_id, reply_id, replica = holder.split(" ", 2)
            if turn_id not in self._produced:
                # Watched from now on, should its announcement never come: a turn followed here ends.
                self._elsewhere.setdefault(turn_id, (conversation.id, reply_id, replica))
                await self._mirror(conversation, turn_id, reply_id)
            return
        await self._adopt_last(conversation)

    async def _adopt_last(self, conversation: Conversation) -> None:
        """No turn runs on it now, but its last turn may have ended after the database was read, or
        before its final save landed: a turn's end (and its lease's release) reaches Redis first. Then
        that turn's stream is its record until the save lands: it is read as a mirror that ends at once
        (and adds the turn's messages where the database has none yet)."""
        try:
            last = await self.link.client.get(self._last_key(conversation.id))
            if last is None:
                return
            turn_id, reply_id = last.decode().split(" ")
            if any(m.id == reply_id and m.status != "streaming" for m in conversation.history):
                return  # stored as it ended
            entries = await self.link.entries(turn_id)
        except REDIS_FAILURES as error:
            logger.warning("could not ask Redis how conversation %s…'s last turn ended: %s", conversation.id[:6], error)
            return
        if entries and '"type":"turn_end"' in entries[-1][1]:
            await self._mirror(conversation, turn_id, reply_id)

    def _last_key(self, conversation_id: str) -> str:
        return f"{self.link.prefix}last:{conversation_id}"

    async def _mirror(self, conversation: Conversation, turn_id: str, reply_id: str) -> None:
        if turn_id in self._mirrors or conversation.turn is not None:
            return
        log = InProcessTurnLog(turn_id)
        reply = Message("assistant", "", status="streaming", turn_id=turn_id, id=reply_id)
        mirror = Mirror(conversation, Turn(Message("user", ""), reply, log, [], id=turn_id))
        self._mirrors[turn_id] = mirror  # claimed before the await: one mirror per turn
        try:
            # What is there now, so that a `ready` sent next has it; else the reader reads it all.
            self._take(mirror, await self.link.entries(turn_id))
        except REDIS_FAILURES as error:
            logger.warning("turn %s: read from its start by the reader (%s)", turn_id, error)

    def _take(self, mirror: Mirror, entries: list[tuple[str, str]]) -> None:
        """Entries read from a mirrored turn's stream: into its log, and into the conversation. An
        entry read twice (the first read of a mirror and the reader can overlap) is taken once."""
        for entry_id, text in entries:
            key = parse_key(entry_id)
            if key <= parse_key(mirror.last_id) or mirror.ended:
                continue
            mirror.turn.log.add_entry(key, text)  # type: ignore[attr-defined]
            mirror.last_id = entry_id
            if key[1] != 0:
                self._apply(mirror, json.loads(text))

    def _apply(self, mirror: Mirror, frame: dict[str, Any]) -> None:
        conversation, turn = mirror.conversation, mirror.turn
        kind = frame["type"]
        if kind == "turn_start":
            # As a client does with turn_start: the message replaces its namesake and what follows.
            turn.user_message = Message.from_wire(frame["message"], conversation.id, conversation.record.owner)
            turn.user_message.turn_id = turn.id
            history = [m for m in conversation.history if m.turn_id != turn.id]
            ids = [m.id for m in history]
            if turn.user_message.id in ids:
                history = history[: ids.index(turn.user_message.id)]
            conversation.history = [*history, turn.user_message]
            conversation.turn = turn
            for subscriber in conversation.subscribers:
                subscriber.follow(turn.log, 0)
        elif kind == "conversation" and conversation.record.title is None:
            # Only the turn's naming of an untitled conversation: a frame read again from the start of
            # the stream may be older than this copy (renamed since), and the rest of the record comes
            # from the database and the `changed` events, never from a turn's log.
            conversation.record.title = frame["title"]
        elif kind == "error":
            mirror.error = frame["message"]
        elif kind == "turn_end":
            self._end_mirror(mirror, frame)

    def _end_mirror(self, mirror: Mirror, end: dict[str, Any]) -> None:
        mirror.ended = True
        self._mirrors.pop(mirror.turn.id, None)
        self._elsewhere.pop(mirror.turn.id, None)
        conversation, turn = mirror.conversation, mirror.turn
        snapshot = turn.log.snapshot()
        reply = turn.reply
        reply.content, reply.reasoning, reply.status = snapshot["content"], snapshot["reasoning"], end["status"]
        reply.meta = {k: end.get(k) for k in ("model", "usage", "ttft_ms", "tokens_per_second")}
        if snapshot["steps"]:
            reply.meta["steps"] = snapshot["steps"]
        reply.error = mirror.error
        if conversation.turn is turn:
            conversation.history.append(reply)
            conversation.end(turn)
        else:
            turn.log.close()
        self.hub.release(conversation)

    async def _read(self) -> None:
        """A round of the one reader of this replica: events and every mirrored turn, in one blocking XREAD."""
        streams = {self.link.events: self._events_from}
        streams.update({self.link.stream(turn_id): m.last_id for turn_id, m in self._mirrors.items()})
        asked = time.monotonic()
        try:
            found = await self.link.reader.xread(streams, count=1000, block=READ_BLOCK_MS)
        except REDIS_FAILURES as error:
            self._sight.lost()
            if self.failure is None:
                logger.warning("lost Redis: %s", error)
            self.failure = str(error) or type(error).__name__  # /healthz says so until a read succeeds
            await asyncio.sleep(1)
            return
        self._sight.answered(asked)
        self.failure = None
        if found:
            await asyncio.sleep(READ_GATHER_SECONDS)  # the next read then gets more per stream
        try:
            self._dispatch(found)
        except Exception:
            logger.exception("could not take what Redis sent")  # the reader must go on, whatever it was

    def _dispatch(self, found: list[Any]) -> None:
        """Hand what one XREAD returned to the events and the mirrors."""
        for key, entries in found:
            name = key.decode()
            decoded = [(entry_id.decode(), fields) for entry_id, fields in entries]
            if name == self.link.events:
                for entry_id, fields in decoded:
                    self._events_from = entry_id
                    self._on_event(json.loads(fields[b"e"]))
            elif (mirror := self._mirrors.get(name.rpartition(":")[2])) is not None:
                self._take(mirror, [(entry_id, fields[b"f"].decode()) for entry_id, fields in decoded])
                if self.on_lag is not None and b"t" in decoded[-1][1]:
                    self.on_lag(time.time() - float(decoded[-1][1][b"t"]))

    async def _watch(self) -> None:
        """A round of the watchdog: notice turns whose producer died (its replica's heartbeat stopped,
        or its lease went) and end them `interrupted`."""
        await asyncio.sleep(WATCH_SECONDS)
        turns = list(self._elsewhere.items())
        if not turns:
            return
        asked = time.monotonic()
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                for _, (conversation_id, _, replica) in turns:
                    pipe.get(self.link.lease(conversation_id))
                    pipe.exists(self.link.heartbeat_key(replica))
                found = await pipe.execute()
        except REDIS_FAILURES as error:
            self._sight.lost()
            logger.warning("could not check the running turns: %s", error)
            return
        self._sight.answered(asked)
        # A missing heartbeat counts only while Redis has been in sight long enough (see STEADY_SECONDS).
        heartbeats_count = self._sight.steady
        for (turn_id, (conversation_id, reply_id, replica)), holder, alive in zip(
            turns, found[::2], found[1::2], strict=True
        ):
            lease_gone = holder is None or not holder.decode().startswith(turn_id + " ")
            if lease_gone or (not alive and heartbeats_count):
                try:
                    await self._end_abandoned(turn_id, conversation_id, reply_id, replica)
                except Exception:  # the other turns are ended all the same
                    logger.exception("turn %s: could not end it", turn_id)

    async def _end_abandoned(self, turn_id: str, conversation_id: str, reply_id: str, replica: str) -> None:
        """End a turn whose producer is gone, if nobody has (the script lets one replica only), and
        store what it streamed, marked interrupted. Until Redis has said, the turn stays watched; the
        database is not waited for (the watchdog has other turns to end): a refused write is kept by
        the store and written when the database is back."""
        error, end = takeover_frames(turn_id, reply_id)
        try:
            seq = await self.link.take_over(turn_id, conversation_id, replica, error, end)
        except REDIS_FAILURES as failure:
            logger.warning("turn %s: could not end it (%s); trying again", turn_id, failure)
            return
        if seq == ALIVE:
            return  # its heartbeat came back meanwhile: still watched
        self._elsewhere.pop(turn_id, None)
        if seq is None:
            return  # it ended the usual way
        if seq == VANISHED:
            logger.warning("turn %s: its log is gone from Redis (a restart?); ended it here as interrupted", turn_id)
            self._background(self._store_interrupted(conversation_id, reply_id, self._end_vanished(turn_id)))
            return
        logger.warning("turn %s was abandoned by its replica; ended it as interrupted", turn_id)
        try:
            snapshot = self._snapshot_of(turn_id, await self.link.entries(turn_id))
            reply: Message | None = self._reply_of(turn_id, reply_id, snapshot, TAKEN_OVER)
        except REDIS_FAILURES as failure:
            logger.warning("turn %s: could not read what it streamed (%s)", turn_id, failure)
            reply = self._followed_reply(turn_id, TAKEN_OVER)
        self._background(self._store_interrupted(conversation_id, reply_id, reply))

    @staticmethod
    def _reply_of(turn_id: str, reply_id: str, snapshot: dict[str, Any], why: str) -> Message:
        """A reply taken over, as stored: its text so far (a log's snapshot), marked interrupted."""
        content, reasoning = snapshot["content"], snapshot["reasoning"]
        return Message(
            "assistant", content, status="interrupted", turn_id=turn_id, id=reply_id, reasoning=reasoning, error=why
        )

    @staticmethod
    def _snapshot_of(turn_id: str, entries: list[tuple[str, str]]) -> dict[str, Any]:
        log = InProcessTurnLog(turn_id)
        for entry_id, text in entries:
            log.add_entry(parse_key(entry_id), text)
        return log.snapshot()

    def _followed_reply(self, turn_id: str, why: str) -> Message | None:
        """The reply as this replica followed it, if it did, marked interrupted."""
        if (mirror := self._mirrors.get(turn_id)) is None:
            return None
        return self._reply_of(turn_id, mirror.turn.reply.id, mirror.turn.log.snapshot(), why)

    def _end_vanished(self, turn_id: str) -> Message | None:
        """End this replica's copy of a turn whose stream is gone, as the takeover would have: an error
        and turn_end `interrupted` after the last entry it had. Its reply as followed here, if it was."""
        if (reply := self._followed_reply(turn_id, LOST_LOG)) is None:
            return None
        mirror = self._mirrors[turn_id]
        k, n = parse_key(mirror.last_id)
        error = protocol.encode(protocol.error(Unavailable(LOST_LOG, turn_id)))
        end = protocol.encode(protocol.turn_end(turn_id, "interrupted", reply.id, {}))
        self._take(mirror, [(f"{k}-{n + 1}", error), (f"{k}-{n + 2}", end)])
        return reply

    async def _store_interrupted(self, conversation_id: str, reply_id: str, reply: Message | None) -> None:
        """Store a taken-over reply as interrupted: what its stream held, or what this replica followed
        of it, else what the database has of it already."""
        try:
            if reply is None:
                reply = await self._stored_reply(conversation_id, reply_id)
                if reply is None:
                    return  # stored since by its own replica, or never
            await self.store.save_interrupted(conversation_id, reply)
        except StorageError as error:
            # A refused write is kept and written again when the database is back.
            logger.warning("turn of reply %s: its end is not stored yet: %s", reply_id, error.message)
        except Exception:
            logger.exception("could not store the interrupted reply %s", reply_id)

    async def _stored_reply(self, conversation_id: str, reply_id: str) -> Message | None:
        loaded = await self.store.load(conversation_id)
        found = [m for m in (loaded[1] if loaded else []) if m.id == reply_id and m.status == "streaming"]
        if not found:
            return None
        found[0].status, found[0].error = "interrupted", LOST_LOG
        return found[0]

    @property
    def ready(self) -> bool:
        return self.failure is None
