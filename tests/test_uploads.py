"""Uploads are read only while the user may send them (web/uploads.py): two of a user's at once, and no
further than the room left under their quota. Issue 30, row 9: 25 uploads of 19 MB at once took 475 MB of
temporary files against a 200 MB quota."""

import socket
import time

from tests.test_documents import documents, multipart, new_conversation, upload

ALICE, BOB = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}
MB = 1_000_000


def open_upload(port: int, conversation_id: str, size: int, user: str) -> tuple[socket.socket, bytes]:
    """An upload whose head and first bytes are sent, the rest held back: (the connection, what is left)."""
    body, content_type = multipart("big.txt", b"y" * size)
    head = (
        f"POST /api/conversations/{conversation_id}/documents HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"X-Forwarded-User: {user}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(head + body[:100_000])
    return connection, body[100_000:]


def status_of(connection: socket.socket, timeout: float = 30) -> int:
    connection.settimeout(timeout)
    answer = b""
    while b"\r\n" not in answer:
        received = connection.recv(4096)
        if not received:
            break
        answer += received
    return int(answer.split(b" ", 2)[1]) if answer else 0


def answered_before_the_body(connection: socket.socket) -> int:
    """The status the server gave while the body was still held back (0: none came within 5 s)."""
    try:
        return status_of(connection, timeout=5)
    except TimeoutError:
        return 0


def test_a_users_third_upload_at_once_is_refused_before_its_body_and_another_user_is_not(start_app):
    app = start_app("--auth", "header")
    _, conversation_id = new_conversation(app, **ALICE)
    _, bobs = new_conversation(app, **BOB)
    held = [open_upload(app.port, conversation_id, 2 * MB, "alice") for _ in range(2)]
    time.sleep(0.5)  # both are in the route, reading their bodies
    third, _ = open_upload(app.port, conversation_id, 2 * MB, "alice")
    assert answered_before_the_body(third) == 429
    third.close()
    assert upload(app, bobs, "bob.md", b"Bob's own file.", **BOB)[0] == 201  # Bob has a place of his own
    for connection, rest in held:
        connection.sendall(rest)
        assert status_of(connection) == 201
        connection.close()
    assert upload(app, conversation_id, "later.md", b"Once they are in, the next one goes.", **ALICE)[0] == 201


def test_an_upload_past_the_users_quota_is_refused_before_its_body_is_read(start_app):
    quota = ("--limit-document-bytes-per-user", str(3 * MB))
    app = start_app("--auth", "header", *quota)
    _, conversation_id = new_conversation(app, **ALICE)
    assert upload(app, conversation_id, "first.txt", b"x" * (2 * MB), **ALICE)[0] == 201
    # Declared larger than the 1 MB left: refused from its length, none of its body read.
    connection, _ = open_upload(app.port, conversation_id, int(1.5 * MB), "alice")
    assert answered_before_the_body(connection) == 409
    connection.close()
    assert [document["name"] for document in documents(app, conversation_id, **ALICE)] == ["first.txt"]


def test_a_chunked_upload_is_refused_once_it_passes_the_users_quota(start_app):
    app = start_app("--auth", "header", "--limit-document-bytes-per-user", str(1 * MB))
    _, conversation_id = new_conversation(app, **ALICE)
    body, content_type = multipart("big.txt", b"y" * (10 * MB))
    connection = socket.create_connection(("127.0.0.1", app.port), timeout=30)
    head = (
        f"POST /api/conversations/{conversation_id}/documents HTTP/1.1\r\nHost: 127.0.0.1:{app.port}\r\n"
        f"X-Forwarded-User: alice\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    connection.sendall(head)
    sent = 0
    connection.settimeout(0.05)
    status = 0
    while sent < len(body) and not status:
        piece = body[sent : sent + 65536]
        connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sent += len(piece)
        try:
            status = int(connection.recv(4096).split(b" ", 2)[1])
        except TimeoutError:
            continue
    connection.close()
    assert status == 409
    assert sent < 3 * MB  # answered once past the room left, not after the whole 10 MB


def test_a_files_name_shows_as_it_reads_keeps_its_kind_and_a_huge_one_is_refused_plainly(start_app):
    """Issue 31, item 13: a right-to-left override showed `invoice\u202etxt.exe.md` as "invoicedm.exe.txt"; a name
    over 200 characters lost its suffix and was refused as no kind of file; a 5,000-byte name got "Invalid
    multipart data"."""
    app = start_app()
    _, conversation_id = new_conversation(app)
    status, document = upload(app, conversation_id, "invoice\u202etxt.exe.md", b"Total: 12 euros.")
    assert status == 201 and document["name"] == "invoicetxt.exe.md"
    status, document = upload(app, conversation_id, "n" * 300 + ".md", b"A long name.")
    assert status == 201 and document["name"] == "n" * 197 + ".md"
    status, answer = upload(app, conversation_id, "x" * 5000 + ".md", b"Too long a name.")
    assert status == 400 and "name is too long" in answer["detail"]
    assert len(documents(app, conversation_id)) == 2
