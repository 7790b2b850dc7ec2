"""Turn logs, leases and conversation events on Redis, shared by the replicas of one PocketChat.

Keys, under the prefix of one deployment:

- `turn:<turn_id>`: a stream of the turn's frames, entry id `k-n` as in `InProcessTurnLog` (chunk k
  is `k-0`), one field `f` holding the frame as sent. It expires a while after the turn ends.
- `lease:<conversation_id>`: who runs the conversation's turn, `<turn_id> <reply_id> <replica>`. The
  producer renews it every second; it expires three seconds after the producer dies. Taking it is
  the arbiter of "one running turn per conversation".
- `events`: a capped stream every replica reads: a turn started, a conversation changed or was
  deleted, a stop for a turn running elsewhere.

Every append checks the lease in the same script (`APPEND`): a producer whose lease is gone (it
stalled, or died and another replica ended its turn) can add nothing more.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError

from utils.turn_log import InProcessTurnLog

logger = logging.getLogger(__name__)

LEASE_MS = 3000  # a dead producer's turn is noticed within this, plus a watchdog tick
RENEW_SECONDS = 1.0
POOL_SIZE = 64  # connections for commands (the blocking reader has its own)
STREAM_MS = 24 * 3600 * 1000  # a stream outlives its turn by this while it runs (a dead producer's too)
ENDED_STREAM_MS = 10 * 60 * 1000  # after its turn ends: the stored reply is the record then
EVENTS_MAXLEN = 10_000

# KEYS: stream, lease. ARGV: lease value, "1" if these are the turn's last entries, the producer's clock
# (followers measure their lag by it), then id, frame, id, frame, ...
# The last entries and the lease's release are one step: whoever sees turn_end may start a turn.
APPEND = f"""
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 4, #ARGV, 2 do redis.call('XADD', KEYS[1], ARGV[i], 'f', ARGV[i + 1], 't', ARGV[3]) end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], {ENDED_STREAM_MS})
else
  redis.call('PEXPIRE', KEYS[1], {STREAM_MS})
end
return 1
"""

# KEYS: lease. ARGV: value, ttl ms (0: release).
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# End a turn whose producer is gone, once: only if its lease is no longer its own and its stream has
# no turn_end yet. KEYS: stream, lease. ARGV: "<turn_id> ", the turn_end frame, the error frame.
TAKEOVER = f"""
local holder = redis.call('GET', KEYS[2])
if holder and string.sub(holder, 1, #ARGV[1]) == ARGV[1] then return nil end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return nil end
if string.find(last[1][2][2], '"type":"turn_end"', 1, true) then return nil end
local dash = string.find(last[1][1], '-', 1, true)
local k = string.sub(last[1][1], 1, dash - 1)
local n = tonumber(string.sub(last[1][1], dash + 1))
redis.call('XADD', KEYS[1], k .. '-' .. (n + 1), 'f', ARGV[3])
redis.call('XADD', KEYS[1], k .. '-' .. (n + 2), 'f', ARGV[2])
redis.call('PEXPIRE', KEYS[1], {ENDED_STREAM_MS})
return k
"""


class Fenced(Exception):
    """This replica's lease on a turn is gone: it may append nothing more to that turn."""


class RedisLink:
    """The Redis side of one replica: a client for commands, one connection for blocking reads, the
    key names and the scripts."""

    def __init__(self, url: str, prefix: str, replica: str) -> None:
        self.replica = replica
        self.prefix = prefix
        # A pooled connection that Redis closed (it restarted) is found out on use: the command is sent
        # again once on a new connection rather than failing the turn that happened to draw it.
        again = {"retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 2), "retry_on_error": [ConnectionError]}
        # Hundreds of turns starting at once wait their turn for a connection rather than fail: the
        # default pool refuses the 101st caller outright.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=POOL_SIZE, timeout=5, socket_timeout=5, socket_connect_timeout=5, **again
        )
        self.client = aioredis.Redis(connection_pool=pool)
        # XREAD BLOCK holds its connection: a connection of its own, so commands never wait behind it.
        self.reader = aioredis.from_url(url, socket_connect_timeout=5, max_connections=1, **again)
        self.events = prefix + "events"
        self._append = self.client.register_script(APPEND)
        self._renew = self.client.register_script(RENEW)
        self._takeover = self.client.register_script(TAKEOVER)

    def stream(self, turn_id: str) -> str:
        return f"{self.prefix}turn:{turn_id}"

    def lease(self, conversation_id: str) -> str:
        return f"{self.prefix}lease:{conversation_id}"

    async def claim(self, conversation_id: str, value: str) -> bool:
        return bool(await self.client.set(self.lease(conversation_id), value, nx=True, px=LEASE_MS))

    async def renew(self, conversation_id: str, value: str, ttl_ms: int = LEASE_MS) -> bool:
        return bool(await self._renew(keys=[self.lease(conversation_id)], args=[value, ttl_ms]))

    async def holder(self, conversation_id: str) -> str | None:
        value = await self.client.get(self.lease(conversation_id))
        return value.decode() if value is not None else None

    async def append(
        self, turn_id: str, conversation_id: str, lease: str, entries: list[tuple[str, str]], last: bool
    ) -> None:
        args: list[str] = [lease, "1" if last else "0", repr(time.time())]
        for entry_id, text in entries:
            args += (entry_id, text)
        if not await self._append(keys=[self.stream(turn_id), self.lease(conversation_id)], args=args):
            raise Fenced(f"turn {turn_id} lost its lease")

    async def take_over(self, turn_id: str, conversation_id: str, error: str, end: str) -> int | None:
        """Append `error` and `end` to a turn whose producer is gone; the seq they follow, or None if
        the turn is not abandoned (its producer lives, or someone ended it already)."""
        keys = [self.stream(turn_id), self.lease(conversation_id)]
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
        for client in (self.client, self.reader):
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()


class ProducedLog(InProcessTurnLog):
    """The log of a turn this replica runs: local sockets follow it at once, and its entries are
    copied to the turn's Redis stream once per event-loop tick, in order, as one scripted call that
    checks the lease. `failure` says why copying stopped (the lease was lost, or Redis failed)."""

    def __init__(
        self, turn_id: str, conversation_id: str, lease: str, link: RedisLink, on_failure: Callable[[Exception], None]
    ) -> None:
        super().__init__(turn_id)
        self.link = link
        self.conversation_id = conversation_id
        self.lease = lease
        self.failure: Exception | None = None
        self._on_failure = on_failure
        self._unsent: list[tuple[str, str]] = []
        self._ending = False  # turn_end is in: the next copy is the last, and lets the lease go
        self._released = False
        self._flushing: asyncio.Task[None] | None = None

    def _push(self, key: tuple[int, int], text: str) -> None:
        super()._push(key, text)
        if self.failure is None:
            self._unsent.append((f"{key[0]}-{key[1]}", text))
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the rest of this tick's entries join the same call
        while self._unsent and self.failure is None:
            batch, self._unsent = self._unsent, []
            try:
                last = self._ending
                await self.link.append(self.turn_id, self.conversation_id, self.lease, batch, last)
                self._released = last
            except (Fenced, RedisError, OSError) as error:
                self.failure = error
                self._unsent = []
                self._on_failure(error)

    async def copied(self) -> None:
        """Wait until every entry so far is in Redis (or copying failed)."""
        while self._flushing is not None and not self._flushing.done():
            await asyncio.shield(self._flushing)

    async def finish(self) -> None:
        """turn_end is in the log: copy what is left, and with it let the turn's lease go."""
        self._ending = True
        await self.copied()
        if not self._released and self.failure is None:
            # The last copy left before the turn knew it was the last: let the lease go on its own.
            with contextlib.suppress(RedisError, OSError):
                await self.link.renew(self.conversation_id, self.lease, 0)
