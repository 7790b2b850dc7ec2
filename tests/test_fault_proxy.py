"""The tests' own fault proxy (tests/services.py) does what the fault tests count on."""

import asyncio
import contextlib
import gc
import socket
import threading
import time
import warnings

import asyncpg
import pytest
import redis

from tests.services import FaultProxy


def test_a_stalled_redis_answers_nothing_until_healed_and_a_cut_one_refuses(redis_server, fault_proxy):
    proxy: FaultProxy = fault_proxy(redis_server)
    client = redis.Redis.from_url(proxy.url(redis_server), socket_timeout=0.5)
    assert client.ping()
    proxy.stall()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    proxy.heal()
    client.connection_pool.disconnect()  # the timed-out connection's answer may still be on its way
    assert client.ping()
    proxy.cut()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    proxy.heal()
    assert client.ping()
    client.close()


def test_a_cut_postgresql_connection_is_lost_and_a_new_one_works_once_healed(postgres_server, fault_proxy):
    proxy: FaultProxy = fault_proxy(postgres_server)

    async def run() -> None:
        db = await asyncpg.connect(proxy.url(postgres_server), timeout=5)
        assert await db.fetchval("SELECT 1") == 1
        proxy.stall()
        with pytest.raises(TimeoutError):
            await db.fetchval("SELECT 2", timeout=0.5)
        proxy.cut()
        with pytest.raises((asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)):
            await db.fetchval("SELECT 3", timeout=2)
        db.terminate()
        proxy.heal()
        again = await asyncpg.connect(proxy.url(postgres_server), timeout=5)
        assert await again.fetchval("SELECT 4") == 4
        await again.close()

    asyncio.run(run())


def stop_under_reconnects(url: str) -> None:
    """Stop a proxy while four clients connect to it again and again (as replicas that lost their Redis)."""
    proxy = FaultProxy.before(url)
    stop = threading.Event()
    opened: list[socket.socket] = []

    def connect_again_and_again() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                opened.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5))
                opened[-1].sendall(b"PING\r\n")

    clients = [threading.Thread(target=connect_again_and_again) for _ in range(4)]
    for client in clients:
        client.start()
    time.sleep(0.05)
    proxy.stop()
    stop.set()
    for client in clients:
        client.join()
    for opened_socket in opened:
        opened_socket.close()


def test_stopping_the_proxy_while_clients_keep_connecting_leaves_no_socket_open_and_no_task_pending(
    redis_server, caplog
):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(5):
            stop_under_reconnects(redis_server)
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
    assert "Task was destroyed but it is pending" not in caplog.text
