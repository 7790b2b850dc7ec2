"""The counts behind the per-user limits, in Redis, so that they hold across replicas. Every limit is
checked and counted in one script call: requests that arrive together, on one replica or several,
cannot all pass the check before any of them is counted.

A window is a sorted set of event times per key (Redis's own clock, so that replicas agree), which
expires a period after its last event.

A gauge (sockets, replies streaming) is a hash per key with one field per replica: that replica's
own count, `<count> <seq>`. Each replica knows its own count exactly (it opened those sockets), so
it *sets* its field rather than adding to it: a field can never go below zero, nor drift after an
empty Redis restart (the next change, or the refresh every `REFRESH_SECONDS`, writes the true count
again). `seq` grows with every write of a replica, and a write carrying an older `seq` than the
field's is dropped: two writes that Redis gets in the other order (two pooled connections) do not
leave the older count. A check counts this replica's share from its own memory and the others' from
their fields; the field of a replica whose heartbeat (`pocketchat/cluster/redis_link.py`) has expired is deleted,
so a crash does not leave a user's sockets or turns counted for good. Gauge keys expire unless a
replica with something counted there refreshes them.

If Redis cannot be reached, a limit lets the request through (counted here, and written to Redis
when it is back); a message is checked in the same call that takes its conversation's lease, and
without Redis no turn starts anyway.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

from pocketchat.cluster.redis_link import REDIS_FAILURES, RedisLink
from pocketchat.limits import Lease, Refused, Taken

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 10.0  # how often a replica writes its nonzero gauge counts again
GAUGE_TTL_MS = 60_000  # a gauge key nobody refreshes (every count back to zero, every replica gone) expires

# Lua the scripts below share: Redis's clock in ms, the wait of a window (a sorted set of event
# times; old ones are dropped), and a gauge's fields.
SHARED = """
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function window_wait(key, period, limit, ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ms - period)
  if redis.call('ZCARD', key) < limit then return 0 end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return tonumber(oldest[2]) + period - ms
end
-- The counts of the other replicas that are alive; the fields of dead ones are deleted.
local function gauge_others(key, alive_prefix, me)
  local total = 0
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local replica = fields[i]
    if replica ~= me then
      if redis.call('EXISTS', alive_prefix .. replica) == 1 then
        total = total + tonumber(string.match(fields[i + 1], '^(%d+)'))
      else
        redis.call('HDEL', key, replica)
      end
    end
  end
  return total
end
-- Set this replica's count, unless a write of it with a later seq landed first.
local function gauge_set(key, me, count, seq, ttl)
  local old = redis.call('HGET', key, me)
  if old and tonumber(string.match(old, ' (%d+)$')) > seq then return end
  redis.call('HSET', key, me, count .. ' ' .. seq)
  redis.call('PEXPIRE', key, ttl)
end
"""

# KEYS: the set. ARGV: period ms, limit, "1" to count an event, a unique member. Returns ms to wait
# (0: counted, if asked to).
WINDOW = (
    SHARED
    + """
local ms = now_ms()
local wait = window_wait(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ms)
if wait == 0 and ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], ms, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return wait
"""
)

# KEYS: the hash. ARGV: limit (0: none), heartbeat prefix, this replica, its count with this one,
# seq, ttl ms. Counts this one (1) unless the others and this replica's count pass the limit (0).
TAKE_GAUGE = (
    SHARED
    + """
local limit, mine = tonumber(ARGV[1]), tonumber(ARGV[4])
if limit > 0 and gauge_others(KEYS[1], ARGV[2], ARGV[3]) + mine > limit then return 0 end
gauge_set(KEYS[1], ARGV[3], mine, tonumber(ARGV[5]), ARGV[6])
return 1
"""
)

# KEYS: the hash. ARGV: this replica, its count, seq, ttl ms.
SET_GAUGE = SHARED + "gauge_set(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])"

# A message, in one step: refused over the running limit or the messages limit, or if the lease is
# held; else counted in both, and the lease taken. KEYS: the running gauge, the messages window, the
# lease (if any). ARGV: running limit, heartbeat prefix, this replica, messages limit, period ms, a
# unique member, this replica's running count with this one, seq, gauge ttl ms, then the lease's
# value and ms. Returns {why refused or '', ms to wait}.
TAKE_MESSAGE = (
    SHARED
    + """
local running, messages, period = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5])
local mine = tonumber(ARGV[7])
if running > 0 and gauge_others(KEYS[1], ARGV[2], ARGV[3]) + mine > running then return {'running', 0} end
local ms = now_ms()
if messages > 0 then
  local wait = window_wait(KEYS[2], period, messages, ms)
  if wait > 0 then return {'messages', wait} end
end
if KEYS[3] and not redis.call('SET', KEYS[3], ARGV[10], 'NX', 'PX', ARGV[11]) then return {'lease', 0} end
if messages > 0 then
  redis.call('ZADD', KEYS[2], ms, ARGV[6])
  redis.call('PEXPIRE', KEYS[2], period)
end
gauge_set(KEYS[1], ARGV[3], mine, tonumber(ARGV[8]), ARGV[9])
return {'', 0}
"""
)


class RedisWindow:
    def __init__(self, link: RedisLink, name: str, limit: int, period_ms: int = 60_000) -> None:
        self.link = link
        self.name = name
        self.limit = limit
        self.period_ms = period_ms
        self._script = link.client.register_script(WINDOW)

    def key(self, key: str) -> str:
        return f"{self.link.prefix}limit:{self.name}:{key}"

    def new_event(self) -> str:
        return f"{self.link.replica}:{time.time_ns()}"

    async def take(self, key: str) -> tuple[float, str | None]:
        event = self.new_event()
        if not self.limit:
            return 0.0, event
        try:
            args = [self.period_ms, self.limit, "1", event]
            waited = int(await self._script(keys=[self.key(key)], args=args))
        except REDIS_FAILURES as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return 0.0, event
        return (waited / 1000, None) if waited else (0.0, event)

    async def forget(self, key: str, event: str) -> None:
        if not self.limit:
            return
        try:
            await self.link.client.zrem(self.key(key), event)
        except REDIS_FAILURES as error:
            logger.warning("limit %s: an event not uncounted (Redis: %s)", self.name, error)


class RedisGauge:
    """This replica's counts of one gauge, kept here and written to its field in Redis."""

    def __init__(self, link: RedisLink, name: str, limit: int) -> None:
        self.link = link
        self.name = name
        self.limit = limit
        self.counts: dict[str, int] = {}  # this replica's own, by key; none is zero
        self._seq = itertools.count(1)  # later writes carry larger numbers (a restart is another replica)
        self._take = link.client.register_script(TAKE_GAUGE)
        self._set = link.client.register_script(SET_GAUGE)

    def key(self, key: str) -> str:
        return f"{self.link.prefix}gauge:{self.name}:{key}"

    @property
    def alive_prefix(self) -> str:
        return self.link.prefix + "replica:"

    def reserve(self, key: str) -> tuple[int, int]:
        """Count one more here before asking Redis (so that takes sent together count each other);
        this replica's count with it, and the seq to write it with."""
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key], next(self._seq)

    def unreserve(self, key: str) -> None:
        if (left := self.counts.get(key, 0) - 1) > 0:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)

    async def write(self, key: str, client: Any = None) -> None:
        """Write this replica's count of `key` as it is now (on `client`: a pipeline)."""
        args = [self.link.replica, self.counts.get(key, 0), next(self._seq), GAUGE_TTL_MS]
        await self._set(keys=[self.key(key)], args=args, client=client)

    async def take(self, key: str) -> bool:
        mine, seq = self.reserve(key)
        args = [self.limit, self.alive_prefix, self.link.replica, mine, seq, GAUGE_TTL_MS]
        try:
            taken = bool(await self._take(keys=[self.key(key)], args=args))
        except REDIS_FAILURES as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return True  # counted here; the next refresh writes it to Redis
        if not taken:
            self.unreserve(key)
        return taken

    async def remove(self, key: str) -> None:
        self.unreserve(key)
        try:
            await self.write(key)
        except REDIS_FAILURES as error:
            logger.warning("limit %s not counted (Redis: %s)", self.name, error)

    async def refresh(self) -> None:
        """Write every nonzero count of this replica again (after a Redis restart, they are gone),
        keeping its keys from expiring."""
        if not self.counts:
            return
        async with self.link.client.pipeline(transaction=False) as pipe:
            for key in list(self.counts):
                await self.write(key, pipe)
            await pipe.execute()


class RedisMessages:
    """A user's replies streaming and messages a minute, checked and counted (and the conversation's
    lease taken) in one scripted call: the one Redis round trip before a turn's provider request.
    A Redis error is raised: without Redis, no turn can start anyway."""

    def __init__(self, link: RedisLink, running: RedisGauge, messages_limit: int) -> None:
        self.link = link
        self.running = running
        self.messages = RedisWindow(link, "messages", messages_limit)
        self._script = link.client.register_script(TAKE_MESSAGE)

    async def take(self, user: str, lease: Lease | None) -> Taken | Refused:
        event = self.messages.new_event()
        mine, seq = self.running.reserve(user)
        keys = [self.running.key(user), self.messages.key(user)]
        args: list[str | int] = [self.running.limit, self.running.alive_prefix, self.link.replica]
        args += [self.messages.limit, self.messages.period_ms, event, mine, seq, GAUGE_TTL_MS]
        if lease is not None:
            keys.append(lease.key)
            args += [lease.value, lease.ms]
        try:
            why, wait_ms = await self._script(keys=keys, args=args)
        except BaseException:
            self.running.unreserve(user)
            raise
        if why:
            self.running.unreserve(user)
            return Refused(why.decode(), int(wait_ms) / 1000)
        return Taken(user, event, lease)

    async def give_back(self, taken: Taken) -> None:
        self.running.unreserve(taken.user)
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                await self.running.write(taken.user, pipe)
                pipe.zrem(self.messages.key(taken.user), taken.event)
                await pipe.execute()
        except REDIS_FAILURES as error:
            logger.warning("a message's count was not given back (Redis: %s)", error)

    async def ended(self, user: str) -> None:
        await self.running.remove(user)


class RedisCounters:
    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self.gauges: list[RedisGauge] = []

    def window(self, name: str, limit: int) -> RedisWindow:
        return RedisWindow(self.link, name, limit)

    def gauge(self, name: str, limit: int) -> RedisGauge:
        self.gauges.append(RedisGauge(self.link, name, limit))
        return self.gauges[-1]

    def messages(self, running_limit: int, messages_limit: int) -> RedisMessages:
        return RedisMessages(self.link, self.gauge("running", running_limit), messages_limit)

    async def refresh_counts(self) -> None:
        """One round of keeping the counts: write this replica's gauge counts again after REFRESH_SECONDS."""
        await asyncio.sleep(REFRESH_SECONDS)
        for gauge in self.gauges:
            with contextlib.suppress(*REDIS_FAILURES):  # Redis away: the next round writes them
                await gauge.refresh()
