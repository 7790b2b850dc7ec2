"""Hostile-input bench (issue 30: no single user stalls the server). For each row of the issue's table,
an app (`python main.py`, sign-in by a trusted header so that users are distinct, default limits but bob's
messages) against the fake provider (bench/hostile_fake.py: tests/fake_openai.py in a process of its own)
is measured in two runs, each on an app of its own:

- quiet: bob chats (short turns over the WebSocket, each sent when the last ended), a poller asks
  /livez every 50 ms without waiting for the last answer (a stall shows in every request it holds), and
  bob keeps making one small request of the row's kind (his probe: a 20-byte .txt, an 8x8 PNG...);
- hostile: the same while mallory replays the row's input (tests/hostile_files.py; what she does with it:
  bench/hostile_rows.py), until she has her answer (the server's follow-up work included: indexing,
  writing an import) and bob has had his turns, or the row's timeout (a stall that never ends: the app
  is killed, the row reported missed with what was seen). Rows 11-12 are an operator's MCP server: the
  hostile run's app is started with it.

Per row: /livez p99, bob's first-chunk p99 (and ratio), his whole turns' p99 (to turn_end: a stall
while he waits for the end shows there, not in his first chunk), his probe's p99, what mallory got
(answer, time), the app's peak memory with its children and its peak temporary files, and met? against
the targets (bench/hostile_report.py): /livez p99 < 100 ms, bob's p99 first chunk within 2x of the quiet
run, his probe's p99 within 2x of the quiet run (or 1 s more), mallory answered. A Markdown table at the
end; JSON with --out. With --repeat, each figure is the median of the repetitions.

    .venv/bin/python -m bench.hostile [--rows 1,4,6] [--quick] [--repeat 1] [--timeout 90] [--out results.json]
"""

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import uvloop

from bench.hostile_fake import start_fake
from bench.hostile_report import one_line, table, verdict
from bench.hostile_rows import ROWS, Context, Got, Row
from tests.conftest import AppProcess
from tests.hostile_files import mcp_config

LIVEZ_EVERY = 0.05
LIVEZ_OUTSTANDING = 1000  # requests in flight at most (a stalled app holds them all)
THINK = 0.1  # bob's pause between turns
PROBE_EVERY = 0.5
APP_FLAGS = [
    *("--api-key", "bench", "--model", "fake-model", "--log-level", "warning", "--auth", "header"),
    # Bob sends a message every few tenths of a second: his limits must not refuse him. Every other
    # limit keeps its default (row 13 is about the tool calls' one).
    *("--limit-messages-per-minute", "100000", "--limit-hellos-per-minute", "100000"),
    # Documents embedded by the fake (/v1/embeddings): the local model's CPU would be measured otherwise.
    *("--embedding-model", "fake-embed"),
]


# ---- what a run records --------------------------------------------------------------------------


def p(samples: list[float], q: float) -> float:
    """The q-quantile in milliseconds (nan without samples)."""
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000 if ordered else nan


@dataclass
class Measured:
    livez: list[float] = field(default_factory=list)  # seconds, answered or not (then until the run's end)
    first_chunk: list[float] = field(default_factory=list)  # bob's, per turn (an unended one: until the end)
    turn: list[float] = field(default_factory=list)  # bob's turns, message to turn_end (the save included)
    turns_ended: int = 0  # bob's turns that came to their turn_end (or were refused) before the run's end
    probe: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # bob's turns refused or ended in error
    mallory: dict[str, Any] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    peak_tmp_mb: float = 0.0
    app_cpu_s: float = 0.0
    seconds: float = 0.0

    def figures(self) -> dict[str, float]:
        return {
            "livez_p50_ms": p(self.livez, 0.5), "livez_p99_ms": p(self.livez, 0.99),
            "livez_max_ms": p(self.livez, 1.0), "first_chunk_p50_ms": p(self.first_chunk, 0.5),
            "first_chunk_p99_ms": p(self.first_chunk, 0.99), "probe_p99_ms": p(self.probe, 0.99),
            "peak_rss_mb": self.peak_rss_mb, "peak_tmp_mb": self.peak_tmp_mb, "app_cpu_s": self.app_cpu_s,
            "turn_p99_ms": p(self.turn, 0.99), "turns": self.turns_ended, "livez_samples": len(self.livez),
            "seconds": self.seconds,
        }  # fmt: skip


class Sampler(threading.Thread):
    """The app's memory with its children (an import's reader, MCP servers) and its temporary files'
    bytes, every 0.1 s: their peaks. An upload is spooled to an unnamed file (TemporaryFile: unlinked at
    once), seen only among the processes' open files."""

    def __init__(self, pid: int, tmp: Path) -> None:
        super().__init__(daemon=True)
        self.app, self.tmp = psutil.Process(pid), tmp
        self.peak_rss = self.peak_tmp = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.1):
            try:
                tree = [self.app, *self.app.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = 0
            files = {}  # by inode: a named file may be open too
            for process in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss += process.memory_info().rss
                files |= self._open_files(process.pid)
            self.peak_rss = max(self.peak_rss, rss)
            for path in self.tmp.rglob("*"):
                with contextlib.suppress(OSError):
                    found = path.stat()
                    files[(found.st_dev, found.st_ino)] = found.st_size if path.is_file() else 0
            self.peak_tmp = max(self.peak_tmp, sum(files.values()))

    def _open_files(self, pid: int) -> dict[tuple[int, int], int]:
        """The sizes of the files under `tmp` the process holds open, deleted or not."""
        found = {}
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(self.tmp)):
                        info = os.stat(f"/proc/{pid}/fd/{fd}")
                        found[(info.st_dev, info.st_ino)] = info.st_size
        return found

    def cpu(self) -> float:
        try:
            return sum(self.app.cpu_times()[:4])  # its own and its ended children's
        except psutil.NoSuchProcess:
            return 0.0


# ---- one run -------------------------------------------------------------------------------------


async def poll_livez(session: aiohttp.ClientSession, url: str, samples: list[float]) -> None:
    """Ask /livez every LIVEZ_EVERY without waiting for the answers; each records its time, or (cancelled
    at the run's end) the time it had waited."""
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        start = time.perf_counter()
        try:
            async with session.get(url + "/livez") as response:
                await response.read()
        except aiohttp.ClientError:  # refused, reset: it counts for the time it took
            pass
        finally:
            samples.append(time.perf_counter() - start)

    try:
        while True:
            if len(pending) < LIVEZ_OUTSTANDING:
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(LIVEZ_EVERY)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def bob_turn(ws: Any, first: list[float], failures: list[str]) -> None:
    """One turn of bob's: `first` gets the seconds to its first chunk."""
    start = time.perf_counter()
    await ws.send('{"type":"message","content":"hi"}')
    while (frame := json.loads(await ws.recv()))["type"] != "turn_end":
        if frame["type"] == "chunk" and not first:
            first.append(time.perf_counter() - start)
        elif frame["type"] == "error":
            failures.append(f"{frame['code']}: {frame.get('message', '')[:100]}")
            if "turn_id" not in frame:  # refused: no turn, no turn_end
                return


async def bob_chats(ws: Any, measured: Measured, enough: asyncio.Event, turns: int) -> None:
    """Bob's turns one after another, until cancelled; `enough` is set after `turns` of them. A turn with
    no chunk (refused, cut off by the run's end) counts for the time it took."""
    while True:
        start, first = time.perf_counter(), []
        try:
            await bob_turn(ws, first, measured.failures)
            measured.turns_ended += 1
        finally:
            measured.first_chunk.append(first[0] if first else time.perf_counter() - start)
            measured.turn.append(time.perf_counter() - start)
        if measured.turns_ended >= turns:
            enough.set()
        await asyncio.sleep(THINK)


async def probing(ctx: Context, row: Row, conversation: str, samples: list[float]) -> None:
    while row.probe is not None:
        start = time.perf_counter()
        try:
            await row.probe(ctx, conversation)
        finally:
            samples.append(time.perf_counter() - start)
        await asyncio.sleep(PROBE_EVERY)


def mallory_result(task: asyncio.Task[Got], ctx: Context, timeout: float) -> dict[str, Any]:
    if not task.done():
        seen = "; ".join(ctx.seen[-4:]) or "nothing"
        return {"answer": f"no answer within {timeout:g} s (seen: {seen})", "seconds": timeout, "finished": False}
    if (error := task.exception()) is not None:
        return {"answer": f"failed: {error!r}"[:200], "seconds": time.perf_counter() - ctx.started, "finished": True}
    got = task.result()
    return {"answer": got.answer, "seconds": round(got.seconds, 2), "finished": True, **got.extra}


async def run(app: AppProcess, tmp: Path, row: Row, hostile: bool, turns: int, timeout: float, quick: bool) -> Measured:
    """One run against a started app: quiet (bob alone) or hostile (mallory too)."""
    measured = Measured()
    timeouts = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeouts) as session:
        ctx = Context(app.url, app.ws_url, session, quick)
        try:
            bob, _ = await ctx.open("bob", drain=False)
            for _ in range(2):  # warm: the conversation stored, the provider's connection open
                await asyncio.wait_for(bob_turn(bob, [], []), 30)
            _, probe_conversation = await ctx.open("bob")
            if hostile and row.setup is not None:
                measured.mallory["setup"] = (await asyncio.wait_for(row.setup(ctx), timeout)).answer
            sampler = Sampler(app.process.pid, tmp)
            cpu = sampler.cpu()
            sampler.start()
            enough = asyncio.Event()
            ctx.started = start = time.perf_counter()
            background = [
                asyncio.create_task(poll_livez(session, app.url, measured.livez)),
                asyncio.create_task(bob_chats(bob, measured, enough, turns)),
                asyncio.create_task(probing(ctx, row, probe_conversation, measured.probe)),
            ]
            awaited = [asyncio.create_task(enough.wait())]
            mallory = asyncio.create_task(row.act(ctx)) if hostile else None
            awaited += [mallory] if mallory else []
            await asyncio.wait(awaited, timeout=timeout)
            measured.seconds = time.perf_counter() - start
            if mallory is not None:
                measured.mallory.update(mallory_result(mallory, ctx, timeout))
            for task in [*background, *awaited]:
                task.cancel()
            ended = await asyncio.gather(*background, return_exceptions=True)
            await asyncio.gather(*awaited, return_exceptions=True)
            names = ("the /livez poller", "bob's chat", "bob's probe")
            for name, end in zip(names, ended, strict=True):
                if isinstance(end, Exception):  # it failed before the run's end: say why
                    measured.failures.append(f"{name} stopped: {end!r}"[:300])
            sampler.halt.set()
            measured.peak_rss_mb, measured.peak_tmp_mb = sampler.peak_rss / 1e6, sampler.peak_tmp / 1e6
            measured.app_cpu_s = sampler.cpu() - cpu
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.close(), 5)  # a stalled app cannot close them
    return measured


# ---- a row ---------------------------------------------------------------------------------------


def start_app(tmp: Path, fake_port: int, mcp: dict[str, Any] | None) -> AppProcess:
    (tmp / "tmp").mkdir()
    args = ["--base-url", f"http://127.0.0.1:{fake_port}/v1", *APP_FLAGS]
    if mcp is not None:
        (tmp / "mcp.json").write_text(mcp_config(hostile=mcp))
        args += ["--mcp-config", str(tmp / "mcp.json")]
    return AppProcess(tmp, args, {"TMPDIR": str(tmp / "tmp")}).start()


def one_run(row: Row, hostile: bool, fake: tuple[int, Any], turns: int, timeout: float, quick: bool) -> dict[str, Any]:
    """A run on an app of its own (killed after it), against the fake at `fake` (its port, its stats)."""
    port, stats = fake
    stats[0] = stats[1] = 0
    with tempfile.TemporaryDirectory(prefix="hostile-") as folder:
        started = time.perf_counter()
        try:
            app = start_app(Path(folder), port, row.hostile_app(quick) if hostile and row.hostile_app else None)
        except RuntimeError as error:  # it never answered /healthz
            return {"mallory": {"answer": f"app did not start: {str(error)[-200:]}"}}
        app_start = time.perf_counter() - started
        try:
            measured = uvloop.run(run(app, Path(folder) / "tmp", row, hostile, turns, timeout, quick))
        finally:
            app.kill()  # SIGKILL: a stalled app ignores SIGTERM (row 1)
    provider = {"chat_requests": stats[0], "most_tools_offered": stats[1]}
    run_is = {"turns_asked": turns, "app_start_s": app_start, "provider": provider}
    return {**measured.figures(), **run_is, "mallory": measured.mallory, "bob_failures": measured.failures[:5]}


def measure_row(row: Row, turns: int, timeout: float, quick: bool, repeat: int) -> dict[str, Any]:
    """The row's quiet and hostile runs, `repeat` times each."""
    runs: dict[str, list[dict[str, Any]]] = {"quiet": [], "hostile": []}
    fake, port, stats = start_fake(row.script(quick) if row.script else [])
    try:
        for _ in range(repeat):
            for kind in runs:
                runs[kind].append(one_run(row, kind == "hostile", (port, stats), turns, timeout, quick))
                print(f"  row {row.number} {kind}: {one_line(runs[kind][-1])}", flush=True)
    finally:
        fake.kill()
    described = {"number": row.number, "what": row.what, "probe": row.probe_what}
    return {**described, "hostile_app": row.hostile_app is not None, "runs": runs, **verdict(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows to run, comma-separated (default all)")
    parser.add_argument("--quick", action="store_true", help="smaller inputs (seconds on today's code), 15 turns")
    parser.add_argument("--turns", type=int, help="bob's turns a run, at least (default 30; 15 with --quick)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds a hostile run may take (default 90)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each kind a row; medians (default 1)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    turns = args.turns or (15 if args.quick else 30)
    results = []
    for number in (int(n) for n in args.rows.split(",")):
        row = ROWS[number]
        print(f"row {number}: {row.what}", flush=True)
        results.append(measure_row(row, turns, args.timeout, args.quick, args.repeat))
    print()
    print(table(results))
    if args.out:
        settings = {"quick": args.quick, "turns": turns, "timeout": args.timeout, "repeat": args.repeat}
        args.out.write_text(json.dumps({"settings": settings, "rows": results}, indent=1, default=str))
    raise SystemExit(0 if all(r["met"] for r in results) else 1)


if __name__ == "__main__":
    main()
