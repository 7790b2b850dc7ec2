"""The counts behind the per-user limits, in Redis, so that they hold across replicas.

A window is a sorted set of event times per key (Redis's own clock, so that replicas agree). A gauge
is a hash per key of one count per replica; a replica that dies stops counting once its heartbeat
(`utils/redis_log.py`) expires, so a crash does not leave a user's sockets or turns counted for
good. If Redis cannot be reached, a limit lets the request through; a message is checked in the
same call that takes its conversation's lease, and without Redis no turn starts anyway.
"""

import logging
import time

from utils.limits import Lease, Refused, Taken
from utils.redis_log import REDIS_FAILURES, RedisLink

logger = logging.getLogger(__name__)

# Lua the scripts below share: Redis's clock in ms, the wait of a window (a sorted set of event
# times; old ones are dropped), and the total of a gauge over the replicas that are alive.
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
local function gauge_total(key, alive_prefix)
  local total = 0
  local counts = redis.call('HGETALL', key)
  for i = 1, #counts, 2 do
    if redis.call('EXISTS', alive_prefix .. counts[i]) == 1 then total = total + tonumber(counts[i + 1]) end
  end
  return total
end
"""

# KEYS: the set. ARGV: period ms, limit, "1" to count an event, a unique member. Returns ms to wait.
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

# KEYS: the hash. ARGV: the heartbeat keys' prefix. Returns the sum over replicas that are alive.
GAUGE = SHARED + "return gauge_total(KEYS[1], ARGV[1])"

# A message, in one step: refused over the running limit or the messages limit, or if the lease is
# held; else counted in both, and the lease taken. KEYS: the running gauge, the messages window, the
# lease (if any). ARGV: running limit, heartbeat prefix, this replica, messages limit, period ms, a
# unique member, then the lease's value and ms. Returns {why refused or '', ms to wait}.
TAKE_MESSAGE = (
    SHARED
    + """
local running, messages, period = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5])
if running > 0 and gauge_total(KEYS[1], ARGV[2]) >= running then return {'running', 0} end
local ms = now_ms()
if messages > 0 then
  local wait = window_wait(KEYS[2], period, messages, ms)
  if wait > 0 then return {'messages', wait} end
end
if KEYS[3] and not redis.call('SET', KEYS[3], ARGV[7], 'NX', 'PX', ARGV[8]) then return {'lease', 0} end
if messages > 0 then
  redis.call('ZADD', KEYS[2], ms, ARGV[6])
  redis.call('PEXPIRE', KEYS[2], period)
end
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
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

    async def _run(self, key: str, event: str | None) -> float:
        if not self.limit:
            return 0.0
        try:
            args = [self.period_ms, self.limit, "0" if event is None else "1", event or ""]
            waited = await self._script(keys=[self.key(key)], args=args)
        except REDIS_FAILURES as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return 0.0
        return int(waited) / 1000

    async def wait(self, key: str) -> float:
        return await self._run(key, None)

    async def count(self, key: str) -> str:
        event = self.new_event()
        await self._run(key, event)
        return event


class RedisGauge:
    def __init__(self, link: RedisLink, name: str, limit: int) -> None:
        self.link = link
        self.name = name
        self.limit = limit
        self._script = link.client.register_script(GAUGE)

    def key(self, key: str) -> str:
        return f"{self.link.prefix}gauge:{self.name}:{key}"

    async def full(self, key: str) -> bool:
        if not self.limit:
            return False
        try:
            total = await self._script(keys=[self.key(key)], args=[self.link.prefix + "replica:"])
        except REDIS_FAILURES as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return False
        return int(total) >= self.limit

    async def _change(self, key: str, by: int) -> None:
        try:
            await self.link.client.hincrby(self.key(key), self.link.replica, by)
        except REDIS_FAILURES as error:
            logger.warning("limit %s not counted (Redis: %s)", self.name, error)

    async def add(self, key: str) -> None:
        await self._change(key, 1)

    async def remove(self, key: str) -> None:
        await self._change(key, -1)


class RedisMessages:
    """A user's replies streaming and messages a minute, checked and counted (and the conversation's
    lease taken) in one scripted call: the one Redis round trip before a turn's provider request.
    A Redis error is raised: without Redis, no turn can start anyway."""

    def __init__(self, link: RedisLink, running_limit: int, messages_limit: int) -> None:
        self.link = link
        self.running = RedisGauge(link, "running", running_limit)
        self.messages = RedisWindow(link, "messages", messages_limit)
        self._script = link.client.register_script(TAKE_MESSAGE)

    async def take(self, user: str, lease: Lease | None) -> Taken | Refused:
        event = self.messages.new_event()
        keys = [self.running.key(user), self.messages.key(user)]
        args: list[str | int] = [self.running.limit, self.link.prefix + "replica:", self.link.replica]
        args += [self.messages.limit, self.messages.period_ms, event]
        if lease is not None:
            keys.append(lease.key)
            args += [lease.value, lease.ms]
        why, wait_ms = await self._script(keys=keys, args=args)
        return Taken(user, event, lease) if not why else Refused(why.decode(), int(wait_ms) / 1000)

    async def give_back(self, taken: Taken) -> None:
        try:
            async with self.link.client.pipeline(transaction=False) as pipe:
                pipe.hincrby(self.running.key(taken.user), self.link.replica, -1)
                pipe.zrem(self.messages.key(taken.user), taken.event)
                await pipe.execute()
        except REDIS_FAILURES as error:
            logger.warning("a message's count was not given back (Redis: %s)", error)

    async def ended(self, user: str) -> None:
        await self.running.remove(user)


class RedisCounters:
    def __init__(self, link: RedisLink) -> None:
        self.link = link

    def window(self, name: str, limit: int) -> RedisWindow:
        return RedisWindow(self.link, name, limit)

    def gauge(self, name: str, limit: int) -> RedisGauge:
        return RedisGauge(self.link, name, limit)

    def messages(self, running_limit: int, messages_limit: int) -> RedisMessages:
        return RedisMessages(self.link, running_limit, messages_limit)
