"""The log of a turn this replica runs, copied to the turn's Redis stream (`redis_link.py`) for the
other replicas, which follow it from there (`mirrors.py`): `ProducedLog`, and the `Copier` that copies
every such log of this replica once per event-loop tick."""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pocketchat.cluster.redis_link import (
    COPY_RETRY_SECONDS,
    FRESH_SECONDS,
    LEASE_MS,
    REDIS_FAILURES,
    Batch,
    Fenced,
    RedisLink,
    takeover_frames,
)
from pocketchat.turn_log import InProcessTurnLog

logger = logging.getLogger(__name__)


class ProducedLog(InProcessTurnLog):
    """The log of a turn this replica runs: local sockets follow it at once, and the `Copier` copies
    its entries to the turn's Redis stream, in order. `failure` says why copying failed (the lease
    was lost, or Redis failed).

    Redis failing does not lose the entries: they are copied again, with the ones that follow (the
    turn's error and end), once Redis answers, for as long as the lease may still be this turn's; the
    followers then end the turn as its own sockets did.

    Fencing: another replica ends this turn only once this one looks dead (its heartbeat stopped for
    seconds, or its lease lapsed), and this one finds out at its next copy. A process that was paused
    past that (SIGSTOP, a VM pause) wakes with the provider's chunks queued on its socket: they must not
    reach its own sockets before a copy confirms the turn is still its own. So an entry appended when
    no copy has confirmed the lease for `FRESH_SECONDS`, by a process that was just frozen, is held
    back from local followers until one does; if the copy is refused instead, the held entries are
    dropped and the log ends the way the replica that took the turn over ended it in Redis: local
    sockets see what every other socket saw."""

    def __init__(self, turn_id: str, conversation_id: str, lease: str, copier: "Copier") -> None:
        super().__init__(turn_id)
        self.conversation_id = conversation_id
        self.lease = lease
        self.copier = copier
        self.failure: Exception | None = None
        self.given_up = False  # nothing more is copied: fenced, or Redis failed longer than a lease lives
        self.taken_over = False  # another replica ended the turn: nothing more is appended here
        self._failing_since: float | None = None
        self._unsent: list[tuple[str, str]] = []
        self._in_flight = 0
        self._all_copied = asyncio.Event()
        self._all_copied.set()
        self._ending = False  # turn_end is in: the next copy is the last, and lets the lease go
        self._released = False
        self._confirmed_at = time.monotonic()  # the lease was just taken
        self._copied = 0  # how many of the entries are in the stream
        self._held_from: int | None = None  # entries from here on wait for a copy to confirm the lease

    # ---- appending: held back while the lease is unconfirmed, dropped once the turn is taken over

    def append(self, frame: dict[str, Any]) -> None:
        if not self.taken_over:
            super().append(frame)

    def append_chunk(self, content: str, reasoning: str | None = None) -> int:
        return self.seq if self.taken_over else super().append_chunk(content, reasoning)

    def _push(self, key: tuple[int, int], text: str) -> None:
        if not self.given_up:
            stale = time.monotonic() - self._confirmed_at > FRESH_SECONDS
            frozen = stale and self.copier.link.frozen_since(self._confirmed_at)
            if self.failure is None and self._held_from is None and frozen:
                self._held_from = len(self._entries)
            self._unsent.append((f"{key[0]}-{key[1]}", text))
            self._all_copied.clear()
            if self._failing_since is None:  # else the next try takes it along
                self.copier.mark(self)
        super()._push(key, text)

    def _shown(self) -> int:
        return len(self._entries) if self._held_from is None else self._held_from

    def _held_seq(self) -> int | None:
        if self._held_from is None:
            return None
        return self._keys[self._held_from - 1][0] if self._held_from else 0

    def _show_all(self) -> None:
        if self._held_from is not None:
            self._held_from = None
            self._wake()

    # ---- copying ---------------------------------------------------------------------------------

    @property
    def waiting(self) -> bool:
        """Whether something is to be copied: entries, or the release of the lease at the end."""
        return not self.given_up and bool(self._unsent or (self._ending and not self._released))

    def take(self) -> Batch:
        """What is to be copied now; `settle` says how it went."""
        batch = Batch(self.turn_id, self.conversation_id, self.lease, self._unsent, self._ending)
        self._unsent = []
        self._in_flight += 1
        return batch

    def settle(self, batch: Batch, error: Exception | None) -> None:
        self._in_flight -= 1
        if error is None:
            self._failing_since = None
            if not self.taken_over:  # else an earlier call's answer, come after the turn was found taken over
                self._landed(batch)
            if self.waiting and not self._in_flight:
                self.copier.mark(self)  # the end came after this copy left: one more lets the lease go
        elif isinstance(error, Fenced):
            if self.failure is None:
                self._end_taken_over(error)
            else:  # its sockets already saw the turn end when Redis failed: it is not ended again
                self.given_up, self._unsent = True, []
        else:
            self._failed(batch, error)
        if (not self.waiting or self.failure is not None) and not self._in_flight:
            self._all_copied.set()

    def _landed(self, batch: Batch) -> None:
        self._released = batch.last
        self._copied += len(batch.entries)
        # The script found the lease when it ran, at the earliest when the call left.
        self._confirmed_at = max(self._confirmed_at, batch.taken_at)
        if time.monotonic() - self._confirmed_at <= FRESH_SECONDS:
            self._show_all()

    def _failed(self, batch: Batch, error: Exception) -> None:
        """Redis failed the copy (or a bug did): the turn stops, its own sockets see all of it (nobody
        else can end it meanwhile), and its entries are sent again while the lease may still hold."""
        if self.failure is None:
            self.failure = error
            self._show_all()
            self.copier.on_failure(self.turn_id, error)
        now = time.monotonic()
        self._failing_since = self._failing_since or now
        if isinstance(error, REDIS_FAILURES) and now - self._failing_since < LEASE_MS / 1000:
            self._unsent = batch.entries + self._unsent  # in order, before what came since
            self.copier.try_again(self)
        else:
            self.given_up = True  # the lease is gone by now
            self._unsent = []

    def _end_taken_over(self, error: Exception) -> None:
        """Another replica ended this turn: keep only what reached the stream, and end the log as that
        replica ended the stream (`takeover_frames`), so that sockets here see what sockets there saw."""
        self.failure = error
        self.given_up = True
        self._unsent = []
        self._cut(self._copied)
        for text in takeover_frames(self.turn_id, self.lease.split(" ")[1]):
            self._since_chunk += 1
            InProcessTurnLog._push(self, (self._seq, self._since_chunk), text)
        self.taken_over = True
        self._held_from = None
        self._wake()
        self.copier.on_failure(self.turn_id, error)

    async def copied(self) -> None:
        """Wait until every entry so far is in Redis (or copying failed)."""
        await self._all_copied.wait()

    async def confirm(self) -> bool:
        """Whether the turn is still this replica's, with everything appended so far in its stream: the
        copy of the last entries says so, or, after a silence, the lease itself. A process that ran all
        along since the lease was last confirmed does not wait for Redis: nobody takes over a replica
        whose heartbeat never stopped."""
        if self.failure is None and not self.copier.link.frozen_since(self._confirmed_at):
            return True
        await self.copied()
        if self.failure is not None:
            return not self.taken_over  # Redis failed: nobody else can have ended the turn
        if time.monotonic() - self._confirmed_at <= FRESH_SECONDS:
            return True
        asked_at = time.monotonic()
        try:
            held = await self.copier.link.renew(self.conversation_id, self.lease)
        except REDIS_FAILURES as error:  # Redis fails: the turn ends with that failure, as its own
            logger.warning("turn %s: could not confirm its lease: %s", self.turn_id, error)
            return True
        if held:
            self._confirmed_at = max(self._confirmed_at, asked_at)
        elif not self.taken_over:
            self._end_taken_over(Fenced(f"turn {self.turn_id} lost its lease"))
        return not self.taken_over

    async def finish(self) -> None:
        """turn_end is in the log: copy what is left, and with it let the turn's lease go."""
        self._ending = True
        if self.waiting and not self._in_flight:
            # Nothing under way carries the end (all was copied before it): one more copy, empty if
            # need be, lets the lease go. A copy under way is followed by it when it settles.
            self._all_copied.clear()
            self.copier.mark(self)
        await self.copied()


class Copier:
    """Copies the logs of every turn this replica runs to Redis: once per event-loop tick, all of
    them in one scripted call, and one call at a time, so that each log's entries land in order."""

    def __init__(self, link: RedisLink, on_failure: Callable[[str, Exception], None]) -> None:
        self.link = link
        self.on_failure = on_failure  # (turn id, why): the turn must stop
        self._waiting: dict[str, ProducedLog] = {}
        self._copying: asyncio.Task[None] | None = None
        self.stopped: str | None = None  # why a copy task ended with an error nobody handled, if one did

    def mark(self, log: ProducedLog) -> None:
        self._waiting[log.turn_id] = log
        if self._copying is None or self._copying.done():
            self._copying = asyncio.get_running_loop().create_task(self._copy())
            self._copying.add_done_callback(self._copy_ended)

    def try_again(self, log: ProducedLog) -> None:
        """Copy a log whose copy Redis failed again in a while."""
        asyncio.get_running_loop().call_later(COPY_RETRY_SECONDS, self.mark, log)

    def _copy_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            self.stopped = repr(error)
            logger.error("copying turns to Redis stopped", exc_info=error)

    async def _copy(self) -> None:
        while self._waiting:
            await asyncio.sleep(0)  # the rest of this tick's entries, of every turn, join the same call
            logs, self._waiting = list(self._waiting.values()), {}
            batches = [(log, log.take()) for log in logs if log.waiting]
            if not batches:
                continue
            try:
                copied = await self.link.append([batch for _, batch in batches])
            except Exception as error:
                # Every batch taken is settled, whatever failed: a turn waiting for its copy to end
                # (`finish`) must not wait forever, nor the next turn of its conversation behind it.
                if not isinstance(error, REDIS_FAILURES):
                    logger.exception("copying turns to Redis failed")
                for log, batch in batches:
                    log.settle(batch, error)
                continue
            for (log, batch), done in zip(batches, copied, strict=True):
                log.settle(batch, None if done else Fenced(f"turn {log.turn_id} lost its lease"))
