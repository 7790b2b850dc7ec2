"""Import benchmark: 1,000 ChatGPT conversations imported into the app, and what it costs another user.

The file is ChatGPT-shaped (tests/files/chatgpt_conversations.json's first conversation a thousand
times: seven messages kept of each, two branches, a tool call, hidden and system nodes dropped). Bob
chats with the fake provider (a reply of 20 chunks, the first at once) turn after turn: first alone,
then while Alice's import runs. It reports the import's time (checked whole in the child, then
written in the background) and Bob's first-chunk time, medians and p90, with and without it.

    .venv/bin/python -m bench.import_conversations [--repeat 3] [--postgres]

With `--long 40000`: instead, one conversation of that many messages in our own format, and the longest
Bob waits between two frames of a reply (50 chunks 10 ms apart) while it is imported.

With `--reader`: instead, the reader child alone (as the app runs it) on files of about 100 MB, its time
and peak memory. With `--fair`: instead, how long Carol's small import waits while two other users'
files of 100 MB are checked (the app checks two files at once), against alone.
"""

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from pocketchat.transfer.imports import READ_TIMEOUT
from pocketchat.transfer.native import FORMAT, VERSION
from tests.conftest import NO_LIMITS, AppProcess, ChatClient
from tests.fake_openai import FakeOpenAIThread, Reply
from tests.services import fresh_database
from tests.test_documents import call, multipart
from tests.test_import import reading
from tests.test_import_reader import run_reader

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


def chains(megabytes: int) -> bytes:
    """A ChatGPT export of conversations of 100,000 nodes (the most a conversation may have), each the
    least a kept message can be, chained: the slowest file to check per byte found. Its last item is not
    a conversation, so it is refused once read whole and nothing is written."""
    message = {"author": {"role": "user"}, "content": {"content_type": "text", "parts": ["x"]}}
    mapping = {f"n{n}": {"parent": f"n{n - 1}" if n else None, "message": message} for n in range(100_000)}
    conversation = json.dumps({"mapping": mapping})
    copies = megabytes * 1_000_000 // len(conversation)
    return ("[" + ", ".join([conversation] * copies) + ", []]").encode()


def reader_run(args: argparse.Namespace, database_url: str | None) -> None:
    """The reader child alone on files of about 100 MB: its time and peak memory (resident), medians."""
    files = {
        "[[],[],...] (refused at its first)": b"[" + b"[]," * 33_333_332 + b"[]]",
        "ChatGPT, 14,800 conversations": conversations(14_800),
        "ours, 1 conversation of 100,000 messages": long_conversation(100_000),
        "ChatGPT, chains of 100,000 nodes (refused at the end)": chains(100),
    }
    print(f"the import reader, {args.repeat} runs each (load average {os.getloadavg()[0]:.1f}):")
    print(f"  {'file':<54} {'MB':>6} {'time':>7} {'peak':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            source = Path(tmp) / "upload.json"
            source.write_bytes(data)
            runs = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                _, peak = run_reader(source)
                runs.append((time.perf_counter() - started, peak))
            took, peak = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"  {name:<54} {len(data) / 1e6:6.1f} {took:6.2f}s {peak:5.0f} MiB")


def posted(app: AppProcess, user: str, data: bytes) -> tuple[int, float]:
    """`user`'s upload of `data`: its status, and seconds until it was answered (however long)."""
    body, content_type = multipart("conversations.json", data, "application/json")
    headers = {"Content-Type": content_type, "X-Forwarded-User": user}
    request = urllib.request.Request(app.url + "/api/imports", data=body, method="POST", headers=headers)
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=READ_TIMEOUT + 60) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    return status, time.perf_counter() - started


def fair_run(args: argparse.Namespace, database_url: str | None) -> None:
    """Carol's small import (one conversation), alone and while Alice's and Dave's files of 100 MB (refused
    at their end: a ChatGPT export, and the slowest to check found) hold both readers."""
    small = conversations(1)
    exported = conversations(14_800)  # under --limit-import-bytes, 100 MB
    bigs = {"ChatGPT export": exported[:-1] + b", []]", "chains of 100,000 nodes": chains(100)}
    print(f"Carol's import of one conversation, {args.repeat} runs each (load average {os.getloadavg()[0]:.1f}):")
    with app_and_bob(Reply(count=20), database_url) as (app, _):
        server = psutil.Process(app.process.pid)  # type: ignore[union-attr]
        for kind, (name, big) in enumerate(bigs.items()):
            alone, meanwhile, held = [], [], []
            for number in range(args.repeat):
                alone.append(posted(app, f"carol{kind}x{number}", small)[1])
                answers: list[tuple[int, float]] = []

                def upload(user: str, answers: list[tuple[int, float]] = answers, big: bytes = big) -> None:
                    answers.append(posted(app, user, big))

                others = [threading.Thread(target=upload, args=(f"{user}{kind}x{number}",)) for user in ("al", "da")]
                for other in others:
                    other.start()
                while sum(reading(child) for child in server.children()) < 2:
                    time.sleep(0.01)
                status, took = posted(app, f"carol{kind}x{number}", small)
                assert status == 202, status
                meanwhile.append(took)
                for other in others:
                    other.join()
                assert [status for status, _ in answers] == [422, 422], answers
                held += [took for _, took in answers]
            print(f"  while two files of {len(big) / 1e6:.0f} MB ({name}) are checked:", end="")
            print(f" median {statistics.median(meanwhile):.1f} s, max {max(meanwhile):.1f} s", end="")
            print(f" (alone {statistics.median(alone):.2f} s; those two answered in {statistics.median(held):.1f} s)")
    print(f"  (load average {os.getloadavg()[0]:.1f} at the end)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10, help="Bob's turns alone before each import")
    parser.add_argument(
        "--postgres", action="store_true", help="import into a new PostgreSQL database (tests/services.py)"
    )
    parser.add_argument("--long", type=int, help="instead: one conversation of this many messages (40000, say)")
    parser.add_argument("--reader", action="store_true", help="instead: the reader child alone on 100 MB files")
    parser.add_argument("--fair", action="store_true", help="instead: a small import while two big ones are read")
    args = parser.parse_args()
    bench = reader_run if args.reader else fair_run if args.fair else run if args.long is None else long_run
    if not args.postgres:
        bench(args, None)
        return
    with fresh_database() as url:
        bench(args, url)


if __name__ == "__main__":
    main()
