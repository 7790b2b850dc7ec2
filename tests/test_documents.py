"""Documents: attached over real HTTP (multipart), read, indexed in the background by the indexing flow
with the real embedding model, retrieved by RetrieveDocuments into the prompt the fake provider records,
shown as sources; every rule in one process on SQLite and in a replica on PostgreSQL and Redis."""

import asyncio
import http.client
import json
import sqlite3
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import asyncpg
import pytest

from tests.conftest import AppProcess, ChatClient, of_node
from tests.fake_openai import FakeOpenAI, Reply
from tests.pdfs import damaged_pdf, encrypted_pdf, scanned_pdf, text_pdf

pytestmark = pytest.mark.parametrize("mode", ["single", "replicas"], indirect=True)

# Three pages, the answer to the test's question on the second only.
REPORT_PAGES = [
    "Quarterly report of the Northwind bakery. Sales of bread rose in the spring. " * 6,
    "The new sourdough oven was installed in Lyon on the fourth of March. It bakes 400 loaves an hour. " * 4,
    "Staff training covered food safety, allergens and customer service during the summer months. " * 6,
]
NOTES = (
    "# Garden notes\n\n"
    + "Tomatoes need full sun and regular watering in July. " * 12
    + "\n\n"
    + ("The beehive by the orchard gave eleven kilos of honey this year. " * 8)
)
# --context-budget: small enough that these documents are searched, not given whole.
SEARCHED = ("--context-budget", "1200")


def multipart(name: str, data: bytes, content_type: str = "application/octet-stream") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def call(app: AppProcess, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    request = urllib.request.Request(app.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def upload(app: AppProcess, conversation_id: str, name: str, data: bytes, **headers: str) -> tuple[int, Any]:
    body, content_type = multipart(name, data)
    path = f"/api/conversations/{conversation_id}/documents"
    return call(app, "POST", path, body, **{"Content-Type": content_type, **headers})


def post_chunked(app: AppProcess, path: str, name: str, size: int) -> int:
    """Upload a file of `size` bytes as a chunked body, no length declared; the answer's status. The server
    may answer (and close) before the whole body went."""
    body, content_type = multipart(name, b"y" * size)
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", content_type)
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    try:
        for start in range(0, len(body), 16_384):
            piece = body[start : start + 16_384]
            connection.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        connection.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before the whole body went
    try:
        return connection.getresponse().status
    finally:
        connection.close()


def documents(app: AppProcess, conversation_id: str, **headers: str) -> list[dict[str, Any]]:
    status, answer = call(app, "GET", f"/api/conversations/{conversation_id}/documents", **headers)
    assert status == 200, answer
    return answer["documents"]


def wait_indexed(app: AppProcess, conversation_id: str, count: int = 1, **headers: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = documents(app, conversation_id, **headers)
        if len(found) >= count and all(d["status"] != "indexing" for d in found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"still indexing: {found}")


def new_conversation(app: AppProcess, **headers: str) -> tuple[ChatClient, str]:
    client = app.client(**headers)
    return client, client.hello()["conversation_id"]


def sources_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = [f for f in frames if f["type"] == "step" and f["kind"] == "sources"]
    return steps[0]["data"] if steps else []


def system_prompt(fake: FakeOpenAI) -> str:
    return fake.chat_requests[-1]["json"]["messages"][0]["content"]


def rows(request: pytest.FixtureRequest, mode: str, app: AppProcess, query: str) -> list[tuple[Any, ...]]:
    """What the app's database holds (its SQLite file, or its PostgreSQL database)."""
    if mode == "single":
        with sqlite3.connect(app.db_path) as db:
            return db.execute(query).fetchall()

    async def fetch() -> list[tuple[Any, ...]]:
        db = await asyncpg.connect(request.getfixturevalue("fresh_postgres_url"))
        try:
            return [tuple(row) for row in await db.fetch(query)]
        finally:
            await db.close()

    return asyncio.run(fetch())


def metric(app: AppProcess, name: str) -> float:
    with urllib.request.urlopen(app.url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_a_pdf_and_a_markdown_file_answer_a_question_with_their_file_and_page(start_app, fake):
    app = start_app(*SEARCHED)
    client, conversation_id = new_conversation(app)
    status, pdf = upload(app, conversation_id, "report.pdf", text_pdf(REPORT_PAGES))
    assert status == 201 and pdf["name"] == "report.pdf" and pdf["status"] == "indexing", pdf
    assert upload(app, conversation_id, "garden.md", NOTES.encode())[0] == 201
    # The socket on the conversation is told of each document's state, progress included, up to ready.
    seen: list[dict[str, Any]] = []
    while sum(1 for f in seen if f["document"]["status"] == "ready") < 2:
        seen += [frame for frame in client.until("document", timeout=60) if frame["type"] == "document"]
    assert all(frame["conversation_id"] == conversation_id for frame in seen)
    assert any(0 < f["document"]["progress"] < 1 for f in seen if f["document"]["id"] == pdf["id"])
    listed = wait_indexed(app, conversation_id, 2)
    assert [(d["name"], d["status"], d["progress"]) for d in listed] == [
        ("report.pdf", "ready", 1.0),
        ("garden.md", "ready", 1.0),
    ]
    assert all(d["chunks"] > 1 for d in listed)

    fake.queue(Reply(tokens=["It was installed in Lyon [1]."]))
    frames = client.turn("Where was the sourdough oven installed, and when?")
    sources = sources_of(frames)
    assert sources[0]["source"] == "report.pdf, p. 2" and sources[0]["page"] == 2, sources
    assert sources[0]["document_id"] == pdf["id"] and "installed in Lyon" in sources[0]["text"]
    # The passage reached the model, numbered for it to cite.
    assert "[1] (report.pdf, p. 2)\nThe new sourdough oven was installed in Lyon" in system_prompt(fake)
    fake.queue(Reply(tokens=["Eleven kilos [1]."]))
    sources = sources_of(client.turn("How much honey did the beehive give?"))
    assert sources[0]["source"] == "garden.md" and sources[0]["page"] is None
    assert "eleven kilos of honey" in system_prompt(fake)
    # The sources are kept with the reply: in the history of a reload, another tab, another replica.
    history = app.get(f"/api/conversations/{conversation_id}")["messages"]
    (sources,) = of_node(history[-1]["meta"]["steps"], "RetrieveDocuments", "sources")
    assert sources["data"][0]["source"] == "garden.md"


def test_a_small_document_is_given_whole_in_order(start_app, fake):
    app = start_app()
    client, conversation_id = new_conversation(app)
    text = "Alpha station opens at dawn.\n\nBeta station closes at dusk.\n\nGamma station is closed on Sundays."
    assert upload(app, conversation_id, "stations.txt", text.encode())[0] == 201
    wait_indexed(app, conversation_id)
    frames = client.turn("Anything about trains?")  # no word in common: given whole all the same
    assert [s["source"] for s in sources_of(frames)] == ["stations.txt"]
    assert "Alpha station opens at dawn.\n\nBeta station closes at dusk.\n\nGamma station" in system_prompt(fake)


def test_a_conversation_without_documents_loads_no_embedding_model(app, fake):
    client, _ = new_conversation(app)
    frames = client.turn("Hello")
    assert [f for f in frames if f["type"] == "step"] == []
    assert "cite them" not in system_prompt(fake)
    assert metric(app, "pocketchat_embedding_model_loaded") == 0
    _, conversation_id = new_conversation(app)
    upload(app, conversation_id, "a.md", b"Something to embed.")
    wait_indexed(app, conversation_id)
    assert metric(app, "pocketchat_embedding_model_loaded") == 1


BAD_FILES = {
    "empty": ("empty.txt", b"", 422, "empty"),
    "binary named .txt": ("photo.txt", bytes(range(256)) * 40, 422, "not text"),
    "damaged PDF": ("broken.pdf", damaged_pdf(), 422, "damaged"),
    "encrypted PDF": ("locked.pdf", encrypted_pdf(), 422, "encrypted"),
    "scanned PDF": ("scan.pdf", scanned_pdf(), 422, "no text found; scanned PDFs are not read"),
    "unknown kind": ("setup.exe", b"MZ\x90\x00", 415, "not a kind of file"),
}


@pytest.mark.parametrize("bad", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_file_gets_a_clear_error_stores_nothing_and_leaves_the_rest_working(request, mode, start_app, fake, bad):
    app = start_app()
    client, conversation_id = new_conversation(app)
    name, data, status, reason = bad
    answer = upload(app, conversation_id, name, data)
    assert answer[0] == status and reason.lower() in answer[1]["detail"].lower(), answer
    assert documents(app, conversation_id) == []
    assert rows(request, mode, app, "SELECT count(*) FROM documents") == [(0,)]
    # Other uploads and chats are unaffected.
    assert upload(app, conversation_id, "good.md", b"A good file about owls.")[0] == 201
    assert wait_indexed(app, conversation_id)[0]["status"] == "ready"
    assert client.turn("Owls?")[-1]["status"] == "complete"


def test_a_file_over_the_size_limit_gets_413_while_it_comes_in_and_stores_nothing(request, mode, start_app):
    app = start_app("--limit-document-bytes", "2000")
    _, conversation_id = new_conversation(app)
    status, answer = upload(app, conversation_id, "big.txt", b"word " * 1000)  # within the body's slack
    assert status == 413 and "over the limit of 0.002 MB" in answer["detail"]
    # Declared too long: refused before a byte of the body is read.
    status, _ = upload(app, conversation_id, "huge.txt", b"x" * 200_000)
    assert status == 413
    # Chunked, with no length declared: refused as it passes the limit, without reading the rest.
    assert post_chunked(app, f"/api/conversations/{conversation_id}/documents", "streamed.txt", 500_000) == 413
    assert documents(app, conversation_id) == []
    assert rows(request, mode, app, "SELECT count(*) FROM documents") == [(0,)]


def test_the_documents_of_a_conversation_and_of_a_user_are_limited(start_app):
    app = start_app("--limit-documents-per-conversation", "2", "--limit-document-bytes-per-user", "300")
    _, first = new_conversation(app)
    assert upload(app, first, "a.md", b"a" * 100)[0] == 201
    assert upload(app, first, "b.md", b"b" * 100)[0] == 201
    status, answer = upload(app, first, "c.md", b"c" * 10)
    assert status == 409 and "the most it may have (2)" in answer["detail"]
    _, second = new_conversation(app)
    status, answer = upload(app, second, "d.md", b"d" * 150)  # 200 + 150 > 300 for this user
    assert status == 409 and "remove some first" in answer["detail"]
    assert upload(app, second, "e.md", b"e" * 100)[0] == 201  # 300: within
    assert len(documents(app, first)) == 2 and len(documents(app, second)) == 1


def test_documents_are_their_owners_and_a_retrieval_never_returns_another_users_passage(start_app, fake):
    app = start_app("--auth", "header", *SEARCHED)
    alice, bob = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}
    alice_client, alices = new_conversation(app, **alice)
    assert (
        upload(app, alices, "alice.md", b"The vault code of Alice is 7741 and nobody else knows it.", **alice)[0] == 201
    )
    wait_indexed(app, alices, **alice)
    # Bob cannot see, add to or remove from Alice's conversation: it does not exist for him.
    assert call(app, "GET", f"/api/conversations/{alices}/documents", **bob)[0] == 404
    assert upload(app, alices, "bob.md", b"Bob's note.", **bob)[0] == 404
    alice_doc = documents(app, alices, **alice)[0]["id"]
    assert call(app, "DELETE", f"/api/conversations/{alices}/documents/{alice_doc}", **bob)[0] == 404
    assert documents(app, alices, **alice)[0]["status"] == "ready"
    # Bob's own conversation, with his own document: his question about the vault finds only his passage.
    bob_client, bobs = new_conversation(app, **bob)
    bob_text = "Bob keeps a vault too, but its code is written nowhere. " * 20 + "\n\n" + "Gardening tips. " * 80
    assert upload(app, bobs, "bob.md", bob_text.encode(), **bob)[0] == 201
    wait_indexed(app, bobs, **bob)
    sources = sources_of(bob_client.turn("What is the vault code of Alice?"))
    assert sources and {s["source"] for s in sources} == {"bob.md"}
    assert "7741" not in system_prompt(fake)
    assert "7741" in json.dumps(sources_of(alice_client.turn("What is the vault code?")))


def test_removing_a_document_deletes_its_passages_and_it_is_no_longer_cited(request, mode, start_app, fake):
    app = start_app()
    client, conversation_id = new_conversation(app)
    upload(app, conversation_id, "keep.md", b"The lighthouse keeper feeds the cat at noon.")
    _, gone = upload(app, conversation_id, "gone.md", b"The ferry leaves the harbour at six.")
    wait_indexed(app, conversation_id, 2)
    assert call(app, "DELETE", f"/api/conversations/{conversation_id}/documents/{gone['id']}")[0] == 204
    told: list[dict[str, Any]] = []
    while {"id": gone["id"], "status": "removed"} not in told:
        told += [f["document"] for f in client.until("document") if f["type"] == "document"]
    assert [d["name"] for d in documents(app, conversation_id)] == ["keep.md"]
    assert rows(request, mode, app, f"SELECT count(*) FROM chunks WHERE document_id = '{gone['id']}'") == [(0,)]
    assert [s["source"] for s in sources_of(client.turn("When does the ferry leave?"))] == ["keep.md"]
    assert call(app, "DELETE", f"/api/conversations/{conversation_id}/documents/{gone['id']}")[0] == 404


def test_deleting_a_conversation_deletes_its_documents_passages_and_vectors(request, mode, start_app, fake):
    app = start_app()
    _, doomed = new_conversation(app)
    _, kept = new_conversation(app)
    upload(app, doomed, "doomed.md", b"Passages about comets and their tails. " * 40)
    upload(app, kept, "kept.md", b"Passages about rivers.")
    wait_indexed(app, doomed)
    wait_indexed(app, kept)
    assert call(app, "DELETE", f"/api/conversations/{doomed}")[0] == 204
    assert rows(request, mode, app, "SELECT conversation_id FROM documents") == [(kept,)]
    assert rows(request, mode, app, "SELECT DISTINCT conversation_id FROM chunks") == [(kept,)]
    if mode == "single":  # the full-text index follows its table (PostgreSQL's is a column of it)
        assert rows(request, mode, app, "SELECT count(*) FROM chunks_text WHERE chunks_text MATCH 'comets'") == [(0,)]


def test_the_export_lists_the_documents_and_the_sources_cited(start_app, fake):
    app = start_app()
    client, conversation_id = new_conversation(app)
    upload(app, conversation_id, "menu.md", b"Soup of the day: leek and potato.")
    wait_indexed(app, conversation_id)
    client.turn("What is the soup?")
    with urllib.request.urlopen(f"{app.url}/api/conversations/{conversation_id}/export.md", timeout=10) as response:
        markdown = response.read().decode()
    assert "Documents:\n\n- menu.md (33 bytes, ready)" in markdown
    assert "Sources:\n\n- [1] menu.md" in markdown


def test_metrics_count_documents_indexed_and_failed_their_chunks_and_retrieval_time(start_app, fake):
    app = start_app()
    client, conversation_id = new_conversation(app)
    upload(app, conversation_id, "one.md", b"First file. " * 200)
    wait_indexed(app, conversation_id)
    chunks = documents(app, conversation_id)[0]["chunks"]
    client.turn("First?")
    assert metric(app, "pocketchat_documents_indexed_total") == 1
    assert metric(app, "pocketchat_document_chunks_total") == chunks
    assert metric(app, "pocketchat_retrieval_seconds_count") == 1
    assert metric(app, "pocketchat_documents_failed_total") == 0


def test_a_process_killed_while_indexing_leaves_no_document_that_looks_ready(request, mode, start_app, fake):
    """One process: its next start marks the document failed. Replicas: another replica running beside it
    notices the indexing gave no sign of life for 20 s, and marks it failed (its sockets are told)."""
    app = start_app()
    client, conversation_id = new_conversation(app)
    long_text = "\n\n".join(f"Paragraph {i} tells of the {i}th lantern of the old bridge. " * 8 for i in range(600))
    status, document = upload(app, conversation_id, "long.md", long_text.encode())
    assert status == 201
    while not any(f["type"] == "document" and f["document"]["progress"] > 0.05 for f in client.until("document")):
        pass
    if mode == "replicas":
        other = start_app()
        watcher, _ = new_conversation(other)
        watcher.hello(conversation_id)
        app.kill()
        deadline = time.monotonic() + 60
        # (Progress the dead replica sent just before it died may come first.)
        while (told := watcher.until("document", timeout=deadline - time.monotonic())[-1]["document"])[
            "status"
        ] == "indexing":
            pass
        assert told["id"] == document["id"] and told["status"] == "failed"
        app = other
    else:
        app.kill()
        app.start()  # the same database
    [found] = documents(app, conversation_id)
    assert found["status"] == "failed" and "cut short" in found["error"]
    assert rows(request, mode, app, "SELECT count(*) FROM chunks") == [(0,)]
    asker = app.client()
    asker.hello(conversation_id)
    assert sources_of(asker.turn("Lanterns?")) == []


def test_with_an_embedding_model_named_the_providers_embeddings_are_used_and_no_local_model_loads(start_app, fake):
    app = start_app("--embedding-model", "fake-embedder", *SEARCHED)
    client, conversation_id = new_conversation(app)
    assert upload(app, conversation_id, "report.pdf", text_pdf(REPORT_PAGES))[0] == 201
    assert upload(app, conversation_id, "garden.md", NOTES.encode())[0] == 201
    wait_indexed(app, conversation_id, 2)  # too big together to be given whole: searched
    fake.queue(Reply(tokens=["Eleven kilos [1]."]))
    sources = sources_of(client.turn("How much honey did the beehive give?"))
    # The fake's embeddings are hashed words: how well they rank is not the point, that they are used is.
    assert any("eleven kilos of honey" in source["text"] for source in sources)
    assert "eleven kilos of honey" in system_prompt(fake)
    asked = [r["json"] for r in fake.requests if r["path"].endswith("/embeddings")]
    assert asked and all(request["model"] == "fake-embedder" for request in asked)
    assert "How much honey did the beehive give?" in asked[-1]["input"]  # the question, embedded there too
    assert metric(app, "pocketchat_embedding_model_loaded") == 0
