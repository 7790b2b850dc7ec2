"""Per-user limits: replies streaming at once, open sockets, messages, new conversations, hellos,
changes and tool calls a minute; and failed sign-ins, per client address and in all. A limit of 0 is off.

The rules are here; the counting is done by a `Counters` kind: in this process (`LocalCounters`), or
in Redis with replicas (`pocketchat/cluster/counters.py`), so that a user's limits hold across replicas.
Every limit is checked and counted in one step (`take`): requests that arrive together cannot all
pass the check before any of them is counted. A message is taken with the conversation's lease
when there are replicas.
"""

import ipaddress
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol

from pocketchat.errors import RateLimited, TurnInProgress
from pocketchat.settings import Settings

MINUTE = 60.0
RUNNING_RETRY_SECONDS = 5.0  # a reply's end cannot be foreseen: a short wait to suggest
SIGN_INS_PER_MINUTE = 5  # wrong tokens a minute from one client address (an IPv6 /64 is one address)
# Wrong tokens a minute from every address together: thousands of addresses (an IPv6 block is cheap)
# get no more guesses than this between them. While it is reached, signing in waits for everyone.
ALL_SIGN_INS_PER_MINUTE = 50
ALL = "*"  # the key of that overall count
UPLOADS_AT_ONCE = 2  # a user's uploads whose bodies one process reads at once (web/uploads.py)
MAX_KEYS = 10_000  # keys one window of this process keeps; the least recently counted go first


RUNNING, MESSAGES, LEASE = "running", "messages", "lease"  # why a message was refused


@dataclass(frozen=True)
class Lease:
    """A key one holder has at a time, for `ms` at most (with replicas: who runs a conversation's turn)."""

    key: str
    value: str
    ms: int


@dataclass(frozen=True)
class Taken:
    """A message let through: what was counted for it (and the lease taken), to give back if its
    turn cannot begin after all."""

    user: str
    event: str  # its entry in the messages window
    lease: Lease | None


@dataclass(frozen=True)
class Refused:
    why: str  # RUNNING, MESSAGES or LEASE
    wait: float = 0.0  # for MESSAGES: seconds until one more is allowed


class Window(Protocol):
    """At most `limit` events per key in any minute."""

    limit: int

    async def take(self, key: str) -> tuple[float, str | None]:
        """Count an event unless that would pass the limit, in one step: (0, the event's name, for
        `forget`), or (seconds until one more is allowed, None)."""

    async def forget(self, key: str, event: str) -> None:
        """Uncount an event."""


class Gauge(Protocol):
    """At most `limit` things per key at once."""

    limit: int

    async def take(self, key: str) -> bool:
        """Count one more unless the limit is reached, in one step; whether it was counted."""

    async def remove(self, key: str) -> None: ...


class MessageCounts(Protocol):
    """A user's replies streaming at once and messages a minute."""

    async def take(self, user: str, lease: Lease | None) -> Taken | Refused:
        """Check both limits (and that `lease` is free) and count the message (and take the lease): one step."""

    async def give_back(self, taken: Taken) -> None:
        """Uncount a message whose turn could not begin (its lease is the caller's to let go)."""

    async def ended(self, user: str) -> None:
        """A reply stopped streaming."""


class Counters(Protocol):
    def window(self, name: str, limit: int) -> Window: ...

    def gauge(self, name: str, limit: int) -> Gauge: ...

    def messages(self, running_limit: int, messages_limit: int) -> MessageCounts: ...


class LocalWindow:
    """A window in this process. It keeps at most `max_keys` keys: past that, the key counted least
    recently is forgotten (a client that sends from ever new addresses cannot grow it without end)."""

    def __init__(self, limit: int, period: float = MINUTE, max_keys: int = MAX_KEYS) -> None:
        self.limit = limit
        self.period = period
        self.max_keys = max_keys
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def _wait(self, key: str, now: float) -> float:
        if not (events := self._events.get(key)):
            return 0.0
        while events and events[0] <= now - self.period:
            events.popleft()
        if not events:
            del self._events[key]
            return 0.0
        return events[0] + self.period - now if len(events) >= self.limit else 0.0

    async def take(self, key: str) -> tuple[float, str | None]:
        # Nothing here awaits: no other request runs between the check and the count.
        now = time.monotonic()
        if not self.limit:
            return 0.0, repr(now)
        if wait := self._wait(key, now):
            return wait, None
        self._events.setdefault(key, deque()).append(now)
        self._events.move_to_end(key)
        while len(self._events) > self.max_keys:
            self._events.popitem(last=False)
        return 0.0, repr(now)

    async def forget(self, key: str, event: str) -> None:
        if (events := self._events.get(key)) is not None and float(event) in events:
            events.remove(float(event))
            if not events:
                del self._events[key]

    def __len__(self) -> int:
        return len(self._events)


class LocalGauge:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def full(self, key: str) -> bool:
        return bool(self.limit) and self._counts.get(key, 0) >= self.limit

    async def take(self, key: str) -> bool:
        if self.full(key):
            return False
        self._counts[key] = self._counts.get(key, 0) + 1
        return True

    async def remove(self, key: str) -> None:
        if (left := self._counts.get(key, 0) - 1) > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)


class LocalMessages:
    def __init__(self, running_limit: int, messages_limit: int) -> None:
        self.running = LocalGauge(running_limit)
        self.messages = LocalWindow(messages_limit)

    async def take(self, user: str, lease: Lease | None) -> Taken | Refused:
        # Nothing awaited here suspends, so nothing runs between the check and the count. There is
        # no lease in one process: the conversation itself refuses a second turn.
        if self.running.full(user):
            return Refused(RUNNING)
        wait, event = await self.messages.take(user)
        if event is None:
            return Refused(MESSAGES, wait)
        await self.running.take(user)
        return Taken(user, event, lease)

    async def give_back(self, taken: Taken) -> None:
        await self.running.remove(taken.user)
        await self.messages.forget(taken.user, taken.event)

    async def ended(self, user: str) -> None:
        await self.running.remove(user)


class LocalCounters:
    """Counts in this process: one process is the whole app."""

    def window(self, name: str, limit: int) -> Window:
        return LocalWindow(limit)

    def gauge(self, name: str, limit: int) -> Gauge:
        return LocalGauge(limit)

    def messages(self, running_limit: int, messages_limit: int) -> MessageCounts:
        return LocalMessages(running_limit, messages_limit)


@dataclass(frozen=True)
class SignInAttempt:
    """A sign-in let through the limits, counted as failed until it turns out right (`succeeded`)."""

    address: str  # the address group it was counted under
    events: tuple[str, str]  # its events in the per-address and the overall windows


def address_group(address: str) -> str:
    """The key a client address is limited under: an IPv6 address by its /64 (one subscriber gets a
    whole /64, and picks any address in it), an IPv4-mapped one as the IPv4 address it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Limits:
    def __init__(self, settings: Settings, counters: Counters) -> None:
        self._running_limit = settings.limit_running_turns
        self._messages_limit = settings.limit_messages_per_minute
        self._messages = counters.messages(self._running_limit, self._messages_limit)
        self._sockets = counters.gauge("sockets", settings.limit_sockets)
        self._conversations = counters.window("conversations", settings.limit_conversations_per_minute)
        self._hellos = counters.window("hellos", settings.limit_hellos_per_minute)
        self._changes = counters.window("changes", settings.limit_changes_per_minute)
        self._searches = counters.window("searches", settings.limit_searches_per_minute)
        self._tool_calls = counters.window("tool-calls", settings.limit_tool_calls_per_minute)
        self._failed_sign_ins = counters.window("sign-ins", SIGN_INS_PER_MINUTE)
        self._all_failed_sign_ins = counters.window("all-sign-ins", ALL_SIGN_INS_PER_MINUTE)

    async def take_message(self, user: str, lease: Lease | None = None) -> Taken:
        """Let a message (or regenerate, or edit) through and count it, taking `lease` with it; or
        refuse it: over a limit, or the lease is held (a reply runs). `give_back` if its turn cannot begin."""
        verdict = await self._messages.take(user, lease)
        if isinstance(verdict, Taken):
            return verdict
        if verdict.why == RUNNING:
            raise RateLimited(
                f"You have {self._running_limit} replies streaming already; wait for one to finish.",
                RUNNING_RETRY_SECONDS,
            )
        if verdict.why == MESSAGES:
            raise RateLimited(
                f"You sent {self._messages_limit} messages in the last minute; wait a moment.", verdict.wait
            )
        raise TurnInProgress()

    async def give_back(self, taken: Taken) -> None:
        await self._messages.give_back(taken)

    async def turn_ended(self, user: str) -> None:
        await self._messages.ended(user)

    async def take_conversation(self, user: str) -> None:
        """Count a new conversation, or refuse it."""
        wait, event = await self._conversations.take(user)
        if event is None:
            raise RateLimited(
                f"You started {self._conversations.limit} conversations in the last minute; wait a moment.", wait
            )

    async def take_hello(self, user: str) -> None:
        """Count a hello (a conversation opened on a socket, known or not), or refuse it."""
        wait, event = await self._hellos.take(user)
        if event is None:
            raise RateLimited(f"You opened {self._hellos.limit} conversations in the last minute; wait a moment.", wait)

    async def take_change(self, user: str) -> None:
        """Count a change of a conversation (a rename, a new model or system prompt, a delete), or refuse it."""
        wait, event = await self._changes.take(user)
        if event is None:
            raise RateLimited(
                f"You changed conversations {self._changes.limit} times in the last minute; wait a moment.", wait
            )

    async def take_search(self, user: str) -> None:
        """Count a search, or refuse it."""
        wait, event = await self._searches.take(user)
        if event is None:
            raise RateLimited(f"You searched {self._searches.limit} times in the last minute; wait a moment.", wait)

    async def take_tool_call(self, user: str) -> None:
        """Count a tool call the model makes in one of the user's replies, or refuse it."""
        wait, event = await self._tool_calls.take(user)
        if event is None:
            raise RateLimited(
                f"The model made {self._tool_calls.limit} tool calls in your replies in the last minute; "
                "wait a moment.",
                wait,
            )

    async def take_socket(self, user: str) -> None:
        """Count an open socket (`socket_closed` when it closes), or refuse it."""
        if not await self._sockets.take(user):
            raise RateLimited(
                f"You have {self._sockets.limit} tabs open already; close one and reload.", RUNNING_RETRY_SECONDS
            )

    async def socket_closed(self, user: str) -> None:
        await self._sockets.remove(user)

    async def take_sign_in(self, address: str) -> SignInAttempt | float:
        """Count a sign-in attempt as failed before its token is checked (attempts sent together cannot
        all pass the check), under its address and in all; or the seconds to wait if either window is
        full. An attempt whose token is right is uncounted (`succeeded`)."""
        group = address_group(address)
        wait, mine = await self._failed_sign_ins.take(group)
        if mine is None:
            return wait
        wait, everyone = await self._all_failed_sign_ins.take(ALL)
        if everyone is None:
            await self._failed_sign_ins.forget(group, mine)
            return wait
        return SignInAttempt(group, (mine, everyone))

    async def succeeded(self, attempt: SignInAttempt) -> None:
        await self._failed_sign_ins.forget(attempt.address, attempt.events[0])
        await self._all_failed_sign_ins.forget(ALL, attempt.events[1])
