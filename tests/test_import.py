"""Import and JSON export over real HTTP, the app under uvicorn, in one process on SQLite and in a replica
on PostgreSQL and Redis: a conversation's whole tree round-trips; ChatGPT's branches become ours with
the chosen path; a thousand conversations go in the background while another user's reply streams; a
bad file is refused with nothing stored; an import is its importer's, under new ids."""

import copy
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pocketchat.transfer.native import FORMAT, VERSION
from tests.conftest import AppProcess, reply_text
from tests.fake_openai import Reply
from tests.test_auth import TOKEN, sign_in
from tests.test_documents import call, multipart, rows

pytestmark = pytest.mark.parametrize("mode", ["single", "replicas"], indirect=True)

CHATGPT = Path(__file__).parent / "files" / "chatgpt_conversations.json"
ALICE, BOB = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}


def trips(count: int) -> bytes:
    """A ChatGPT export of `count` conversations: the Lisbon one, titled "Trip 0", "Trip 1"..."""
    lisbon = json.loads(CHATGPT.read_text())[0]
    return json.dumps([copy.deepcopy(lisbon) | {"title": f"Trip {number}"} for number in range(count)]).encode()


def post_import(app: AppProcess, data: bytes, name: str = "conversations.json", **headers: str) -> tuple[int, Any]:
    body, content_type = multipart(name, data, "application/json")
    return call(app, "POST", "/api/imports", body, **{"Content-Type": content_type, **headers})


def imported(app: AppProcess, data: bytes, **headers: str) -> dict[str, Any]:
    """Import `data` and wait for the end; the import's last status."""
    status, job = post_import(app, data, **headers)
    assert status == 202, job
    deadline = time.monotonic() + 120
    while job["status"] == "importing" and time.monotonic() < deadline:
        time.sleep(0.05)
        job = call(app, "GET", f"/api/imports/{job['id']}", **headers)[1]
    assert job["status"] == "done", job
    return job


def exported(app: AppProcess, conversation_id: str, **headers: str) -> dict[str, Any]:
    status, data = call(app, "GET", f"/api/conversations/{conversation_id}/export.json", **headers)
    assert status == 200, data
    return data


def listed(app: AppProcess, **headers: str) -> dict[str, str]:
    """The user's conversations: title by id."""
    return {c["id"]: c["title"] for c in call(app, "GET", "/api/conversations", **headers)[1]["conversations"]}


def shape(data: dict[str, Any]) -> dict[str, Any]:
    """An export without its ids: each parent and the chosen message named by position instead."""
    position = {message["id"]: number for number, message in enumerate(data["messages"])}
    conversation = {k: v for k, v in data["conversation"].items() if k != "id"}
    conversation["leaf_id"] = position.get(conversation["leaf_id"])
    messages = [m | {"id": None, "parent_id": position.get(m["parent_id"])} for m in data["messages"]]
    return {**data, "conversation": conversation, "messages": messages}


def chosen_path(data: dict[str, Any]) -> list[str]:
    by_id = {message["id"]: message for message in data["messages"]}
    path, at = [], data["conversation"]["leaf_id"]
    while at is not None:
        path.append(by_id[at]["content"])
        at = by_id[at]["parent_id"]
    return path[::-1]


def stored_counts(request: pytest.FixtureRequest, mode: str, app: AppProcess) -> tuple[int, int]:
    query = "SELECT (SELECT count(*) FROM conversations), (SELECT count(*) FROM messages)"
    return tuple(rows(request, mode, app, query)[0])  # type: ignore[return-value]


def test_chatgpt_branches_become_our_tree_with_its_chosen_path(start_app):
    app = start_app("--model", "our-model")
    job = imported(app, CHATGPT.read_bytes())
    assert job["total"] == job["imported"] == 2
    assert job["dropped"]["tool calls"] == 1 and job["dropped"]["system messages"] == 2
    conversations = {title: exported(app, id) for id, title in listed(app).items()}
    lisbon, arithmetic = conversations["Weekend in Lisbon"], conversations["Arithmetic"]
    assert chosen_path(lisbon) == [
        "Plan a weekend in Lisbon",
        "Here is a two-day plan: 😀 Alfama, then Sintra.",
        "What is this place?",
        "Let me look that up.\n\nThat is the Belém Tower.",
    ]
    assert len(lisbon["messages"]) == 7  # the other version of the first reply and its continuation too
    assert chosen_path(arithmetic) == ["What is 2+2?", "4"]  # the older of two first messages
    assert len([m for m in arithmetic["messages"] if m["parent_id"] is None]) == 2
    assert lisbon["conversation"]["model"] == "our-model"  # this app's; each reply keeps ChatGPT's in meta
    assert lisbon["conversation"]["created_at"] == 1718000000.0


def test_an_app_started_from_another_directory_imports_too(start_app, tmp_path):
    # `python /srv/pocketchat/main.py`: the file's reader runs as a module of the app, wherever that is.
    app = start_app(cwd=tmp_path)
    assert imported(app, CHATGPT.read_bytes())["imported"] == 2


def test_the_json_export_round_trips_exactly_through_an_import(start_app, fake):
    app = start_app()
    imported(app, CHATGPT.read_bytes())
    client = app.client()
    chatted = client.hello()["conversation_id"]
    fake.queue(Reply(tokens=["All ", "well."], reasoning=["thinking"]))
    client.turn("How are you?")
    sampling = {"temperature": 0.3, "max_tokens": 64}
    body = json.dumps({"sampling": sampling}).encode()
    assert call(app, "PATCH", f"/api/conversations/{chatted}", body, **{"Content-Type": "application/json"})[0] == 200
    for conversation_id in [chatted, *listed(app)]:
        first = exported(app, conversation_id)
        before = set(listed(app))
        imported(app, json.dumps(first).encode())
        (copy_id,) = set(listed(app)) - before
        again = exported(app, copy_id)
        assert copy_id != conversation_id and again["conversation"]["id"] == copy_id
        assert {m["id"] for m in again["messages"]}.isdisjoint(m["id"] for m in first["messages"])
        assert shape(again) == shape(first)
    turn = exported(app, chatted)["messages"]
    assert turn[1]["reasoning"] == "thinking" and turn[1]["meta"]["usage"]
    assert exported(app, chatted)["conversation"]["sampling"] == sampling


def long_conversation(count: int) -> dict[str, Any]:
    """Our file of one conversation of `count` messages in a line."""
    messages = [
        {"id": f"m{n}", "parent_id": f"m{n - 1}" if n else None, "role": ("user", "assistant")[n % 2],
         "content": f"message {n} of a long conversation", "reasoning": "", "status": "complete", "error": None,
         "meta": {}, "created_at": 1.0 + n}
        for n in range(count)
    ]  # fmt: skip
    conversation = {"id": "long", "title": "Long", "model": "m", "system_prompt": "", "tools_off": [],
                    "sampling": {}, "created_at": 1.0, "updated_at": 2.0, "leaf_id": f"m{count - 1}"}  # fmt: skip
    return {"format": FORMAT, "version": VERSION, "conversation": conversation, "messages": messages}


def test_another_users_replies_are_saved_while_a_conversation_of_80000_messages_is_written(start_app, fake):
    """A conversation of 80,000 messages (31 MB) in one transaction held every other write up for seconds:
    on PostgreSQL over the 2 s a turn's end waits for its save, and other users' turns ended in errors
    (this fails there without the parts; SQLite wrote it in about 1.5 s). In parts, their replies are
    saved as they end."""
    app = start_app("--auth", "header")
    bob = app.client(**BOB)
    bob.hello()
    fake.queue(*[Reply(count=20, pace=0.01)] * 200)
    status, job = post_import(app, json.dumps(long_conversation(80_000)).encode(), **ALICE)
    assert status == 202, job
    turns = []
    while job["status"] == "importing":
        turns.append(bob.turn("Hello"))
        job = call(app, "GET", f"/api/imports/{job['id']}", **ALICE)[1]
    assert job["status"] == "done" and turns
    errors = [frame for frames in turns for frame in frames if frame["type"] == "error"]
    assert errors == [] and {frames[-1]["status"] for frames in turns} == {"complete"}


def test_a_thousand_conversations_import_in_the_background_while_another_user_chats(start_app, fake):
    app = start_app("--auth", "header")
    many = trips(1000)
    bob = app.client(**BOB)
    bob.hello()
    fake.queue(Reply(tokens=["Hello ", "Bob."]))
    seen: list[dict[str, Any]] = []

    def follow(job: dict[str, Any]) -> None:
        while job["status"] == "importing":
            seen.append(job)
            job = call(app, "GET", f"/api/imports/{job['id']}", **ALICE)[1]
        seen.append(job)

    status, job = post_import(app, many, **ALICE)
    assert status == 202 and job["total"] == 1000
    watcher = threading.Thread(target=follow, args=(job,))
    watcher.start()
    started = time.monotonic()
    frames = bob.turn("Hi")  # while the import writes
    took = time.monotonic() - started
    watcher.join(120)
    assert reply_text(frames) == "Hello Bob."
    assert frames[-1]["status"] == "complete" and took < 10  # generous: bench/import.py measures it
    assert seen[-1]["status"] == "done" and seen[-1]["imported"] == 1000
    progress = [job["imported"] for job in seen]
    assert progress == sorted(progress) and any(0 < done < 1000 for done in progress)
    assert len(listed(app, **ALICE)) == 1000
    assert set(listed(app, **BOB).values()) == {"Hi"}


def test_an_imports_progress_can_be_asked_of_any_replica(mode, start_app):
    if mode == "single":
        pytest.skip("replicas only")
    # Behind a round-robin proxy, the page's polls reach both replicas in turn.
    a, b = start_app("--auth", "header"), start_app("--auth", "header")
    status, job = post_import(a, trips(1000), **ALICE)
    assert status == 202
    seen = [call(b, "GET", f"/api/imports/{job['id']}", **ALICE)]
    assert seen[0][0] == 200 and seen[0][1]["total"] == 1000  # at once: as the upload's answer went out
    while seen[-1][1].get("status") == "importing":
        time.sleep(0.05)
        seen.append(call(b, "GET", f"/api/imports/{job['id']}", **ALICE))
    assert {code for code, _ in seen} == {200}
    assert seen[-1][1] == call(a, "GET", f"/api/imports/{job['id']}", **ALICE)[1]
    assert seen[-1][1]["status"] == "done" and seen[-1][1]["imported"] == 1000
    progress = [answer["imported"] for _, answer in seen]
    assert progress == sorted(progress) and any(0 < done < 1000 for done in progress)
    assert call(b, "GET", f"/api/imports/{job['id']}", **BOB)[0] == 404  # an import is its importer's


def test_a_user_runs_one_import_at_a_time_whichever_replica_each_reaches(mode, start_app):
    a = start_app("--auth", "header")
    b = start_app("--auth", "header") if mode == "replicas" else a
    many = trips(2000)
    status, job = post_import(a, many, **ALICE)
    assert status == 202
    status, refused = post_import(b, many, **ALICE)
    assert status == 409 and "under way already" in refused["detail"]
    assert post_import(b, trips(1), **BOB)[0] == 202  # another user's goes ahead
    path = f"/api/imports/{job['id']}"
    while call(a, "GET", path, **ALICE)[1]["status"] == "importing":
        time.sleep(0.1)
    assert post_import(b, trips(1), **ALICE)[0] == 202  # once it ended


def test_an_import_cut_short_by_a_crash_keeps_nothing_of_it(mode, start_app):
    """A process killed mid-import runs no undo: what it wrote is deleted by the app that finds it gone, at
    start (one process), or when the page asks another replica how the import went, which says it stopped
    (replicas); nothing else is."""
    a = start_app("--auth", "header")
    before = (imported(a, trips(1), **ALICE), listed(a, **ALICE))[1]
    status, job = post_import(a, trips(3000), **ALICE)
    assert status == 202
    path = f"/api/imports/{job['id']}"

    def progress(app: AppProcess, at_least: int) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while (seen := call(app, "GET", path, **ALICE)[1])["imported"] < at_least:
            assert time.monotonic() < deadline and seen["status"] == "importing", seen
            time.sleep(0.02)
        return seen

    seen = progress(a, 1)
    if mode == "replicas":  # a replica starting mid-import leaves the live one's import alone
        b = start_app("--auth", "header")
        seen = progress(a, seen["imported"] + 50)
        assert len(listed(b, **ALICE)) >= seen["imported"] + 1
    assert call(a, "GET", path, **ALICE)[1]["status"] == "importing"
    a.kill()
    if mode == "single":
        a.start()
        assert listed(a, **ALICE) == before
        return
    deadline = time.monotonic() + 30  # a heartbeat's life (about 3 s), then 10 s of no news
    while (seen := call(b, "GET", path, **ALICE)[1])["status"] == "importing":
        assert time.monotonic() < deadline, "a dead replica's import still says it is importing"
        time.sleep(0.2)
    assert seen["status"] == "failed" and "stopped before it finished" in seen["error"]
    assert "nothing of it was kept" in seen["error"] and seen["imported"] == 0
    assert listed(b, **ALICE) == before


def first_imported(app: AppProcess, job: dict[str, Any]) -> str:
    """The id of a conversation the import under way has written, once it has written one."""
    deadline = time.monotonic() + 60
    while not (ids := list(listed(app, **ALICE))):
        assert time.monotonic() < deadline, "the import wrote nothing"
        time.sleep(0.02)
    return ids[0]


def test_a_conversation_an_import_is_still_writing_can_be_read_but_not_changed_until_it_ends(mode, start_app, fake):
    """Should the import fail, the conversation goes whole: a message, an upload or a setting of the
    user's there would go with it. They are refused, with why, and nothing is changed, until it ends."""
    app = start_app("--auth", "header")
    status, job = post_import(app, trips(1500), **ALICE)
    assert status == 202
    path = f"/api/imports/{job['id']}"
    conversation_id = first_imported(app, job)
    page = app.client(**ALICE)
    ready = page.hello(conversation_id)
    assert ready["conversation_id"] == conversation_id and ready["history"]  # it can be read
    for frame in ({"type": "message", "content": "Hello there"}, {"type": "regenerate"}):
        page.send(**frame)
        refused = page.until("error")[-1]
        assert refused["code"] == "importing" and "still being imported" in refused["message"], refused
    changed = call(app, "PATCH", f"/api/conversations/{conversation_id}", b'{"title": "Mine"}',
                   **{"Content-Type": "application/json", **ALICE})  # fmt: skip
    assert changed[0] == 409 and "still being imported" in changed[1]["detail"]
    body, content_type = multipart("notes.txt", b"wombats")
    uploaded = call(app, "POST", f"/api/conversations/{conversation_id}/documents", body,
                    **{"Content-Type": content_type, **ALICE})  # fmt: skip
    assert uploaded[0] == 409 and "still being imported" in uploaded[1]["detail"]
    assert call(app, "GET", path, **ALICE)[1]["status"] == "importing"  # all of that while it ran
    while call(app, "GET", path, **ALICE)[1]["status"] == "importing":
        time.sleep(0.1)
    before = exported(app, conversation_id, **ALICE)
    assert before["conversation"]["title"] != "Mine" and "Hello there" not in json.dumps(before)
    fake.queue(Reply(tokens=["Welcome ", "back."]))
    frames = page.turn("Hello again")  # the same copy, loaded while the import ran
    assert reply_text(frames) == "Welcome back." and frames[-1]["status"] == "complete"
    assert call(app, "PATCH", f"/api/conversations/{conversation_id}", b'{"title": "Mine"}',
                **{"Content-Type": "application/json", **ALICE})[0] == 200  # fmt: skip


def test_the_pages_on_a_conversation_of_a_failed_import_are_told_it_is_gone(mode, start_app):
    """One process: the database refuses the import's next batch (another process holds SQLite's write
    lock past its busy timeout), and the import fails. Replicas: the importing replica is killed, and
    the other one, asked how the import went, deletes what it wrote. Either way, a page showing one of
    its conversations gets `deleted` (it showed it until a reload before)."""
    a = start_app("--auth", "header")
    b = start_app("--auth", "header") if mode == "replicas" else a
    status, job = post_import(a, trips(1500), **ALICE)
    assert status == 202
    path = f"/api/imports/{job['id']}"
    conversation_id = first_imported(b, job)
    page = b.client(**ALICE)
    page.hello(conversation_id)
    late = None
    if mode == "single":
        lock = sqlite3.connect(a.db_path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            deleted = page.until("deleted", timeout=30)[-1]
            # The database refused the deletion too: it is written again once it can be. Meanwhile the
            # conversation is still stored, and a page may open it again, and read it.
            late = b.client(**ALICE)
            assert late.hello(conversation_id)["conversation_id"] == conversation_id
        finally:
            lock.execute("ROLLBACK")
            lock.close()
    else:
        a.kill()
        deadline = time.monotonic() + 30  # a heartbeat's life, then 10 s of no news (as above)
        while call(b, "GET", path, **ALICE)[1]["status"] == "importing":
            assert time.monotonic() < deadline, "a dead replica's import still says it is importing"
            time.sleep(0.2)
        deleted = page.until("deleted", timeout=10)[-1]
    assert deleted["conversation_id"] == conversation_id
    assert call(b, "GET", path, **ALICE)[1]["status"] == "failed"
    deadline = time.monotonic() + 30  # a deletion the database refused is written again (every 2 s)
    while listed(b, **ALICE):
        assert time.monotonic() < deadline, "the failed import's conversations are still listed"
        time.sleep(0.1)
    if late is not None:  # told again once the deletion landed
        assert late.until("deleted")[-1]["conversation_id"] == conversation_id
    page.send("hello", conversation_id=conversation_id)
    assert page.until("error")[-1]["code"] == "unknown_conversation"


def test_a_failed_imports_pages_on_another_replica_are_told_it_is_gone(request, mode, start_app):
    """The importing replica's own failure (its import found stopped: another replica took it for dead
    and undid it), told through Redis to a page on the other replica."""
    if mode == "single":
        pytest.skip("replicas only")
    a, b = start_app("--auth", "header"), start_app("--auth", "header")
    status, job = post_import(a, trips(1500), **ALICE)
    assert status == 202
    conversation_id = first_imported(b, job)
    page = b.client(**ALICE)
    page.hello(conversation_id)
    # As a replica that took `a` for dead would: its next batch finds its import stopped, and it fails.
    assert rows(request, mode, a, f"DELETE FROM running_imports WHERE id = '{job['id']}' RETURNING id")
    assert page.until("deleted", timeout=30)[-1]["conversation_id"] == conversation_id
    assert call(a, "GET", f"/api/imports/{job['id']}", **ALICE)[1]["status"] == "failed"
    assert listed(b, **ALICE) == {}


BAD_FILES = {
    "not json": b"{'title': 'no'}",
    "not utf-8": b"\xff\xfe[]",
    "wrong shape": b'{"conversations": []}',
    "empty list": b"[]",
    "wrong types": json.dumps([{"mapping": {"a": {"message": None, "parent": None}}, "create_time": "noon"}]).encode(),
    "unknown parent": json.dumps(
        {
            "format": "pocketchat.conversation",
            "version": 1,
            "conversation": {"title": "x", "created_at": 1, "updated_at": 1, "leaf_id": None},
            "messages": [{"id": "a", "parent_id": "ghost", "role": "user", "content": "hi", "created_at": 1}],
        }
    ).encode(),
    "cycle": CHATGPT.read_text().replace('"parent": null', '"parent": "a3"', 1).encode(),
    "lone surrogate": CHATGPT.read_text().replace("What is 2+2?", "What is \\ud83d?").encode(),
}


def test_a_bad_file_is_refused_with_why_and_nothing_is_stored(request, mode, start_app):
    app = start_app("--limit-import-bytes", "30000")
    good = json.loads(CHATGPT.read_text())
    before = stored_counts(request, mode, app)
    for name, data in BAD_FILES.items():
        if name in ("cycle", "lone surrogate", "unknown parent"):  # after good conversations
            bad = json.loads(data)
            data = json.dumps([*good, *(bad if isinstance(bad, list) else [bad])]).encode()
        status, answer = post_import(app, data)
        assert status == 422, (name, answer)
        assert isinstance(answer["detail"], str) and len(answer["detail"]) < 400, name
    for copies in (6, 30):  # over the limit; with its framing too (refused as it comes in)
        assert post_import(app, json.dumps(good * copies).encode())[0] == 413, copies
    assert stored_counts(request, mode, app) == before
    assert post_import(app, CHATGPT.read_bytes())[0] == 202  # a good file still goes in


def test_an_import_is_its_importers_and_never_touches_a_conversation_it_names(start_app, fake):
    app = start_app("--auth", "header")
    bob = app.client(**BOB)
    bobs = bob.hello()["conversation_id"]
    bob.turn("Bob's secret plan")
    bobs_export = exported(app, bobs, **BOB)
    assert call(app, "GET", f"/api/conversations/{bobs}/export.json", **ALICE)[0] == 404
    # Alice imports a file that names Bob's conversation and messages by their ids.
    forged = copy.deepcopy(bobs_export)
    forged["conversation"]["title"] = "Alice's now"
    forged["messages"][0]["content"] = "overwritten?"
    job = imported(app, json.dumps(forged).encode(), **ALICE)
    assert call(app, "GET", f"/api/imports/{job['id']}", **BOB)[0] == 404
    (alices,) = listed(app, **ALICE)
    assert alices != bobs and listed(app, **ALICE)[alices] == "Alice's now"
    assert exported(app, bobs, **BOB) == bobs_export
    assert list(listed(app, **BOB)) == [bobs]
    assert call(app, "GET", f"/api/conversations/{alices}", **BOB)[0] == 404


def test_an_import_needs_a_session_and_the_pages_own_origin(request, mode, start_app):
    app = start_app("--auth", "token", "--token", TOKEN)
    assert post_import(app, CHATGPT.read_bytes())[0] == 401
    cookie = sign_in(app)[1]
    # A form on another site cannot plant conversations in the signed-in user's account.
    assert post_import(app, CHATGPT.read_bytes(), Cookie=cookie, Origin="http://evil.example")[0] == 403
    assert stored_counts(request, mode, app) == (0, 0)
    own = f"http://127.0.0.1:{app.port}"
    assert post_import(app, CHATGPT.read_bytes(), Cookie=cookie, Origin=own)[0] == 202
