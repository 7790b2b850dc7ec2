"""Turn logs, leases and conversation events on Redis, shared by the replicas of one PocketChat.

Keys, under the prefix of one deployment:

- `turn:<turn_id>`: a stream of the turn's frames, entry id `k-n` as in `InProcessTurnLog` (chunk k
  is `k-0`), one field `f` holding the frame as sent. It expires a while after the turn ends.
- `lease:<conversation_id>`: who runs the conversation's turn, `<turn_id> <reply_id> <replica>`.
  Taking it (with the user's limits, `utils/redis_limits.py`) is the arbiter of "one running turn per
  conversation"; the producer renews it.
- `replica:<id>`: a replica's heartbeat, set every second by a thread of its own (so that a busy
  event loop does not look like a dead process); it expires three seconds after the replica dies,
  and then the replica's turns are ended by another.
- `events`: a capped stream every replica reads: a turn started, a conversation changed or was
  deleted, a stop for a turn running elsewhere.

Every append checks the lease in the same script (`APPEND`): a producer whose lease is gone (it
stalled, or died and another replica ended its turn) can add nothing more.
"""

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError

from pocketchat import errors, protocol
from pocketchat.turn_log import InProcessTurnLog

logger = logging.getLogger(__name__)

LEASE_MS = 30_000  # a backstop: a dead producer is noticed by its heartbeat, much sooner
RENEW_SECONDS = 5.0
HEARTBEAT_MS = 3000  # a dead replica's turns are ended within this, plus a watchdog tick
HEARTBEAT_SECONDS = 1.0
COPY_RETRY_SECONDS = 1.0  # a copy that Redis failed is tried again this often, for as long as a lease lives
POOL_SIZE = 64  # connections for commands (the blocking reader has its own)
# The reader's XREAD blocks for 100 ms: an answer this late means Redis (or the way to it) stalls, and
# /healthz says so within this rather than never.
READ_TIMEOUT_SECONDS = 2.0
STREAM_MS = 24 * 3600 * 1000  # a stream outlives its turn by this while it runs (a dead producer's too)
ENDED_STREAM_MS = 10 * 60 * 1000  # after its turn ends: the stored reply is the record then
EVENTS_MAXLEN = 10_000
# An entry appended this long after the last copy that confirmed the turn's lease waits for the next
# one before local sockets see it. Another replica takes a turn over only once the producer's
# heartbeat (kept every HEARTBEAT_SECONDS by a thread) has been missing for HEARTBEAT_MS: a process
# that ran all along is never held up by this, only one that was paused.
FRESH_SECONDS = HEARTBEAT_MS / 1000 - 2 * HEARTBEAT_SECONDS
# ...and only if this process itself was frozen meanwhile: its clock thread (which ticks every
# CLOCK_SECONDS) has not ticked for FROZEN_SECONDS. A producer that ran all along while Redis stalled
# cannot have been taken over (nobody judges its heartbeat until Redis has been steady for a while),
# and its own sockets are not kept waiting for Redis.
CLOCK_SECONDS = 0.1
FROZEN_SECONDS = 0.5
TAKEN_OVER = "The replica writing this reply stopped; the reply so far is kept."

# Copy the new entries of several turns at once. KEYS: stream, lease, stream, lease, ... ARGV: the
# producer's clock (followers measure their lag by it), then for each turn: its lease value, "1" if
# these are its last entries, how many entries, then id, frame, id, frame, ... Each turn's entries go
# in only while it holds its lease; its last entries and the lease's release are one step, so
# whoever sees turn_end may start the next turn. An entry already there is skipped: a copy sent again
# after a timeout (Redis stalled, and ran the first one when it woke up) adds only what is missing.
# Returns 1 or 0 per turn.
APPEND = f"""
local i = 2
local copied = {{}}
for t = 1, #KEYS / 2 do
  local stream, lease = KEYS[2 * t - 1], KEYS[2 * t]
  local holder, last, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  if redis.call('GET', lease) == holder then
    for e = 1, n do
      local added = redis.pcall('XADD', stream, ARGV[i], 'f', ARGV[i + 1], 't', ARGV[1])
      if type(added) == 'table' and added.err and not string.find(added.err, 'equal or smaller', 1, true) then
        return redis.error_reply(added.err)
      end
      i = i + 2
    end
    if last == '1' then
      redis.call('DEL', lease)
      redis.call('PEXPIRE', stream, {ENDED_STREAM_MS})
    else
      redis.call('PEXPIRE', stream, {STREAM_MS})
    end
    copied[t] = 1
  else
    i = i + 2 * n
    copied[t] = 0
  end
end
return copied
"""

# KEYS: lease. ARGV: value, ttl ms (0: release).
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# End a turn whose producer is gone, once: only if its lease is no longer its own, or its replica's
# heartbeat has stopped, and its stream has no turn_end yet. Its lease goes with it (fencing the
# producer, should it be alive after all). KEYS: stream, lease, the producer's heartbeat.
# ARGV: "<turn_id> ", the turn_end frame, the error frame. Returns the seq the end follows; nil if the
# turn has ended already; ALIVE if its producer lives (it is watched on); VANISHED if its stream is
# gone (Redis restarted empty): there is nothing to end in Redis then, and every replica that follows
# the turn ends its own copy.
VANISHED = -1
ALIVE = -2
TAKEOVER = f"""
local holder = redis.call('GET', KEYS[2])
local its_own = holder and string.sub(holder, 1, #ARGV[1]) == ARGV[1]
if its_own and redis.call('EXISTS', KEYS[3]) == 1 then return {ALIVE} end
if its_own then redis.call('DEL', KEYS[2]) end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return {VANISHED} end
if string.find(last[1][2][2], '"type":"turn_end"', 1, true) then return nil end
local dash = string.find(last[1][1], '-', 1, true)
local k = string.sub(last[1][1], 1, dash - 1)
local n = tonumber(string.sub(last[1][1], dash + 1))
redis.call('XADD', KEYS[1], k .. '-' .. (n + 1), 'f', ARGV[3])
redis.call('XADD', KEYS[1], k .. '-' .. (n + 2), 'f', ARGV[2])
redis.call('PEXPIRE', KEYS[1], {ENDED_STREAM_MS})
return k
"""


# What a Redis call raises when Redis fails. The clients below raise nothing else (see `Client`):
# where code expects Redis to fail, it catches these, and a bug of its own is not taken for an outage.
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, OSError)


def as_redis_failure(error: Exception) -> RedisError:
    """Any other exception out of the Redis client, as the Redis failure it is."""
    failure = ConnectionError(f"{type(error).__name__}: {error}")
    failure.__cause__ = error
    return failure


class FailingAsRedis(Pipeline):
    """A pipeline whose every failure is a RedisError (see `Client`)."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except REDIS_FAILURES:
            raise
        except Exception as error:
            raise as_redis_failure(error) from error


class Client(aioredis.Redis):
    """redis-py's client, whose every failure is a RedisError. A connection Redis closed under it can
    raise other things: on uvloop, writing to it raises the transport's RuntimeError ("unable to
    perform operation on <TCPTransport closed=True>"), which killed the tasks that expected Redis
    errors only."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)
        except REDIS_FAILURES:
            raise
        except Exception as error:
            raise as_redis_failure(error) from error

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> FailingAsRedis:
        return FailingAsRedis(self.connection_pool, self.response_callbacks, transaction, shard_hint)


def takeover_frames(turn_id: str, reply_id: str) -> tuple[str, str]:
    """The error and turn_end that end a turn taken over from its replica (the frames as sent): the
    replica that takes it over appends them to its stream, and its producer, when it finds out, to its
    own log, so that every socket sees the same end."""
    error = protocol.encode(protocol.error(errors.Unavailable(TAKEN_OVER, turn_id)))
    return error, protocol.encode(protocol.turn_end(turn_id, "interrupted", reply_id, {}))


class Fenced(Exception):
    """This replica's lease on a turn is gone: it may append nothing more to that turn."""


class RedisLink:
    """The Redis side of one replica: a client for commands, one connection for blocking reads, the
    key names and the scripts."""

    def __init__(self, url: str, prefix: str, replica: str) -> None:
        self.replica = replica
        self.prefix = prefix
        # A pooled connection that Redis closed (it restarted) is found out on use: the command is sent
        # again once on a new connection rather than failing the turn that happened to draw it (on
        # uvloop, writing to it raises RuntimeError: the command never left, and is sent again too).
        backoff = ExponentialBackoff(cap=0.5, base=0.05)
        again = {"retry": Retry(backoff, 2), "retry_on_error": [ConnectionError, RuntimeError]}
        # Hundreds of turns starting at once wait their turn for a connection rather than fail: the
        # default pool refuses the 101st caller outright.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=POOL_SIZE, timeout=5, socket_timeout=5, socket_connect_timeout=5, **again
        )
        self.client = Client.from_pool(pool)  # closing the client closes its pool
        # XREAD BLOCK holds its connection: a connection of its own, so commands never wait behind it.
        # A read that times out is not sent again: the stall is reported at once, and the reader retries.
        self.reader = Client.from_url(
            url,
            socket_connect_timeout=5,
            socket_timeout=READ_TIMEOUT_SECONDS,
            max_connections=1,
            retry=Retry(backoff, 2, supported_errors=(ConnectionError,)),
            retry_on_error=[ConnectionError, RuntimeError],
        )
        self.events = prefix + "events"
        self.awake_at = time.monotonic()  # kept by the clock thread (`start_heartbeat`)
        self.thawed_at = -1.0  # when the clock thread last found the process had been frozen
        self._append = self.client.register_script(APPEND)
        self._renew = self.client.register_script(RENEW)
        self._takeover = self.client.register_script(TAKEOVER)

    def stream(self, turn_id: str) -> str:
        return f"{self.prefix}turn:{turn_id}"

    def lease(self, conversation_id: str) -> str:
        return f"{self.prefix}lease:{conversation_id}"

    def heartbeat_key(self, replica: str) -> str:
        return f"{self.prefix}replica:{replica}"

    def frozen_since(self, moment: float) -> bool:
        """Whether this process was frozen (SIGSTOP, a VM pause) at some time after `moment`: its clock
        thread noticed a freeze end since, or it is late now (the process is just waking up)."""
        return self.thawed_at >= moment or time.monotonic() - self.awake_at > FROZEN_SECONDS

    def start_heartbeat(self, url: str) -> None:
        """Keep this replica's heartbeat from a thread of its own: an event loop busy with hundreds of
        streams must not look like a dead process. A second thread keeps `awake_at`, whatever Redis does."""
        self._stop_beating = threading.Event()

        def tick() -> None:
            while not self._stop_beating.wait(CLOCK_SECONDS):
                now = time.monotonic()
                if now - self.awake_at > FROZEN_SECONDS:
                    self.thawed_at = now
                self.awake_at = now

        self._ticking = threading.Thread(target=tick, name="awake-clock", daemon=True)
        self._ticking.start()
        beats = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        key = self.heartbeat_key(self.replica)

        def beat() -> None:
            failing = False
            while True:
                try:
                    beats.set(key, "1", px=HEARTBEAT_MS)
                    failing = False
                except Exception as error:  # whatever it is, the next beat tries again
                    if not failing:
                        logger.warning("heartbeat not set: %s", error, exc_info=not isinstance(error, REDIS_FAILURES))
                    failing = True
                if self._stop_beating.wait(HEARTBEAT_SECONDS):
                    with contextlib.suppress(Exception):
                        beats.close()
                    return

        self._beating = threading.Thread(target=beat, name="redis-heartbeat", daemon=True)
        self._beating.start()

    @property
    def heartbeat_stopped(self) -> bool:
        """Whether the heartbeat thread ended before it was told to: the other replicas would take
        this one for dead and end its turns."""
        return hasattr(self, "_beating") and not self._beating.is_alive() and not self._stop_beating.is_set()

    async def renew(self, conversation_id: str, value: str, ttl_ms: int = LEASE_MS) -> bool:
        return bool(await self._renew(keys=[self.lease(conversation_id)], args=[value, ttl_ms]))

    async def holder(self, conversation_id: str) -> str | None:
        value = await self.client.get(self.lease(conversation_id))
        return value.decode() if value is not None else None

    async def append(self, batches: list["Batch"]) -> list[bool]:
        """Copy each batch to its turn's stream, if the turn still holds its lease; which were copied."""
        keys: list[str] = []
        args: list[str] = [repr(time.time())]
        for batch in batches:
            keys += (self.stream(batch.turn_id), self.lease(batch.conversation_id))
            args += (batch.lease, "1" if batch.last else "0", str(len(batch.entries)))
            for entry_id, text in batch.entries:
                args += (entry_id, text)
        return [bool(copied) for copied in await self._append(keys=keys, args=args)]

    async def renew_all(self, leases: list[tuple[str, str]]) -> list[bool]:
        """Renew (conversation id, lease value) leases in one round trip; which were still held."""
        async with self.client.pipeline(transaction=False) as pipe:
            for conversation_id, lease in leases:
                await self._renew(keys=[self.lease(conversation_id)], args=[lease, LEASE_MS], client=pipe)
            return [bool(held) for held in await pipe.execute()]

    async def take_over(self, turn_id: str, conversation_id: str, replica: str, error: str, end: str) -> int | None:
        """Append `error` and `end` to a turn whose producer (on `replica`) is gone; the seq they
        follow, None if the turn has ended (someone ended it), ALIVE if its producer lives, or
        VANISHED if its stream is gone."""
        keys = [self.stream(turn_id), self.lease(conversation_id), self.heartbeat_key(replica)]
        seq = await self._takeover(keys=keys, args=[turn_id + " ", end, error])
        return None if seq is None else int(seq)

    async def entries(self, turn_id: str, after: str = "-") -> list[tuple[str, str]]:
        """The stream's entries (after `after`, exclusive when given as an id)."""
        start = "-" if after == "-" else "(" + after
        found = await self.client.xrange(self.stream(turn_id), start, "+")
        return [(entry_id.decode(), fields[b"f"].decode()) for entry_id, fields in found]

    async def publish(self, event: dict[str, Any]) -> None:
        fields = {"e": json.dumps({**event, "replica": self.replica})}
        await self.client.xadd(self.events, fields, maxlen=EVENTS_MAXLEN, approximate=True)

    async def last_event_id(self) -> str:
        last = await self.client.xrevrange(self.events, "+", "-", count=1)
        return last[0][0].decode() if last else "0-0"

    async def aclose(self) -> None:
        if hasattr(self, "_beating"):
            self._stop_beating.set()
            await asyncio.to_thread(self._beating.join)
            await asyncio.to_thread(self._ticking.join)
        for client in (self.client, self.reader):
            with contextlib.suppress(Exception):  # closing what may already be broken
                await client.aclose()


@dataclass
class Batch:
    """A turn's entries for one copy."""

    turn_id: str
    conversation_id: str
    lease: str
    entries: list[tuple[str, str]]
    last: bool
    taken_at: float = field(default_factory=time.monotonic)  # when the copy left


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
