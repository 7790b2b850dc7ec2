"""The per-user limits across replicas, on a real Redis: bursts split between two replicas, an empty
Redis restart under open sockets, and the count of a replica that was killed."""

import pytest
import redis

from pocketchat.cluster.counters import REFRESH_SECONDS
from tests.conftest import AppProcess
from tests.test_auth import sign_in
from tests.test_limits import TOKEN, at_once, first_frame
from tests.test_protocol import wait_for

pytestmark = pytest.mark.parametrize("mode", ["replicas"], indirect=True)


def sockets_gauge(url: str, prefix: str) -> tuple[dict[str, int], int]:
    """The sockets gauge of the one local user: each replica's count, and the key's time to live (ms)."""
    client = redis.Redis.from_url(url)
    try:
        key = f"{prefix}gauge:sockets:local"
        fields = {name.decode(): int(value.split()[0]) for name, value in client.hgetall(key).items()}
        return fields, client.pttl(key)
    finally:
        client.close()


def healthy(app: AppProcess) -> bool:
    try:
        return app.get("/healthz")["status"] == "ok"
    except OSError:  # 503 (an HTTPError), or not answering
        return False


def both(replicas: list[AppProcess], frame: dict) -> list[str]:
    """80 sockets opened at once, every other one on each replica."""
    return at_once(80, lambda i: first_frame(replicas[i % 2], frame))


def test_a_burst_split_between_two_replicas_passes_no_limit(start_app):
    replicas = [start_app("--limit-sockets", "20") for _ in range(2)]
    assert sorted(both(replicas, {"type": "hello"})) == ["rate_limited"] * 60 + ["ready"] * 20
    for app in replicas:
        app.kill()
    replicas = [start_app("--limit-conversations-per-minute", "30") for _ in range(2)]
    assert sorted(both(replicas, {"type": "hello"})) == ["rate_limited"] * 50 + ["ready"] * 30
    replicas = [start_app("--auth", "token", "--token", TOKEN) for _ in range(2)]
    statuses = at_once(200, lambda i: sign_in(replicas[i % 2], f"wrong-token-number-{i:04}")[0].status)
    assert sorted(statuses) == [401] * 5 + [429] * 195


def test_after_an_empty_redis_restart_the_sockets_limit_still_holds_and_never_goes_negative(
    start_app, private_redis, redis_prefix
):
    """Before: the gauge was added to and taken from, so closing six sockets after Redis came back
    empty left it at -6, and the limit let twice as many in."""
    app = start_app("--limit-sockets", "6", "--redis-url", private_redis.url)
    other = start_app("--limit-sockets", "6", "--redis-url", private_redis.url)
    held = [app.client() for _ in range(6)]
    assert [client.hello()["type"] for client in held] == ["ready"] * 6
    private_redis.stop()
    private_redis.start()  # empty
    wait_for(lambda: healthy(app) and healthy(other), timeout=20)
    assert first_frame(app, {"type": "hello"}) == "rate_limited"  # this replica knows its own six
    # The other replica learns them once this one writes its counts again.
    wait_for(lambda: sockets_gauge(private_redis.url, redis_prefix)[0], timeout=REFRESH_SECONDS + 5)
    assert first_frame(other, {"type": "hello"}) == "rate_limited"
    for client in held:
        client.close()
    wait_for(lambda: sum(sockets_gauge(private_redis.url, redis_prefix)[0].values()) == 0)
    counts, ttl = sockets_gauge(private_redis.url, redis_prefix)
    assert all(count >= 0 for count in counts.values()) and ttl > 0
    assert sorted(first_frame(app, {"type": "hello"}) for _ in range(7)) == ["rate_limited"] + ["ready"] * 6


def test_a_killed_replicas_count_is_dropped_and_the_gauge_expires(start_app, redis_server, redis_prefix):
    """Before: every replica ever started kept its field, and the key had no time to live."""
    dead = start_app("--limit-sockets", "3")
    assert [dead.client().hello()["type"] for _ in range(3)] == ["ready"] * 3
    assert list(sockets_gauge(redis_server, redis_prefix)[0].values()) == [3]
    dead.kill()  # SIGKILL: its sockets are never closed
    alive = start_app("--limit-sockets", "3")
    # Once its heartbeat has expired, its three no longer count, and its field goes.
    wait_for(lambda: first_frame(alive, {"type": "hello"}) == "ready", timeout=15)
    assert sorted(first_frame(alive, {"type": "hello"}) for _ in range(3)) == ["rate_limited"] + ["ready"] * 2
    counts, ttl = sockets_gauge(redis_server, redis_prefix)
    assert list(counts.values()) == [3] and 0 < ttl <= 60_000
