"""Per-user limits: replies streaming at once, open sockets, messages and new conversations a minute;
and failed sign-ins per client address. A limit of 0 is off.

The rules are here; the counting is done by a `Counters` kind: in this process (`LocalCounters`), or
in Redis with replicas (`utils/redis_limits.py`), so that a user's limits hold across replicas.
"""

import time
from collections import deque
from typing import Protocol

from utils.protocol import RateLimited
from utils.settings import Settings

MINUTE = 60.0
RUNNING_RETRY_SECONDS = 5.0  # a reply's end cannot be foreseen: a short wait to suggest
SIGN_INS_PER_MINUTE = 5


class Window(Protocol):
    """At most `limit` events per key in any minute."""

    limit: int

    async def wait(self, key: str) -> float:
        """Seconds until one more event is allowed (0: now)."""

    async def count(self, key: str) -> None: ...


class Gauge(Protocol):
    """At most `limit` things per key at once."""

    limit: int

    async def full(self, key: str) -> bool: ...

    async def add(self, key: str) -> None: ...

    async def remove(self, key: str) -> None: ...


class Counters(Protocol):
    def window(self, name: str, limit: int) -> Window: ...

    def gauge(self, name: str, limit: int) -> Gauge: ...


class LocalWindow:
    def __init__(self, limit: int, period: float = MINUTE) -> None:
        self.limit = limit
        self.period = period
        self._events: dict[str, deque[float]] = {}

    async def wait(self, key: str) -> float:
        if not self.limit or not (events := self._events.get(key)):
            return 0.0
        now = time.monotonic()
        while events and events[0] <= now - self.period:
            events.popleft()
        if not events:
            del self._events[key]
            return 0.0
        return events[0] + self.period - now if len(events) >= self.limit else 0.0

    async def count(self, key: str) -> None:
        if self.limit:
            self._events.setdefault(key, deque()).append(time.monotonic())


class LocalGauge:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    async def full(self, key: str) -> bool:
        return bool(self.limit) and self._counts.get(key, 0) >= self.limit

    async def add(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    async def remove(self, key: str) -> None:
        if (left := self._counts.get(key, 0) - 1) > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)


class LocalCounters:
    """Counts in this process: one process is the whole app."""

    def window(self, name: str, limit: int) -> Window:
        return LocalWindow(limit)

    def gauge(self, name: str, limit: int) -> Gauge:
        return LocalGauge(limit)


class Limits:
    def __init__(self, settings: Settings, counters: Counters) -> None:
        self._running = counters.gauge("running", settings.limit_running_turns)
        self._sockets = counters.gauge("sockets", settings.limit_sockets)
        self._messages = counters.window("messages", settings.limit_messages_per_minute)
        self._conversations = counters.window("conversations", settings.limit_conversations_per_minute)
        self._failed_sign_ins = counters.window("sign-ins", SIGN_INS_PER_MINUTE)

    async def check_message(self, user: str) -> None:
        """Refuse a message (or regenerate, or edit) the user may not send now; `count_message` once it started."""
        if await self._running.full(user):
            raise RateLimited(
                f"You have {self._running.limit} replies streaming already; wait for one to finish.",
                RUNNING_RETRY_SECONDS,
            )
        if wait := await self._messages.wait(user):
            raise RateLimited(f"You sent {self._messages.limit} messages in the last minute; wait a moment.", wait)

    async def count_message(self, user: str) -> None:
        await self._messages.count(user)
        await self._running.add(user)

    async def turn_ended(self, user: str) -> None:
        await self._running.remove(user)

    async def take_conversation(self, user: str) -> None:
        """Count a new conversation, or refuse it."""
        if wait := await self._conversations.wait(user):
            raise RateLimited(
                f"You started {self._conversations.limit} conversations in the last minute; wait a moment.", wait
            )
        await self._conversations.count(user)

    async def take_socket(self, user: str) -> None:
        """Count an open socket (`socket_closed` when it closes), or refuse it."""
        if await self._sockets.full(user):
            raise RateLimited(
                f"You have {self._sockets.limit} tabs open already; close one and reload.", RUNNING_RETRY_SECONDS
            )
        await self._sockets.add(user)

    async def socket_closed(self, user: str) -> None:
        await self._sockets.remove(user)

    async def sign_in_wait(self, address: str) -> float:
        """Seconds this client address must wait before trying to sign in again (0: it may now)."""
        return await self._failed_sign_ins.wait(address)

    async def failed_sign_in(self, address: str) -> None:
        await self._failed_sign_ins.count(address)
