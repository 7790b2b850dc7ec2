"""Load benchmark: PocketChat against reading the provider directly, in the same run.

Each measure runs the whole app (WebSocket client → app → fake provider) with sign-in on (a session
cookie), every per-user limit on (set too high to refuse the bench's one user) and metrics on, and
against it, in the bench's own process, the leanest read of the same fake:

- `direct`: aiohttp reading the fake's SSE lines, parsed by hand (no SDK, no app), a new connection
  for each conversation: issue 21's baseline, its targets' "limit";
- `pooled`: the same read on connections kept from the runs before (as the app's pool keeps them):
  the true limit, and a steadier one (a burst of new connections swings the direct read's p99 by 2x);
- `sdk` (not with --quick): the openai SDK the plain way, `chat.completions.create()`;
- `provider` (not with --quick): the app's own `OpenAIProvider.open_stream`, without the app;
- `relay`: a lean WebSocket app between the same client and the fake (`bench/relay.py`): the
  reference for any app in between, which the direct read is not (it has no socket to the client).

Three measures:

- burst: N conversations at once (default 100 and 300), the fake streaming 100 chunks 20 ms apart;
  each client has said hello and sends one message. Time to first chunk (p50, p99), wall, chunks/s,
  failures (every reply checked complete and in order), the app's CPU per chunk delivered;
- stream: one reply of 5,000 chunks with no pacing: chunks/s and the app's CPU per chunk;
- turns: 300 conversations at once whose replies are one chunk: the app's CPU per turn started.

CPU is the app process's user+system time across the measure (psutil). It prints medians of the
repetitions with their spread (min-max), the ratios app/direct against issue 21's targets, then the
floors (pooled and relay, against direct) and what PocketChat costs beyond each (app/pooled,
app/relay), and
checks the CPU budgets (multiples of the direct read's CPU): it exits 1 when a median is over budget
or any reply failed.

    .venv/bin/python -m bench.load [--quick] [--levels 100,300] [--repeat 3]
"""

import argparse
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

from bench.readers import TOKENS, App, Run, direct, provider_baseline, sdk_baseline, through_app
from pocketchat.providers.openai_compatible import KEEPALIVE_SECONDS, OpenAIProvider
from tests.cluster import TOKEN, sign_in
from tests.conftest import AppProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
PACE_MS = 20
STREAM_TOKENS = 5000
TURNS = 300
# Every limit checked and counted, as by default, but too high to refuse the bench's one user its
# sockets and conversations at once.
HIGH_LIMITS = [
    *("--limit-running-turns", "100000", "--limit-messages-per-minute", "100000"),
    *("--limit-sockets", "100000", "--limit-conversations-per-minute", "100000"),
    *("--limit-hellos-per-minute", "100000", "--limit-changes-per-minute", "100000"),
]
# The app's CPU budgets (docs/benchmarks.md), as multiples of the direct read's CPU in the same run (a
# busy machine inflates both alike; absolute figures swung by half between runs of the same code):
# per chunk delivered in the 5,000-chunk stream, per turn started in the burst of one-chunk turns.
# Set a little above what the code measures, so that a change that costs more fails the run.
BUDGET_PER_CHUNK = 2.0
BUDGET_PER_TURN = 4.0


def wait_http(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError as error:
            if getattr(error, "code", None):  # an HTTP error: the server is up
                return
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def spread(values: list[float], form: str) -> str:
    """The median, and the runs' spread: `median (min-max)`."""
    return f"{format(statistics.median(values), form)} ({format(min(values), form)}-{format(max(values), form)})"


def median(runs: list[Run], what: Callable[[Run], float]) -> float:
    return statistics.median(what(r) for r in runs)


def ratio(runs: list[Run], base: list[Run], what: Callable[[Run], float]) -> float:
    """The median of `what` over `runs`, as a multiple of its median over `base`."""
    return median(runs, what) / median(base, what)


def show(label: str, runs: list[Run]) -> None:
    print(
        f"{label:>14}  p50 {spread([r.p(0.5) for r in runs], '.0f'):>17} ms"
        f"  p99 {spread([r.p(0.99) for r in runs], '.0f'):>17} ms"
        f"  wall {spread([r.wall for r in runs], '.2f'):>18} s"
        f"  {spread([r.rate for r in runs], '.0f'):>21} chunks/s"
        f"  cpu {spread([r.cpu_us_per_chunk for r in runs], '.0f'):>14} us/chunk"
        f"  failed {sum(r.failures for r in runs)}"
    )


@dataclass
class Fakes:
    """The fake providers' URLs: the paced one of the bursts, the unpaced long one, the one-chunk one."""

    burst: str
    stream: str
    turns: str


async def measure(
    levels: list[int], repeat: int, quick: bool, fakes: Fakes, apps: dict[str, App], relays: dict[str, App]
) -> bool:
    """Run every measure; whether every reply arrived whole and the CPU stayed within budget. `apps` and
    `relays`: PocketChat and the relay, by the fake they read ("burst", "stream", "turns")."""
    # The pooled read keeps its connections as long as the app's pool does (and the relay's); no
    # limit, as the direct read.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
    async with aiohttp.ClientSession(connector=connector) as pool:
        runs = await bursts(levels, repeat, quick, fakes, apps, relays, pool)
        streams: dict[str, list[Run]] = {"direct": [], "relay": [], "app": []}
        print(f"\nstream: one reply of {STREAM_TOKENS} chunks, unpaced")
        for _ in range(repeat):
            streams["direct"].append(await direct(fakes.stream, 1, STREAM_TOKENS))
            streams["relay"].append(await through_app(relays["stream"], 1, STREAM_TOKENS))
            streams["app"].append(await through_app(apps["stream"], 1, STREAM_TOKENS))
        for name, rs in streams.items():
            show(f"stream {name}", rs)
        print(f"\nturns: {TURNS} conversations at once, one-chunk replies")
        await direct(fakes.turns, TURNS, 1, pool)  # the pooled read's connections to this fake, opened
        turns: dict[str, list[Run]] = {"direct": [], "pooled": [], "relay": [], "app": []}
        for _ in range(repeat):
            turns["direct"].append(await direct(fakes.turns, TURNS, 1))
            turns["pooled"].append(await direct(fakes.turns, TURNS, 1, pool))
            turns["relay"].append(await through_app(relays["turns"], TURNS, 1))
            turns["app"].append(await through_app(apps["turns"], TURNS, 1))
        for name, rs in turns.items():
            show(f"turns {name}", rs)
            print(f"{'':>14}  cpu {spread([r.cpu / TURNS * 1e6 for r in rs], '.0f')} us/turn")
    return report(levels, quick, runs, streams, turns)


async def bursts(
    levels: list[int],
    repeat: int,
    quick: bool,
    fakes: Fakes,
    apps: dict[str, App],
    relays: dict[str, App],
    pool: aiohttp.ClientSession,
) -> dict[tuple[str, int], list[Run]]:
    """The bursts of `levels` conversations at once, by who read them and how many."""
    provider = OpenAIProvider(fakes.burst, "bench", "fake-model", idle_limit=30.0)
    runs: dict[tuple[str, int], list[Run]] = {}
    who = ["direct", "pooled", "relay", "app"] if quick else ["direct", "pooled", "sdk", "provider", "relay", "app"]
    print(f"burst: {TOKENS} chunks {PACE_MS} ms apart; {repeat} runs, median (min-max) of the runs")
    for n in levels:
        await direct(fakes.burst, n, pool=pool)  # the pooled read's connections, opened before it is measured
        for _ in range(repeat):
            for name in who:
                if name == "direct":
                    run = await direct(fakes.burst, n)
                elif name == "pooled":
                    run = await direct(fakes.burst, n, pool=pool)
                elif name == "sdk":
                    run = await sdk_baseline(fakes.burst, n)
                elif name == "provider":
                    run = await provider_baseline(provider, n)
                elif name == "relay":
                    run = await through_app(relays["burst"], n)
                else:
                    run = await through_app(apps["burst"], n)
                runs.setdefault((name, n), []).append(run)
        for name in who:
            show(f"{n} {name}", runs[(name, n)])
    await provider.aclose()
    return runs


def report(
    levels: list[int],
    quick: bool,
    runs: dict[tuple[str, int], list[Run]],
    streams: dict[str, list[Run]],
    turns: dict[str, list[Run]],
) -> bool:
    """Print the ratios and the CPU budgets; whether every reply arrived whole and the CPU stayed within budget."""
    wall, p99 = operator.attrgetter("wall"), lambda r: r.p(0.99)
    rate, per_chunk, cpu = (operator.attrgetter(name) for name in ("rate", "cpu_us_per_chunk", "cpu"))
    print("\napp/direct, medians (issue 21's targets in brackets):")
    for n in levels:
        app, lean = runs[("app", n)], runs[("direct", n)]
        print(
            f"  {n} at once: wall x{ratio(app, lean, wall):.2f} [<= 1.3],"
            f" p99 first chunk x{ratio(app, lean, p99):.2f} [<= 2], failures {sum(r.failures for r in app)} [0]"
        )
        if not quick:
            for base in ("sdk", "provider"):
                other = runs[(base, n)]
                walls, p99s = ratio(app, other, wall), ratio(app, other, p99)
                print(f"  {n} at once vs {base}: wall x{walls:.2f}, p99 first chunk x{p99s:.2f}")
    print(f"  one stream: chunks/s x{ratio(streams['app'], streams['direct'], rate):.2f} [>= 0.5]")

    print("\nthe floors against direct (pooled, relay), and what PocketChat costs beyond each (app/pooled, app/relay):")
    for n in levels:
        app, lean, pooled, relay = (runs[(name, n)] for name in ("app", "direct", "pooled", "relay"))
        for what, of in (("wall", wall), ("p99 first chunk", p99)):
            floors = f"x{ratio(pooled, lean, of):.2f}, x{ratio(relay, lean, of):.2f}"
            print(f"  {n} at once: {what} {floors}; app x{ratio(app, pooled, of):.2f}, x{ratio(app, relay, of):.2f}")
    floors = f"x{ratio(turns['pooled'], turns['direct'], cpu):.2f}, x{ratio(turns['relay'], turns['direct'], cpu):.2f}"
    beyond = f"x{ratio(turns['app'], turns['pooled'], cpu):.2f}, x{ratio(turns['app'], turns['relay'], cpu):.2f}"
    print(f"  CPU per turn started: {floors}; app {beyond}")
    for what, of in (("chunks/s", rate), ("CPU per chunk", per_chunk)):
        floor, beyond = ratio(streams["relay"], streams["direct"], of), ratio(streams["app"], streams["relay"], of)
        print(f"  one stream, {what}: relay x{floor:.2f}; app x{beyond:.2f}")

    chunk_ratio, turn_ratio = (
        ratio(streams["app"], streams["direct"], per_chunk),
        ratio(turns["app"], turns["direct"], cpu),
    )
    print(
        f"\nCPU budget: {median(streams['app'], per_chunk):.0f} us per chunk, x{chunk_ratio:.2f} of the direct read's"
        f" (budget x{BUDGET_PER_CHUNK:g}); {median(turns['app'], cpu) / TURNS * 1e6:.0f} us per turn started,"
        f" x{turn_ratio:.2f} of the direct read's per request (budget x{BUDGET_PER_TURN:g})"
    )
    failed = [why for rs in (*runs.values(), *streams.values(), *turns.values()) for r in rs for why in r.why]
    for line in failed[:10]:
        print("failed:", line)
    within = chunk_ratio <= BUDGET_PER_CHUNK and turn_ratio <= BUDGET_PER_TURN
    if not within:
        print("OVER BUDGET")
    return within and not failed


def start_fake(port: int, tokens: int, pace_ms: float) -> subprocess.Popen[bytes]:
    return start_module("tests.fake_openai", "--port", str(port), "--tokens", str(tokens), "--pace-ms", str(pace_ms))


def start_module(module: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -m module args` from the checkout's root."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default=None, help="conversations at once, comma-separated (default 100,300)")
    parser.add_argument("--repeat", type=int, default=3)
    quick = "300 at once only, without the sdk and provider baselines"
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args()
    levels = [int(level) for level in (args.levels or ("300" if args.quick else "100,300")).split(",")]
    shapes = {"burst": (TOKENS, PACE_MS), "stream": (STREAM_TOKENS, 0), "turns": (1, 0)}
    ports = {name: free_port() for name in shapes}
    urls = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
    fakes = [start_fake(ports[name], *shape) for name, shape in shapes.items()]
    relay_ports = {name: free_port() for name in shapes}
    relay_processes = {
        name: start_module("bench.relay", "--port", str(port), "--base-url", urls[name])
        for name, port in relay_ports.items()
    }
    processes: list[AppProcess] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            apps = {}
            for name, url in urls.items():
                wait_http(f"{url}/models")
                (Path(tmp) / name).mkdir()
                process = AppProcess(
                    Path(tmp) / name,
                    ["--base-url", url, "--api-key", "bench", "--model", "fake-model", "--log-level", "warning",
                     "--auth", "token", *HIGH_LIMITS],
                    {"POCKETCHAT_TOKEN": TOKEN},
                )  # fmt: skip
                processes.append(process.start())
                apps[name] = App(process.ws_url, sign_in(process.url), process.process.pid)
            relays = {}
            for name, port in relay_ports.items():
                wait_http(f"http://127.0.0.1:{port}/")
                relays[name] = App(f"ws://127.0.0.1:{port}/ws", "", relay_processes[name].pid)
            ok = uvloop.run(measure(levels, args.repeat, args.quick, Fakes(**urls), apps, relays))
        finally:
            for process in processes:
                process.stop()
            for server in (*fakes, *relay_processes.values()):
                server.terminate()
                server.wait()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
