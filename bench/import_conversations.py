"""Import benchmark: 1,000 ChatGPT conversations imported into the app, and what it costs another user.

The file is ChatGPT-shaped (tests/files/chatgpt_conversations.json's first conversation a thousand
times: seven messages kept of each, two branches, a tool call, hidden and system nodes dropped). Bob
chats with the fake provider (a reply of 20 chunks, the first at once) turn after turn: first alone,
then while Alice's import runs. It reports the import's time (checked whole in the child, then
written in the background) and Bob's first-chunk time, medians and p90, with and without it.

    .venv/bin/python -m bench.import_conversations [--repeat 3] [--postgres]

With `--long 40000`: instead, one conversation of that many messages in our own format, and the longest
Bob waits between two frames of a reply (50 chunks 10 ms apart) while it is imported.
"""

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pocketchat.transfer.native import FORMAT, VERSION
from tests.conftest import NO_LIMITS, AppProcess, ChatClient
from tests.fake_openai import FakeOpenAIThread, Reply
from tests.services import fresh_database
from tests.test_documents import call, multipart

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "tests" / "files" / "chatgpt_conversations.json"
ALICE, BOB = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}


def conversations(count: int) -> bytes:
    lisbon = json.loads(FILE.read_text())[0]
    return json.dumps([lisbon | {"title": f"Trip {number}"} for number in range(count)]).encode()


def long_conversation(count: int) -> bytes:
    """Our file of one conversation of `count` messages in a line."""
    messages = [
        {"id": f"m{n}", "parent_id": f"m{n - 1}" if n else None, "role": ("user", "assistant")[n % 2],
         "content": f"message {n} " + "lorem ipsum dolor sit amet " * 8, "reasoning": "", "status": "complete",
         "error": None, "meta": {}, "created_at": 1.0 + n}
        for n in range(count)
    ]  # fmt: skip
    conversation = {"id": "long", "title": "Long", "model": "m", "system_prompt": "", "tools_off": [],
                    "sampling": {}, "created_at": 1.0, "updated_at": 2.0, "leaf_id": f"m{count - 1}"}  # fmt: skip
    data = {"format": FORMAT, "version": VERSION, "conversation": conversation, "messages": messages}
    return json.dumps(data).encode()


def streamed(bob: ChatClient) -> tuple[float, float, bool]:
    """One turn of Bob's: its first chunk, its longest wait between two frames (seconds), and whether it
    ended complete with no error frame."""
    started = last = time.perf_counter()
    bob.send("message", content="Hello")
    first, longest, errors = None, 0.0, False
    while True:
        frame = bob.recv(30)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
        first = now - started if first is None and frame["type"] == "chunk" else first
        errors = errors or frame["type"] == "error"
        if frame["type"] == "turn_end":
            return (first or float("nan")), longest, frame["status"] == "complete" and not errors


def long_run(args: argparse.Namespace, database_url: str | None) -> None:
    """One conversation of `args.long` messages imported while Bob's replies stream (50 chunks 10 ms apart):
    the longest Bob waited between two frames of a reply, alone and meanwhile."""
    data = long_conversation(args.long)
    with app_and_bob(Reply(count=50, pace=0.01), database_url) as (app, bob):
        alone = [streamed(bob) for _ in range(args.turns)]
        meanwhile, took = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            job = alices_import(app, "long.json", data)
            while job["status"] == "importing":
                meanwhile.append(streamed(bob))
                job = call(app, "GET", f"/api/imports/{job['id']}", **ALICE)[1]
            took.append(time.perf_counter() - started)
            assert job["status"] == "done", job
    where = "PostgreSQL" if database_url else "SQLite"
    print(
        f"one conversation of {args.long} messages ({len(data) / 1e6:.1f} MB), {where}, {args.repeat} imports", end=""
    )
    print(f" (load average {os.getloadavg()[0]:.1f}); imported in {statistics.median(took):.1f} s (median)")
    print("  Bob's replies          longest wait between frames: median   max   first chunk median  failed  turns")
    for name, turns in (("alone", alone), ("while imported", meanwhile)):
        waits = [longest for _, longest, _ in turns]
        first = statistics.median(first for first, _, _ in turns)
        failed = sum(not ok for _, _, ok in turns)
        print(f"  {name:<22} {statistics.median(waits) * 1000:27.0f} ms {max(waits) * 1000:5.0f} ms", end="")
        print(f" {first * 1000:16.1f} ms {failed:7d} {len(turns):6d}")


def first_chunk(bob: ChatClient) -> float:
    """One turn of Bob's; seconds from sending to its first chunk."""
    started = time.perf_counter()
    bob.send("message", content="Hello")
    first = None
    while True:
        frame = bob.recv(30)
        if frame["type"] == "chunk" and first is None:
            first = time.perf_counter() - started
        if frame["type"] == "turn_end":
            assert frame["status"] == "complete", frame
            return first if first is not None else float("nan")


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(int(0.9 * len(ordered)), len(ordered) - 1)]


@contextlib.contextmanager
def app_and_bob(reply: Reply, database_url: str | None) -> Iterator[tuple[AppProcess, ChatClient]]:
    """The app (on PostgreSQL if `database_url`), its fake provider answering `reply`, and Bob's socket."""
    with FakeOpenAIThread(reply) as fake, tempfile.TemporaryDirectory() as tmp:
        flags = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--auth", "header", *NO_LIMITS]
        if database_url:
            flags += ["--database-url", database_url]
        app = AppProcess(Path(tmp), flags, {"POCKETCHAT_API_KEY": "bench"}).start()
        try:
            bob = app.client(**BOB)
            bob.hello()
            yield app, bob
        finally:
            app.kill()


def alices_import(app: AppProcess, name: str, data: bytes) -> dict[str, Any]:
    """Alice's upload of `data`: the import's first status."""
    body, content_type = multipart(name, data, "application/json")
    status, job = call(app, "POST", "/api/imports", body, **{"Content-Type": content_type, **ALICE})
    assert status == 202, job
    return job


def run(args: argparse.Namespace, database_url: str | None) -> None:
    data = conversations(args.count)
    with app_and_bob(Reply(count=20), database_url) as (app, bob):
        for _ in range(5):
            first_chunk(bob)  # warm
        times: dict[str, list[float]] = {"alone": [], "while checked": [], "while written": []}
        checks, imports = [], []
        for _ in range(args.repeat):
            # Bob alone just before each import: the machine's load drifts, the comparison stays fair.
            times["alone"] += [first_chunk(bob) for _ in range(args.turns)]
            phase = ["while checked"]
            done = threading.Event()

            def chat(done: threading.Event = done, phase: list[str] = phase) -> None:
                while not done.is_set():
                    took = first_chunk(bob)
                    times[phase[0]].append(took)

            chatter = threading.Thread(target=chat)
            chatter.start()
            started = time.perf_counter()
            job = alices_import(app, "conversations.json", data)
            phase[0] = "while written"
            checks.append(time.perf_counter() - started)
            while job["status"] == "importing":
                time.sleep(0.02)
                job = call(app, "GET", f"/api/imports/{job['id']}", **ALICE)[1]
            imports.append(time.perf_counter() - started)
            done.set()
            chatter.join()
            assert job["status"] == "done" and job["imported"] == args.count, job
    where = "PostgreSQL" if database_url else "SQLite"
    load = os.getloadavg()[0]
    print(f"{args.count} ChatGPT conversations ({len(data) / 1e6:.1f} MB), {where}, {args.repeat} imports", end="")
    print(f" (load average {load:.1f} on {os.cpu_count()} cores):")
    print(f"  checked (POST answered): median {statistics.median(checks):.2f} s")
    print(f"  imported (all written):  median {statistics.median(imports):.2f} s")
    print("  Bob's first chunk        median     p90   turns")
    for name, values in times.items():
        print(f"  {name:<24} {statistics.median(values) * 1000:6.1f} ms {p90(values) * 1000:6.1f} ms {len(values):5d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10, help="Bob's turns alone before each import")
    parser.add_argument(
        "--postgres", action="store_true", help="import into a new PostgreSQL database (tests/services.py)"
    )
    parser.add_argument("--long", type=int, help="instead: one conversation of this many messages (40000, say)")
    args = parser.parse_args()
    bench = run if args.long is None else long_run
    if not args.postgres:
        bench(args, None)
        return
    with fresh_database() as url:
        bench(args, url)


if __name__ == "__main__":
    main()
