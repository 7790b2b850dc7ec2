"""What the replicas of one PocketChat share in Redis: the keys, the scripts that change them, and
`RedisLink`, one replica's connection to them (and its heartbeat).

Keys, under the prefix of one deployment:

- `turn:<turn_id>`: a stream of the turn's frames, entry id `k-n` as in `InProcessTurnLog` (chunk k
  is `k-0`), one field `f` holding the frame as sent. It expires a while after the turn ends.
- `lease:<conversation_id>`: who runs the conversation's turn, `<turn_id> <reply_id> <replica>`.
  Taking it (with the user's limits, `counters.py`) is the arbiter of "one running turn per
  conversation"; the producer renews it. While the conversation is deleted: `deleting <replica>`;
  while a version switch's write lands: `switching <id> <replica>`.
- `last:<conversation_id>`: the conversation's last turn, `<turn_id> <reply_id>`, kept as long as an
  ended turn's stream: a replica that loads the conversation before the turn's final save lands
  reads the turn there.
- `new:<conversation_id>`: a new conversation not stored yet (it has no message), as JSON, so that
  any replica can open it.
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
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError

from pocketchat import errors, protocol

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


HELD_BUT_NOT_BY_A_TURN = ("deleting ", "switching ")  # how the leases of a delete and a switch begin


def running_turn(holder: str | bytes) -> tuple[str, str, str] | None:
    """The (turn id, reply id, replica) of the turn a lease's value names; None for a delete's or a switch's."""
    text = holder.decode() if isinstance(holder, bytes) else holder
    if text.startswith(HELD_BUT_NOT_BY_A_TURN):
        return None
    turn_id, reply_id, replica = text.split(" ", 2)
    return turn_id, reply_id, replica


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

    async def alive(self, replica: str) -> bool:
        """Whether the replica's heartbeat is there (it beats every second; gone 3 s after it dies)."""
        return bool(await self.client.exists(self.heartbeat_key(replica)))

    def last_turn_key(self, conversation_id: str) -> str:
        return f"{self.prefix}last:{conversation_id}"

    def new_conversation_key(self, conversation_id: str) -> str:
        return f"{self.prefix}new:{conversation_id}"

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
