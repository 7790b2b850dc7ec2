"""History lives in a real SQLite file and survives restarts and crashes."""

import sqlite3
import time

from tests.conftest import reply_text
from tests.fake_openai import Reply


def test_history_survives_a_restart_on_the_same_database(app, fake):
    client = app.client()
    session = client.hello()["session_id"]
    first = client.turn("remember this")
    app.stop()
    app.start()
    ready = app.client().hello(session)
    assert [(m["role"], m["content"], m["status"]) for m in ready["history"]] == [
        ("user", "remember this", "complete"),
        ("assistant", reply_text(first), "complete"),
    ]
    assert ready["history"][1]["id"] == first[-1]["message_id"]
    assert ready["title"] == "remember this"


def test_a_shutdown_mid_turn_stores_the_partial_reply(app, fake):
    fake.queue(Reply(count=500, pace=0.02))
    client = app.client()
    session = client.hello()["session_id"]
    client.send("message", content="long one")
    received = client.until("turn_start") + client.until("chunk")
    app.stop()
    app.start()
    reply = app.client().hello(session)["history"][1]
    assert reply["status"] == "stopped"
    assert reply["content"].startswith(reply_text(received))


def test_a_crash_mid_turn_is_marked_interrupted_with_what_was_stored(app, fake):
    fake.queue(Reply(count=200, pace=0.02))
    client = app.client()
    session = client.hello()["session_id"]
    client.send("message", content="this will crash")
    client.until("turn_start")
    time.sleep(2.6)  # past the first checkpoint
    app.kill()
    app.start()
    assert "marked 1 replies cut short by an earlier crash as interrupted" in app.logs()
    history = app.client().hello(session)["history"]
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[1]["status"] == "interrupted"
    assert history[1]["content"].startswith("tok1 tok2 ")


def test_the_database_uses_wal_and_holds_both_messages_of_a_turn(app, fake):
    client = app.client()
    session = client.hello()["session_id"]
    client.turn("stored")
    with sqlite3.connect(app.db_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = db.execute(
            "SELECT role, status, turn_id FROM messages WHERE conversation_id = ? ORDER BY seq", (session,)
        ).fetchall()
    assert [row[:2] for row in rows] == [("user", "complete"), ("assistant", "complete")]
    assert rows[0][2] == rows[1][2] is not None
