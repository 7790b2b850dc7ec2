"""Per-user limits: replies streaming at once, open sockets, messages and new conversations a minute;
and failed sign-ins per client address. Each count lives in this process; a limit of 0 is off."""

import time
from collections import deque

from utils.protocol import RateLimited
from utils.settings import Settings

MINUTE = 60.0
RUNNING_RETRY_SECONDS = 5.0  # a reply's end cannot be foreseen: a short wait to suggest
SIGN_INS_PER_MINUTE = 5


class SlidingWindow:
    """At most `limit` events per key in any `period` seconds."""

    def __init__(self, limit: int, period: float = MINUTE) -> None:
        self.limit = limit
        self.period = period
        self._events: dict[str, deque[float]] = {}

    def wait(self, key: str) -> float:
        """Seconds until one more event is allowed (0: now)."""
        if not self.limit or not (events := self._events.get(key)):
            return 0.0
        now = time.monotonic()
        while events and events[0] <= now - self.period:
            events.popleft()
        if not events:
            del self._events[key]
            return 0.0
        return events[0] + self.period - now if len(events) >= self.limit else 0.0

    def count(self, key: str) -> None:
        if self.limit:
            self._events.setdefault(key, deque()).append(time.monotonic())


class Gauge:
    """At most `limit` things per key at once (replies streaming, sockets open)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def full(self, key: str) -> bool:
        return bool(self.limit) and self._counts.get(key, 0) >= self.limit

    def add(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def remove(self, key: str) -> None:
        if (left := self._counts.get(key, 0) - 1) > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)


class Limits:
    def __init__(self, settings: Settings) -> None:
        self.running = Gauge(settings.limit_running_turns)
        self.sockets = Gauge(settings.limit_sockets)
        self._messages = SlidingWindow(settings.limit_messages_per_minute)
        self._conversations = SlidingWindow(settings.limit_conversations_per_minute)
        self._failed_sign_ins = SlidingWindow(SIGN_INS_PER_MINUTE)

    def check_message(self, user: str) -> None:
        """Refuse a message (or regenerate, or edit) the user may not send now; `count_message` once it started."""
        if self.running.full(user):
            raise RateLimited(
                f"You have {self.running.limit} replies streaming already; wait for one to finish.",
                RUNNING_RETRY_SECONDS,
            )
        if wait := self._messages.wait(user):
            raise RateLimited(f"You sent {self._messages.limit} messages in the last minute; wait a moment.", wait)

    def count_message(self, user: str) -> None:
        self._messages.count(user)
        self.running.add(user)

    def take_conversation(self, user: str) -> None:
        """Count a new conversation, or refuse it."""
        if wait := self._conversations.wait(user):
            raise RateLimited(
                f"You started {self._conversations.limit} conversations in the last minute; wait a moment.", wait
            )
        self._conversations.count(user)

    def take_socket(self, user: str) -> None:
        """Count an open socket (the caller removes it when it closes), or refuse it."""
        if self.sockets.full(user):
            raise RateLimited(
                f"You have {self.sockets.limit} tabs open already; close one and reload.", RUNNING_RETRY_SECONDS
            )
        self.sockets.add(user)

    def sign_in_wait(self, address: str) -> float:
        """Seconds this client address must wait before trying to sign in again (0: it may now)."""
        return self._failed_sign_ins.wait(address)

    def failed_sign_in(self, address: str) -> None:
        self._failed_sign_ins.count(address)
