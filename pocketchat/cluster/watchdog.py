"""The watchdog of the turns that run on other replicas: a turn whose replica died (its heartbeat
stopped) or lost its lease is ended `interrupted`, once, by whichever replica gets there first (the
`TAKEOVER` script), and its reply is stored as it streamed."""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pocketchat import protocol
from pocketchat.cluster.mirrors import Elsewhere, Mirrors
from pocketchat.cluster.redis_link import (
    ALIVE,
    HEARTBEAT_MS,
    HEARTBEAT_SECONDS,
    REDIS_FAILURES,
    TAKEN_OVER,
    VANISHED,
    RedisLink,
    running_turn,
    takeover_frames,
)
from pocketchat.conversations import Conversation
from pocketchat.errors import StorageError, Unavailable
from pocketchat.records import Message
from pocketchat.store import Store
from pocketchat.turn_log import InProcessTurnLog, parse_key

logger = logging.getLogger("pocketchat")

WATCH_SECONDS = 0.5  # how often leases of turns running elsewhere are checked
GAP_SECONDS = 1.0  # an answer from Redis later than this, or none for this long, is a gap in its sight
# A missing heartbeat says its replica is dead only once Redis has been in sight without a gap for this
# long: a live replica beats within it. After a stall (a frozen Redis expires every heartbeat at once
# when it wakes up) the heartbeats are set again within a beat, and the turns go on.
STEADY_SECONDS = HEARTBEAT_MS / 1000 + HEARTBEAT_SECONDS
LOST_LOG = "Redis, which links PocketChat's replicas, lost this reply's log (it restarted); the reply so far is kept."


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


class Watchdog:
    """Watches the turns in `elsewhere` (the coordinator's: by turn id, where each runs), and ends
    those whose producer is gone. A turn this replica follows (`mirrors`) ends here as it ended in
    Redis; `run_later` runs the storing of a reply without the watchdog waiting for the database."""

    def __init__(
        self,
        link: RedisLink,
        store: Store,
        mirrors: Mirrors,
        elsewhere: dict[str, Elsewhere],
        sight: Sight,
        run_later: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.link = link
        self.store = store
        self.mirrors = mirrors
        self._elsewhere = elsewhere
        self.sight = sight  # shared with the reader: both say when Redis answered
        self._run_later = run_later

    async def find_running_turns(self) -> None:
        """Turns that started before this replica did: their leases say where they run."""
        lease_prefix = self.link.lease("")
        async for key in self.link.client.scan_iter(match=lease_prefix + "*", count=500):
            holder = await self.link.client.get(key)
            if holder is not None and (running := running_turn(holder)) is not None:
                turn_id, reply_id, replica = running
                self._elsewhere[turn_id] = (key.decode().removeprefix(lease_prefix), reply_id, replica)

    async def watch(self) -> None:
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
            self.sight.lost()
            logger.warning("could not check the running turns: %s", error)
            return
        self.sight.answered(asked)
        # A missing heartbeat counts only while Redis has been in sight long enough (see STEADY_SECONDS).
        heartbeats_count = self.sight.steady
        for (turn_id, (conversation_id, reply_id, replica)), holder, alive in zip(
            turns, found[::2], found[1::2], strict=True
        ):
            lease_gone = holder is None or not holder.decode().startswith(turn_id + " ")
            if lease_gone or (not alive and heartbeats_count):
                # A conversation being deleted (its lease taken for that) gets no row written back.
                deleting = holder is not None and holder.startswith(b"deleting ")
                try:
                    await self._end_abandoned(turn_id, conversation_id, reply_id, replica, deleting)
                except Exception:  # the other turns are ended all the same
                    logger.exception("turn %s: could not end it", turn_id)

    async def _end_abandoned(
        self, turn_id: str, conversation_id: str, reply_id: str, replica: str, deleting: bool = False
    ) -> None:
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
            opening = None if deleting else self._opening_of(turn_id)
            self._run_later(self._store_interrupted(conversation_id, reply_id, self._end_vanished(turn_id), opening))
            return
        logger.warning("turn %s was abandoned by its replica; ended it as interrupted", turn_id)
        opening = None if deleting else self._opening_of(turn_id)
        try:
            snapshot = self._snapshot_of(turn_id, await self.link.entries(turn_id))
            reply: Message | None = self._reply_of(turn_id, reply_id, snapshot, TAKEN_OVER)
        except REDIS_FAILURES as failure:
            logger.warning("turn %s: could not read what it streamed (%s)", turn_id, failure)
            reply = self._followed_reply(turn_id, TAKEN_OVER)
        self._run_later(self._store_interrupted(conversation_id, reply_id, reply, opening))

    def _opening_of(self, turn_id: str) -> tuple[Conversation, Message] | None:
        """The conversation and user message of a turn this replica followed from its `turn_start`: what
        the turn's own opening write held. That write is queued, not waited for, so a replica that dies
        behind a slow database may never have made it."""
        mirror = self.mirrors.get(turn_id)
        if mirror is None or mirror.turn.reply.parent_id is None:
            return None  # not followed here, or not from its start
        return mirror.conversation, mirror.turn.user_message

    @staticmethod
    def _reply_of(turn_id: str, reply_id: str, snapshot: dict[str, Any], why: str) -> Message:
        """A reply taken over, as stored: its text and steps so far (a log's snapshot), marked interrupted."""
        content, reasoning = snapshot["content"], snapshot["reasoning"]
        meta = {"steps": snapshot["steps"]} if snapshot["steps"] else {}
        return Message(
            "assistant",
            content,
            status="interrupted",
            turn_id=turn_id,
            id=reply_id,
            reasoning=reasoning,
            error=why,
            meta=meta,
        )

    @staticmethod
    def _snapshot_of(turn_id: str, entries: list[tuple[str, str]]) -> dict[str, Any]:
        log = InProcessTurnLog(turn_id)
        for entry_id, text in entries:
            log.add_entry(parse_key(entry_id), text)
        return log.snapshot()

    def _followed_reply(self, turn_id: str, why: str) -> Message | None:
        """The reply as this replica followed it, if it did, marked interrupted."""
        if (mirror := self.mirrors.get(turn_id)) is None:
            return None
        return self._reply_of(turn_id, mirror.turn.reply.id, mirror.turn.log.snapshot(), why)

    def _end_vanished(self, turn_id: str) -> Message | None:
        """End this replica's copy of a turn whose stream is gone, as the takeover would have: an error
        and turn_end `interrupted` after the last entry it had. Its reply as followed here, if it was."""
        if (reply := self._followed_reply(turn_id, LOST_LOG)) is None:
            return None
        mirror = self.mirrors.get(turn_id)
        assert mirror is not None
        k, n = parse_key(mirror.last_id)
        error = protocol.encode(protocol.error(Unavailable(LOST_LOG, turn_id)))
        end = protocol.encode(protocol.turn_end(turn_id, "interrupted", reply.id, {}))
        self.mirrors.take(mirror, [(f"{k}-{n + 1}", error), (f"{k}-{n + 2}", end)])
        return reply

    async def _store_interrupted(
        self,
        conversation_id: str,
        reply_id: str,
        reply: Message | None,
        opening: tuple[Conversation, Message] | None,
    ) -> None:
        """Store a taken-over reply as interrupted: what its stream held, or what this replica followed
        of it, else what the database has of it already. With its `opening`, the turn is stored whole
        even where its replica's first write never landed (its path too, over the version this replica's
        copy knows: if another was stored, this copy shows that one instead)."""
        try:
            if reply is None:
                reply = await self._stored_reply(conversation_id, reply_id)
                if reply is None:
                    return  # stored since by its own replica, or never
                opening = None  # stored: its opening write landed
            if opening is None:
                await self.store.save_interrupted(conversation_id, reply)
                return
            conversation, user_message = opening
            reply.parent_id, reply.meta = user_message.id, {"model": conversation.record.model, **reply.meta}

            def landed(written: bool | None) -> None:
                if written is False:
                    self.mirrors.hub.paths.refused(conversation)

            await self.store.save_interrupted(conversation_id, reply, (conversation.record, user_message), landed)
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
