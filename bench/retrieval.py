"""Documents: retrieval quality and speed, on 2 cores.

    .venv/bin/python -m bench.retrieval

- recall@5 on the labelled set of tests/retrieval_set/ (5 documents, 36 questions): full text only,
  vectors only, and hybrid (what the app does);
- indexing speed (passages a second, through the indexing flow, the model loaded already);
- retrieval time, p50 and p95, at 1,000 and 10,000 passages of one user's conversation (the passages
  are synthetic text with random vectors: the time does not depend on what they say);
- the first chunk of a reply with documents against the same reply without (the app under uvicorn,
  the fake provider, p95 of each);
- the memory the loaded embedding model takes (a process of its own: RSS after loading and embedding,
  less RSS before).
"""

import asyncio
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flow import create_indexing_flow
from pocketchat.documents import Library
from pocketchat.jobs import Jobs
from pocketchat.metrics import Metrics
from pocketchat.records import ConversationRecord, DocumentRecord
from pocketchat.settings import Settings
from pocketchat.store.sqlite import SqliteStore
from utils.embeddings import to_bytes
from utils.read_document import read_document
from utils.retrieval import nearest, retrieve, search_terms

ROOT = Path(__file__).resolve().parent.parent
SET = ROOT / "tests" / "retrieval_set"
OWNER = "local"
TOP = 5


def set_documents() -> list[Path]:
    return [path for path in sorted(SET.glob("*.md")) if path.name != "README.md"]


def questions() -> list[dict[str, str]]:
    return json.loads((SET / "questions.json").read_text())


def found(answer: str, texts: list[str]) -> bool:
    """Whether one of the passages holds the answer's phrase (spaces and case aside)."""
    phrase = " ".join(answer.lower().split())
    return any(phrase in " ".join(text.lower().split()) for text in texts)


async def open_library(path: Path) -> tuple[SqliteStore, Library, ConversationRecord]:
    store = SqliteStore(path)
    await store.open()
    settings = Settings()
    library = Library(settings, store, None, Metrics(lambda: 0), Jobs.from_settings(settings), create_indexing_flow)
    record = ConversationRecord(model="bench", system_prompt="")
    await store.create_conversation(record)
    return store, library, record


async def index_set(store: SqliteStore, library: Library, record: ConversationRecord) -> list[DocumentRecord]:
    """The labelled set's documents, indexed through the indexing flow, as an upload would be."""
    documents = []
    for path in set_documents():
        pages = read_document(io.BytesIO(path.read_bytes()), path.name)
        document = DocumentRecord(record.id, OWNER, path.name, path.stat().st_size, embedder=library.embedder.name)
        await store.add_document(document)
        await library.indexing.run_async(library.new_shared(document, pages))
        assert document.status == "ready", document
        documents.append(document)
    return documents


async def recall_at_5(store: SqliteStore, library: Library, documents: list[DocumentRecord]) -> dict[str, float]:
    """recall@5 of full text only, vectors only and hybrid, over the labelled questions."""
    ids = [document.id for document in documents]
    kept = [await library.vectors.get(document_id) for document_id in ids]
    passage_ids = [passage for ids_of, _ in kept for passage in ids_of]
    matrix = np.concatenate([vectors for _, vectors in kept])
    hits = {"text": 0, "vectors": 0, "hybrid": 0}
    for item in questions():
        question, answer = item["question"], item["answer"]
        by_words = await store.search_passages(ids, search_terms(question), TOP)
        query = (await library.embedder.embed([question], question=True))[0]
        by_meaning = [passage_ids[row] for row in nearest(query, matrix, TOP)]
        both = await retrieve(store, library.vectors, library.embedder, documents, OWNER, question, TOP)
        for name, chosen in (("text", by_words), ("vectors", by_meaning)):
            hits[name] += found(answer, [p.text for p in await store.passages(OWNER, chosen)])
        hits["hybrid"] += found(answer, [p.text for p in both])
    return {name: count / len(questions()) for name, count in hits.items()}


async def synthetic(store: SqliteStore, record: ConversationRecord, passages: int, dimensions: int) -> DocumentRecord:
    """A ready document of `passages` passages of random words, with random unit vectors."""
    rng = np.random.default_rng(passages)
    words = [w for item in questions() for w in item["question"].lower().strip("?").split()] + [
        f"word{i}" for i in range(2000)
    ]
    document = DocumentRecord(record.id, OWNER, f"synthetic-{passages}.md", 0, embedder="all-MiniLM-L6-v2")
    await store.add_document(document)
    vectors = rng.standard_normal((passages, dimensions)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for start in range(0, passages, 500):
        rows = [
            (seq, None, " ".join(rng.choice(words, 90)), to_bytes(vectors[seq]))
            for seq in range(start, min(start + 500, passages))
        ]
        await store.add_chunks(document, rows)
    document.status, document.progress, document.chunks = "ready", 1.0, passages
    await store.finish_document(document)
    return document


async def retrieval_times(store: SqliteStore, library: Library, passages: int) -> dict[str, float]:
    record = ConversationRecord(model="bench", system_prompt="")
    await store.create_conversation(record)
    document = await synthetic(store, record, passages, 384)
    asked = [item["question"] for item in questions()] * 3
    times = []
    for number, question in enumerate(asked):
        started = time.perf_counter()
        await retrieve(store, library.vectors, library.embedder, [document], OWNER, question, TOP)
        times.append(time.perf_counter() - started)
        if number == 0:
            first = times.pop()  # the vectors read from the database, once
    times.sort()
    return {"first": first, "p50": statistics.median(times), "p95": times[int(len(times) * 0.95) - 1]}


def model_memory() -> float:
    """MiB the loaded model adds to a process (its own process: nothing else loaded meanwhile)."""
    script = (
        "import asyncio, psutil, numpy, onnxruntime, tokenizers; from utils.embeddings import LocalEmbedder; "
        "p = psutil.Process(); before = p.memory_info().rss; e = LocalEmbedder(); "
        "asyncio.run(e.embed(['a passage of a document ' * 20] * 16)); "
        "print((p.memory_info().rss - before) / 2**20)"
    )
    return float(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True).stdout)


def first_chunk_delays(rounds: int = 40) -> dict[str, float]:
    """p95 time from a message to its first chunk (the fake answers at once), in a conversation with the
    labelled set's documents and in one without, alternated."""
    from tests.conftest import NO_LIMITS, AppProcess
    from tests.fake_openai import FakeOpenAIThread, Reply
    from tests.test_documents import upload, wait_indexed

    with FakeOpenAIThread(Reply(count=3)) as fake, tempfile.TemporaryDirectory() as tmp:
        flags = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--context-budget", "2000", *NO_LIMITS]
        app = AppProcess(Path(tmp), flags, {"POCKETCHAT_API_KEY": "sk-bench-0123456789"}).start()
        try:
            plain, with_documents = app.client(), app.client()
            plain.hello()
            conversation_id = with_documents.hello()["conversation_id"]
            for path in set_documents():
                upload(app, conversation_id, path.name, path.read_bytes())
            wait_indexed(app, conversation_id, 5)
            for client in (plain, with_documents):  # warm: the model loaded, the vectors read
                client.turn("warm up")
            delays: dict[str, list[float]] = {"without": [], "with": []}
            for number in range(rounds):
                for name, client in (("without", plain), ("with", with_documents)):
                    started = time.perf_counter()
                    client.send("message", content=questions()[number % len(questions())]["question"])
                    while client.recv()["type"] != "chunk":
                        pass
                    delays[name].append(time.perf_counter() - started)
                    client.until("turn_end")
        finally:
            app.stop()
    p95 = {name: sorted(values)[int(len(values) * 0.95) - 1] for name, values in delays.items()}
    medians = {name: statistics.median(values) for name, values in delays.items()}
    return {"p95 without": p95["without"], "p95 with": p95["with"], **{f"median {k}": v for k, v in medians.items()}}


async def measure() -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store, library, record = await open_library(Path(tmp) / "bench.db")
        try:
            await library.embedder.embed(["load the model first"])
            started = time.perf_counter()
            documents = await index_set(store, library, record)
            chunks = sum(document.chunks for document in documents)
            results["labelled set"] = f"{len(documents)} documents, {chunks} passages, {len(questions())} questions"
            results["recall@5"] = await recall_at_5(store, library, documents)
            # Indexing speed on more text: the set's documents ten times over.
            big = "\n\n".join(path.read_text() for path in set_documents()) * 10
            pages = read_document(io.BytesIO(big.encode()), "big.md")
            document = DocumentRecord(record.id, OWNER, "big.md", len(big), embedder=library.embedder.name)
            await store.add_document(document)
            started = time.perf_counter()
            await library.indexing.run_async(library.new_shared(document, pages))
            results["indexing"] = {
                "passages": document.chunks,
                "per second": document.chunks / (time.perf_counter() - started),
            }
            for passages in (1000, 10_000):
                results[f"retrieval at {passages}"] = await retrieval_times(store, library, passages)
        finally:
            await library.aclose()
            await library.jobs.aclose()
            await store.close()
    results["first chunk"] = first_chunk_delays()
    results["model memory MiB"] = model_memory()
    return results


def main() -> None:
    results = asyncio.run(measure())
    recall = results["recall@5"]
    print(f"labelled set: {results['labelled set']}")
    print(f"recall@5: text {recall['text']:.2f}, vectors {recall['vectors']:.2f}, hybrid {recall['hybrid']:.2f}")
    indexing = results["indexing"]
    print(f"indexing: {indexing['passages']} passages at {indexing['per second']:.1f} passages/s")
    for passages in (1000, 10_000):
        times = results[f"retrieval at {passages}"]
        print(
            f"retrieval at {passages:>6} passages: p50 {times['p50'] * 1000:.1f} ms, p95 {times['p95'] * 1000:.1f} ms"
            f" (first, vectors read from the database: {times['first'] * 1000:.0f} ms)"
        )
    first = results["first chunk"]
    print(
        f"first chunk, p95: without documents {first['p95 without'] * 1000:.1f} ms,"
        f" with {first['p95 with'] * 1000:.1f} ms"
        f" (+{(first['p95 with'] - first['p95 without']) * 1000:.1f} ms; medians {first['median without'] * 1000:.1f}"
        f" and {first['median with'] * 1000:.1f} ms)"
    )
    print(f"embedding model memory: {results['model memory MiB']:.0f} MiB")


if __name__ == "__main__":
    main()
