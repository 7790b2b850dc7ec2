"""The Redis side of replicas on a real Redis: fencing, the takeover of a dead replica's turn, and
the refusal to share Redis without a shared database."""

import asyncio
import subprocess
import sys

from pocketchat.cluster.redis_link import ALIVE, Batch, RedisLink
from tests.conftest import ROOT


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_producer_whose_turn_was_taken_over_can_append_nothing_more(redis_server, redis_prefix):
    async def scenario() -> tuple[list[bool], int | None, list[bool], list[str]]:
        producer = RedisLink(redis_server, redis_prefix, "producer")
        other = RedisLink(redis_server, redis_prefix, "other")
        lease = "t1 r1 producer"
        assert await producer.client.set(producer.lease("c1"), lease)
        first = await producer.append([Batch("t1", "c1", lease, [("0-1", '{"type":"turn_start"}')], False)])
        # The producer's heartbeat is not beating (as after SIGKILL): another replica ends its turn.
        seq = await other.take_over("t1", "c1", "producer", '{"type":"error"}', '{"type":"turn_end"}')
        late = await producer.append([Batch("t1", "c1", lease, [("1-0", '{"type":"chunk"}')], False)])
        entries = [frame for _, frame in await other.entries("t1")]
        await producer.aclose()
        await other.aclose()
        return first, seq, late, entries

    first, seq, late, entries = run(scenario())
    assert first == [True]
    assert seq == 0
    assert late == [False]  # fenced: the takeover dropped its lease
    assert entries == ['{"type":"turn_start"}', '{"type":"error"}', '{"type":"turn_end"}']


def test_a_live_producers_turn_is_not_taken_over(redis_server, redis_prefix):
    async def scenario() -> int | None:
        producer = RedisLink(redis_server, redis_prefix, "producer")
        producer.start_heartbeat(redis_server)
        lease = "t2 r2 producer"
        await producer.client.set(producer.lease("c2"), lease)
        await producer.append([Batch("t2", "c2", lease, [("0-1", '{"type":"turn_start"}')], False)])
        await asyncio.sleep(0.2)  # a beat
        other = RedisLink(redis_server, redis_prefix, "other")
        seq = await other.take_over("t2", "c2", "producer", "{}", "{}")
        await producer.aclose()
        await other.aclose()
        return seq

    assert run(scenario()) == ALIVE  # and it is watched on


def test_redis_without_a_shared_database_is_refused_at_start(tmp_path):
    command = [sys.executable, str(ROOT / "main.py"), "--redis-url", "redis://127.0.0.1:6379/0"]
    command += ["--db-path", str(tmp_path / "c.db")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0
    assert "--redis-url needs --database-url" in refused.stderr
