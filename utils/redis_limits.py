"""The counts behind the per-user limits, in Redis, so that they hold across replicas.

A window is a sorted set of event times per key (Redis's own clock, so that replicas agree). A gauge
is a hash per key of one count per replica; a replica that dies stops counting once its heartbeat
(`utils/redis_log.py`) expires, so a crash does not leave a user's sockets or turns counted for
good. If Redis cannot be reached, a limit lets the request through: Redis failing already refuses
new turns on its own.
"""

import logging
import time

from redis.exceptions import RedisError

from utils.redis_log import RedisLink

logger = logging.getLogger(__name__)

# KEYS: the set. ARGV: period ms, limit, "1" to count an event, a unique member. Returns ms to wait.
WINDOW = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local period = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - period)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tonumber(oldest[2]) + period - ms
end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], ms, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], period)
end
return 0
"""

# KEYS: the hash. ARGV: the heartbeat keys' prefix. Returns the sum over replicas that are alive.
GAUGE = """
local total = 0
local counts = redis.call('HGETALL', KEYS[1])
for i = 1, #counts, 2 do
  if redis.call('EXISTS', ARGV[1] .. counts[i]) == 1 then total = total + tonumber(counts[i + 1]) end
end
return total
"""


class RedisWindow:
    def __init__(self, link: RedisLink, name: str, limit: int, period_ms: int = 60_000) -> None:
        self.link = link
        self.name = name
        self.limit = limit
        self.period_ms = period_ms
        self._script = link.client.register_script(WINDOW)

    async def _run(self, key: str, count: bool) -> float:
        if not self.limit:
            return 0.0
        member = f"{self.link.replica}:{time.time_ns()}"
        try:
            keys = [f"{self.link.prefix}limit:{self.name}:{key}"]
            waited = await self._script(keys=keys, args=[self.period_ms, self.limit, "1" if count else "0", member])
        except (RedisError, OSError) as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return 0.0
        return int(waited) / 1000

    async def wait(self, key: str) -> float:
        return await self._run(key, count=False)

    async def count(self, key: str) -> None:
        await self._run(key, count=True)


class RedisGauge:
    def __init__(self, link: RedisLink, name: str, limit: int) -> None:
        self.link = link
        self.name = name
        self.limit = limit
        self._script = link.client.register_script(GAUGE)

    def _key(self, key: str) -> str:
        return f"{self.link.prefix}gauge:{self.name}:{key}"

    async def full(self, key: str) -> bool:
        if not self.limit:
            return False
        try:
            total = await self._script(keys=[self._key(key)], args=[self.link.prefix + "replica:"])
        except (RedisError, OSError) as error:
            logger.warning("limit %s not checked (Redis: %s)", self.name, error)
            return False
        return int(total) >= self.limit

    async def _change(self, key: str, by: int) -> None:
        try:
            await self.link.client.hincrby(self._key(key), self.link.replica, by)
        except (RedisError, OSError) as error:
            logger.warning("limit %s not counted (Redis: %s)", self.name, error)

    async def add(self, key: str) -> None:
        await self._change(key, 1)

    async def remove(self, key: str) -> None:
        await self._change(key, -1)


class RedisCounters:
    def __init__(self, link: RedisLink) -> None:
        self.link = link

    def window(self, name: str, limit: int) -> RedisWindow:
        return RedisWindow(self.link, name, limit)

    def gauge(self, name: str, limit: int) -> RedisGauge:
        return RedisGauge(self.link, name, limit)
