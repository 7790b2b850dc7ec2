"""Replicas benchmark: conversations each with a socket that sends the message and a follower socket,
through the whole app, in three ways measured in the same run:

- `direct`: the leanest read of the fake provider (aiohttp reading the SSE lines, no SDK, no app);
- `single`: one process on SQLite, both sockets on it;
- `replicas`: two replicas on PostgreSQL and Redis behind nginx (deploy/), the two sockets of a
  conversation on different replicas (round-robin), so every chunk crosses Redis to the follower.

The apps run with every per-user limit on, as by default, but set too high to refuse anything: the
checks and counts are part of what is measured. It reports time to first chunk (p50, p99) at the
sending socket, wall time, chunks/s and the app processes' CPU time per chunk (for `direct`, the
bench process's own, and the apps' as a multiple of it), checks that every
reply arrived complete and in order on both sockets (a failure is printed: which way, which
socket, what it saw), and prints replicas/single ratios (target at 300: p99 first chunk within 3x,
wall within 1.5x, no failure). Last, it measures what batching the Redis copies once per event-loop
tick saves over one XADD per chunk. With `--turns`, the replies are one chunk each, unpaced, and it
reports the CPU time per turn started instead (the turn's start dominates it).

    .venv/bin/python -m bench.cluster [--conversations 300] [--repeat 3] [--turns]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis
import uvloop
import websockets

from bench.load import HIGH_LIMITS, PACE_MS
from bench.readers import TOKENS, Run, cpu_seconds, direct, expected, summarize
from pocketchat.cluster.produced_log import Copier, ProducedLog
from pocketchat.cluster.redis_link import RedisLink
from tests.cluster import TOKEN, Nginx, sign_in, start_replica
from tests.conftest import ROOT, AppProcess, seqs_of
from tests.services import REDIS_URL, free_port, fresh_database, fresh_redis_prefix

SETUP_SECONDS = 30  # a hello unanswered this long stops the benchmark, saying where


async def follow(
    ws: websockets.ClientConnection, start: float | None, hello: dict, tokens: int
) -> tuple[float | None, int, str]:
    """Read one turn on a socket whose hello was answered `hello`: time to its first chunk (from
    `start`), chunks, and what was wrong with the reply ("": it arrived complete and in order)."""
    if hello["type"] != "ready":
        return None, 0, f"hello answered {hello['type']} {hello.get('code', '')}"
    first, text, seqs, errors = None, [], [], []
    try:
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))  # a reply that never ends is a failure
            if frame["type"] == "chunk":
                if start is not None and first is None:
                    first = time.perf_counter() - start
                text.append(frame["content"])
                seqs.extend(seqs_of(frame))
            elif frame["type"] == "error":
                errors.append(f"{frame['code']} ({frame.get('message')})")
            elif frame["type"] == "turn_end":
                return first, len(seqs), fault(frame["status"], seqs, "".join(text), errors, tokens)
    except (TimeoutError, websockets.ConnectionClosed) as error:
        return first, len(seqs), f"{len(seqs)} chunks, then {error!r}"


def fault(status: str, seqs: list[int], text: str, errors: list[str], tokens: int) -> str:
    """What is wrong with a reply that ended ("": nothing): its status, errors, the first seq out of place."""
    wrong = [f"error {code}" for code in errors]
    if (due := next((i for i, seq in enumerate(seqs, 1) if seq != i), None)) is not None:
        wrong.append(f"seq {seqs[due - 1]} where {due} was due")  # higher: one missing; lower: one twice
    elif len(seqs) != tokens or text != expected(tokens):
        wrong.append("text differs")
    if status != "complete" or wrong:
        return ", ".join([f"{len(seqs)} chunks, turn_end {status}", *wrong])
    return ""


async def through_app(url: str, n: int, pids: list[int], headers: dict[str, str], tokens: int) -> Run:
    """n conversations: a socket sends the message, a second socket (the next connection: with
    replicas, nginx's round-robin puts it on the other replica) follows the same reply."""
    step = ""

    async def pair() -> tuple:
        nonlocal step
        step = "the sender's connect"
        sender = await websockets.connect(url, max_size=None, additional_headers=headers)
        step = "the sender's hello"
        await sender.send('{"type":"hello"}')
        ready = json.loads(await sender.recv())
        step = "the follower's connect"
        follower = await websockets.connect(url, max_size=None, additional_headers=headers)
        step = "the follower's hello"
        await follower.send(json.dumps({"type": "hello", "session_id": ready["session_id"]}))
        return sender, ready, follower, json.loads(await follower.recv())

    pairs = []
    for i in range(n):
        try:
            pairs.append(await asyncio.wait_for(pair(), SETUP_SECONDS))
        except TimeoutError:
            raise RuntimeError(f"{url}, conversation {i + 1}: {step} took over {SETUP_SECONDS} s") from None

    async def one(
        sender: websockets.ClientConnection, ready: dict, follower: websockets.ClientConnection, answer: dict
    ) -> tuple:
        start = time.perf_counter()
        await sender.send('{"type":"message","content":"hi"}')
        sent, followed = await asyncio.gather(
            follow(sender, start, ready, tokens), follow(follower, None, answer, tokens)
        )
        why = "; ".join(f"{who}: {read[2]}" for who, read in (("sender", sent), ("follower", followed)) if read[2])
        return sent[0], sent[1], not why, why

    cpu_before = cpu_seconds(pids)
    start = time.perf_counter()
    results = await asyncio.gather(*(one(*pair) for pair in pairs), return_exceptions=True)
    wall = time.perf_counter() - start
    cpu = cpu_seconds(pids) - cpu_before
    await asyncio.gather(*(pair[i].close() for pair in pairs for i in (0, 2)))
    return summarize(results, wall, cpu)


async def batching(n: int) -> tuple[float, float]:
    """Seconds to copy n chunk entries to a Redis stream: once per event-loop tick (the app's way, a
    burst of appends in one tick goes as one call), and one awaited XADD per chunk."""
    link = RedisLink(REDIS_URL, f"pocketchat_bench_{os.getpid()}:", "bench")
    await link.client.set(link.lease("c1"), "t1 r1 bench")
    log = ProducedLog("t1", "c1", "t1 r1 bench", Copier(link, lambda turn, error: print("copy failed:", error)))
    start = time.perf_counter()
    for i in range(n):
        log.append_chunk(f"tok{i} ")
        if i % 10 == 9:
            await asyncio.sleep(0)  # a provider's chunks arrive a few per tick under load
    await log.copied()
    batched = time.perf_counter() - start
    one_by_one = aioredis.from_url(REDIS_URL)
    start = time.perf_counter()
    for i in range(n):
        await one_by_one.xadd(link.stream("t2"), {"f": f"tok{i} "}, id=f"{i + 1}-0")
    per_chunk = time.perf_counter() - start
    await one_by_one.delete(link.stream("t1"), link.stream("t2"), link.lease("c1"))
    await one_by_one.aclose()
    await link.aclose()
    return batched, per_chunk


def report(runs: dict[str, list[Run]], n: int) -> dict[str, dict[str, float]]:
    """Each way's medians, printed; `cpu_turn_us`: the CPU time per conversation's turn."""
    medians = {}
    for who, rs in runs.items():
        chunks = statistics.median(r.chunks for r in rs)
        m = {
            "p50": statistics.median(r.p(0.5) for r in rs),
            "p99": statistics.median(r.p(0.99) for r in rs),
            "wall": statistics.median(r.wall for r in rs),
            "rate": statistics.median(r.chunks / r.wall for r in rs),
            "cpu_us": statistics.median(r.cpu / r.chunks * 1e6 for r in rs) if chunks and rs[0].cpu else 0.0,
            "cpu_turn_us": statistics.median(r.cpu / n * 1e6 for r in rs),
            "failed": sum(r.failures for r in rs),
        }
        medians[who] = m
        print(
            f"{n:>5} {who:>9} {m['p50']:>7.1f}ms {m['p99']:>7.1f}ms {m['wall']:>7.2f} {m['rate']:>9.0f}"
            f" {m['cpu_us']:>9.0f} {m['cpu_turn_us']:>10.0f} {m['failed']:>6}"
        )
    return medians


async def measure(
    n: int, repeat: int, fake_url: str, single: AppProcess, balancer: Nginx, replicas: list, tokens: int
) -> None:
    pace = PACE_MS if tokens == TOKENS else 0
    print(f"fake provider: {tokens} chunks, {pace} ms apart; {n} conversations, 2 sockets each; {repeat} runs")
    print(f"\n{'conv':>5} {'who':>9} {'p50 ttft':>9} {'p99 ttft':>9} {'wall s':>7} {'chunks/s':>9} {'cpu us/ch':>9}"
          f" {'cpu us/turn':>10} {'failed':>6}")  # fmt: skip
    runs: dict[str, list[Run]] = {"direct": [], "single": [], "replicas": []}
    for _ in range(repeat):
        runs["direct"].append(await direct(fake_url, n, tokens))
        runs["single"].append(await through_app(single.ws_url, n, [single.process.pid], {}, tokens))
        pids = [replica.process.pid for replica in replicas]
        cookie = {"Cookie": sign_in(replicas[0].url)}
        runs["replicas"].append(await through_app(balancer.ws_url, n, pids, cookie, tokens))
    m = report(runs, n)
    failed = [f"{who}, run {i}: {why}" for who, rs in runs.items() for i, r in enumerate(rs, 1) for why in r.why]
    for line in failed[:10]:
        print("failed", line)
    if len(failed) > 10:
        print(f"... and {len(failed) - 10} more")
    rep, one = m["replicas"], m["single"]
    print(
        f"\nreplicas/single: p99 first chunk x{rep['p99'] / one['p99']:.2f} (target <= 3), wall"
        f" x{rep['wall'] / one['wall']:.2f} (target <= 1.5), CPU per chunk x{rep['cpu_us'] / one['cpu_us']:.2f},"
        f" failures {rep['failed'] + one['failed']}"
    )
    lean = m["direct"]
    print(f"single/direct: p99 first chunk x{one['p99'] / lean['p99']:.2f}, wall x{one['wall'] / lean['wall']:.2f}")
    # The direct read's CPU is the bench process's own: each chunk it counts was read once, where the
    # apps' was also sent to two sockets.
    print(
        f"CPU per chunk against the direct read's: single x{one['cpu_us'] / lean['cpu_us']:.2f},"
        f" replicas x{rep['cpu_us'] / lean['cpu_us']:.2f}"
    )
    if tokens != TOKENS:
        # One chunk each: what a turn costs, start to end, against the direct read's per request.
        per_request = lean["cpu_turn_us"]
        print(
            f"CPU per turn: single {one['cpu_turn_us']:.0f} us (x{one['cpu_turn_us'] / per_request:.2f} of the"
            f" direct read's), replicas {rep['cpu_turn_us']:.0f} us (x{rep['cpu_turn_us'] / per_request:.2f})"
        )
        return
    batched, per_chunk = await batching(10_000)
    print(f"\ncopying 10000 chunks to Redis: once per tick {batched:.2f} s, one XADD per chunk {per_chunk:.2f} s"
          f" (x{per_chunk / batched:.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--turns", action="store_true", help="one-chunk replies: CPU per turn started")
    args = parser.parse_args()
    tokens, pace = (1, 0) if args.turns else (TOKENS, PACE_MS)
    fake_port = free_port()
    fake_url = f"http://127.0.0.1:{fake_port}/v1"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as database_url, fresh_redis_prefix("bench") as prefix:
        fake = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_openai", "--port", str(fake_port), "--tokens", str(tokens),
             "--pace-ms", str(pace)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        quiet = ["--model", "fake-model", "--log-level", "warning", *HIGH_LIMITS]
        single = AppProcess(Path(tmp) / "single", ["--base-url", fake_url, "--api-key", "bench", *quiet])
        (Path(tmp) / "single").mkdir()
        shared = {
            "POCKETCHAT_DATABASE_URL": database_url,
            "POCKETCHAT_REDIS_URL": REDIS_URL,
            "POCKETCHAT_REDIS_PREFIX": prefix,
            "POCKETCHAT_TOKEN": TOKEN,
        }
        replicas: list[AppProcess] = []
        balancer = None
        try:
            time.sleep(1)
            single.start()
            replicas = [start_replica(Path(tmp), fake_port, shared, *quiet) for _ in range(2)]
            balancer = Nginx(Path(tmp) / "nginx", [replica.port for replica in replicas]).start()
            uvloop.run(measure(args.conversations, args.repeat, fake_url, single, balancer, replicas, tokens))
        finally:
            for app in (single, *replicas):
                try:
                    app.stop()
                except AssertionError as error:  # said, and the rest still cleaned up
                    print(f"an app (pid {app.process.pid}) did not stop within 30 s of SIGINT: killed it; {error}")
                    app.kill()
            if balancer is not None:
                balancer.stop()
            fake.terminate()
            fake.wait()


if __name__ == "__main__":
    main()
