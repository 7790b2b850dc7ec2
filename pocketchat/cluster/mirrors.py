"""Turns that run on another replica, followed here: each turn's Redis stream (read by `reader.py`)
goes into a local log that this replica's sockets follow exactly as they follow a local turn (the
same bytes, the same seqs), and into its conversation (the user message, the title, the reply at
its end)."""

import asyncio
import json
import logging
from collections.abc import Callable, Container, Coroutine
from typing import Any

from pocketchat.cluster.redis_link import REDIS_FAILURES, RedisLink, running_turn
from pocketchat.conversations import Conversation, Hub, Turn
from pocketchat.records import Message
from pocketchat.turn_log import InProcessTurnLog, parse_key

logger = logging.getLogger("pocketchat")

# A turn running on another replica: (conversation id, reply id, replica).
Elsewhere = tuple[str, str, str]
# How a reply stored by the replica that ran it ends (one marked interrupted may be a running turn's, read
# from the database while it streamed: it is followed).
ENDED = ("complete", "stopped", "error")


class Mirror:
    """A turn that runs on another replica, followed here."""

    def __init__(self, conversation: Conversation, turn: Turn) -> None:
        self.conversation = conversation
        self.turn = turn
        self.last_id = "0-0"
        self.error: str | None = None
        self.ended = False


class Mirrors:
    """The turns this replica follows. It is told which turns run here (`produced`: never followed),
    which run elsewhere (`elsewhere`, watched by the watchdog: a turn followed here is watched too,
    and is not once it ends), and which conversations' turns are finishing here (`finishing`: by
    conversation, a turn copying its end to Redis); those belong to the coordinator (`Replicas`)."""

    def __init__(
        self,
        link: RedisLink,
        hub: Hub,
        produced: Container[str],
        elsewhere: dict[str, Elsewhere],
        finishing: dict[str, asyncio.Future[None]],
        run_later: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.link = link
        self.hub = hub
        self._produced = produced
        self._elsewhere = elsewhere
        self._finishing = finishing
        self._run_later = run_later
        self._mirrors: dict[str, Mirror] = {}  # by turn id
        self._following: dict[str, str] = {}  # conversation id: the turn id followed in it now
        # Conversation id: turns announced while an earlier one is still followed there, in order.
        self._next: dict[str, list[tuple[str, str]]] = {}

    def get(self, turn_id: str) -> Mirror | None:
        return self._mirrors.get(turn_id)

    def positions(self) -> dict[str, str]:
        """Each followed turn's stream, with the id of the last entry taken from it."""
        return {self.link.stream(turn_id): mirror.last_id for turn_id, mirror in self._mirrors.items()}

    async def adopt(self, conversation: Conversation) -> None:
        """A conversation just loaded: if its turn runs on another replica, follow it from here."""
        if (finishing := self._finishing.get(conversation.id)) is not None:
            await asyncio.shield(finishing)  # its turn just ended here: not one to follow
        try:
            holder = await self.link.holder(conversation.id)
        except REDIS_FAILURES as error:
            logger.warning("could not ask Redis whether conversation %s… runs a turn: %s", conversation.id[:6], error)
            return
        if holder is not None and (running := running_turn(holder)) is not None:
            turn_id, reply_id, replica = running
            if turn_id not in self._produced:
                # Watched from now on, should its announcement never come: a turn followed here ends.
                self._elsewhere.setdefault(turn_id, (conversation.id, reply_id, replica))
                await self.follow(conversation, turn_id, reply_id)
            return
        await self._adopt_last(conversation)

    async def _adopt_last(self, conversation: Conversation) -> None:
        """No turn runs on it now, but its last turn may have ended after the database was read, or
        before its final save landed: a turn's end (and its lease's release) reaches Redis first. Then
        that turn's stream is its record until the save lands: it is read as a mirror that ends at once
        (and adds the turn's messages where the database has none yet)."""
        try:
            last = await self.link.client.get(self.link.last_turn_key(conversation.id))
            if last is None:
                return
            turn_id, reply_id = last.decode().split(" ")
            if any(m.id == reply_id and m.status != "streaming" for m in conversation.tree):
                return  # stored as it ended
            entries = await self.link.entries(turn_id)
        except REDIS_FAILURES as error:
            logger.warning("could not ask Redis how conversation %s…'s last turn ended: %s", conversation.id[:6], error)
            return
        if entries and '"type":"turn_end"' in entries[-1][1]:
            await self.follow(conversation, turn_id, reply_id)

    async def follow(self, conversation: Conversation, turn_id: str, reply_id: str) -> None:
        """Follow a turn of `conversation` that runs on another replica, from its start. A turn can
        start there just as the previous one ends, before this replica has read that end: it is
        followed once the previous one has ended here (`_end`), so that the two never overlap."""
        if turn_id in self._mirrors or any(turn_id == waiting for waiting, _ in self._next.get(conversation.id, ())):
            return
        if (known := conversation.tree.get(reply_id)) is not None and known.status in ENDED:
            return  # read from the database as it ended (a copy reloaded for a refused path write): not played again
        if conversation.id in self._following:
            self._next.setdefault(conversation.id, []).append((turn_id, reply_id))
            return
        if conversation.turn is not None:
            return  # a turn of its own runs here: it holds the conversation's lease, no other can run
        log = InProcessTurnLog(turn_id)
        reply = Message("assistant", "", status="streaming", turn_id=turn_id, id=reply_id)
        mirror = Mirror(conversation, Turn(Message("user", ""), reply, log, id=turn_id))
        self._mirrors[turn_id] = mirror  # claimed before the await: one mirror per turn
        self._following[conversation.id] = turn_id
        try:
            # What is there now, so that a `ready` sent next has it; else the reader reads it all.
            self.take(mirror, await self.link.entries(turn_id))
        except REDIS_FAILURES as error:
            logger.warning("turn %s: read from its start by the reader (%s)", turn_id, error)

    def take(self, mirror: Mirror, entries: list[tuple[str, str]]) -> None:
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
            user_message = Message.from_wire(frame["message"], conversation.id, conversation.record.owner)
            user_message.turn_id = turn.id  # unless it is known here already (a regenerate's)
            conversation.follow_turn(turn, user_message)
        elif kind == "conversation" and conversation.record.title is None:
            # Only the turn's naming of an untitled conversation: a frame read again from the start of
            # the stream may be older than this copy (renamed since), and the rest of the record comes
            # from the database and the `changed` events, never from a turn's log.
            conversation.record.title = frame["title"]
        elif kind == "error":
            mirror.error = frame["message"]
        elif kind == "turn_end":
            self._end(mirror, frame)

    def _end(self, mirror: Mirror, end: dict[str, Any]) -> None:
        mirror.ended = True
        self._mirrors.pop(mirror.turn.id, None)
        self._elsewhere.pop(mirror.turn.id, None)
        conversation, turn = mirror.conversation, mirror.turn
        if self._following.get(conversation.id) == turn.id:
            del self._following[conversation.id]
        snapshot = turn.log.snapshot()
        reply = turn.reply
        reply.content, reply.reasoning, reply.status = snapshot["content"], snapshot["reasoning"], end["status"]
        reply.meta = {k: end.get(k) for k in ("model", "usage", "ttft_ms", "tokens_per_second")}
        if snapshot["steps"]:
            reply.meta["steps"] = snapshot["steps"]
        reply.error = mirror.error
        if conversation.turn is turn:
            conversation.add_reply(reply)
            conversation.end(turn)
        else:
            turn.log.close()
        self.hub.release(conversation)
        self._follow_next(conversation)

    def _follow_next(self, conversation: Conversation) -> None:
        """The turn that started after the one just ended here, if one did, while the conversation is
        still open here."""
        if not (waiting := self._next.pop(conversation.id, [])):
            return
        (turn_id, reply_id), rest = waiting[0], waiting[1:]
        if self.hub.live(conversation.id) is not conversation:
            return  # nobody here looks at it any more: a socket that opens it later adopts its turn
        if rest:
            self._next[conversation.id] = rest
        self._run_later(self.follow(conversation, turn_id, reply_id))
