"""Versions of a reply and of an edited message: a regenerate or an edit adds a version beside the
earlier ones, which stay; the conversation shows one path, chosen with `switch`, in every tab and on
every replica; the prompt, the export, `ready` and a restart follow it."""

import asyncio
import sqlite3
import urllib.request
from typing import Any

import asyncpg
import pytest

from pocketchat.hashes import token_hash
from pocketchat.store import postgres_schema, sqlite_schema
from tests.conftest import MODES, AppProcess, ChatClient
from tests.fake_openai import Reply

both = pytest.mark.parametrize("mode", MODES, indirect=True)


def texts(history: list[dict[str, Any]]) -> list[str]:
    return [message["content"] for message in history]


def prompt(fake: Any) -> list[str]:
    """What the model was last sent, without the system prompt."""
    return [message["content"] for message in fake.chat_requests[-1]["json"]["messages"][1:]]


def answer_again(client: ChatClient) -> list[dict[str, Any]]:
    client.send("regenerate")
    return client.until("turn_end")


def switch(client: ChatClient, message_id: str) -> list[dict[str, Any]]:
    """Show the path through the message: the history the `path` frame carries."""
    client.send("switch", message_id=message_id)
    return client.until("path")[-1]["history"]


def export(app: AppProcess, conversation_id: str) -> str:
    with urllib.request.urlopen(f"{app.url}/api/conversations/{conversation_id}/export.md", timeout=10) as answer:
        return answer.read().decode()


@both
def test_a_regenerate_keeps_the_earlier_reply_and_a_switch_shows_it_in_every_tab(app, fake):
    fake.queue(*(Reply(tokens=[text]) for text in ("first", "second", "and more")))
    client, tab = app.client(), app.client()
    conversation = client.hello()["conversation_id"]
    tab.hello(conversation)
    question = client.turn("question")[0]["message"]
    first = client.frames[-1]["message_id"]
    again = answer_again(client)
    second = again[-1]["message_id"]
    # The same question answered again: a new version of its reply, beside the first.
    assert again[0]["message"]["id"] == question["id"] and again[0]["message"]["parent_id"] is None
    assert again[0]["reply"] == {"id": second, "versions": [first, second]}
    assert prompt(fake) == ["question"]
    history = app.client().hello(conversation)["history"]
    assert texts(history) == ["question", "second"]
    assert history[1]["versions"] == [first, second] and "versions" not in history[0]

    tab.until("turn_end")
    tab.until("turn_end")
    client.send("switch", message_id=first)
    for socket in (client, tab):
        path = socket.until("path")[-1]
        assert path["conversation_id"] == conversation and texts(path["history"]) == ["question", "first"]
        assert path["history"][1]["versions"] == [first, second]
    assert texts(app.client().hello(conversation)["history"]) == ["question", "first"]
    assert "first" in export(app, conversation) and "second" not in export(app, conversation)

    # A message goes on from the version shown, and only that path reaches the model.
    client.turn("more")
    assert prompt(fake) == ["question", "first", "more"]
    assert texts(app.client().hello(conversation)["history"]) == ["question", "first", "more", "and more"]


@both
def test_any_user_message_can_be_edited_and_the_path_goes_on_from_the_version_shown(app, fake):
    fake.queue(*(Reply(tokens=[text]) for text in ("r1", "r2", "r3")))
    client = app.client()
    conversation = client.hello()["conversation_id"]
    one = client.turn("one")[0]["message"]
    client.turn("two")
    client.send("edit", message_id=one["id"], content="uno")
    edited = client.until("turn_end")[0]["message"]
    assert edited["id"] != one["id"] and edited["parent_id"] is None
    assert edited["versions"] == [one["id"], edited["id"]]
    assert prompt(fake) == ["uno"]
    assert texts(app.client().hello(conversation)["history"]) == ["uno", "r3"]
    assert "two" not in export(app, conversation)
    # Back to the first version: the path goes on to the newest message after it.
    assert texts(switch(client, one["id"])) == ["one", "r1", "two", "r2"]
    # A switch to a message of the path shown keeps it.
    assert texts(switch(client, one["id"])) == ["one", "r1", "two", "r2"]
    assert "two" in export(app, conversation) and "uno" not in export(app, conversation)


@both
def test_a_switch_is_refused_while_a_turn_runs_and_for_a_message_not_in_the_conversation(app, fake):
    client = app.client()
    conversation = client.hello()["conversation_id"]
    client.send("switch", message_id="no-such-message")
    assert client.recv()["code"] == "bad_frame"
    reply = client.turn("hello")[-1]["message_id"]
    other = app.client()
    other.hello()
    elsewhere = other.turn("another conversation")[-1]["message_id"]
    client.send("switch", message_id=elsewhere)
    error = client.recv()
    assert error["code"] == "bad_frame" and "no message with that id" in error["message"]
    fake.queue(Reply(count=50, pace=0.02))
    client.send("message", content="a long one")
    client.until("chunk")
    client.send("switch", message_id=reply)
    frames = client.until("turn_end")
    assert [f["code"] for f in frames if f["type"] == "error"] == ["turn_in_progress"]
    assert not any(f["type"] == "path" for f in frames)
    assert texts(app.client().hello(conversation)["history"])[:2] == ["hello", "tok1 tok2 tok3 tok4 tok5 "]
    fresh = app.client()
    fresh.send("switch", message_id=reply)
    assert fresh.recv()["code"] == "bad_frame"


@both
def test_a_page_back_during_a_regenerate_gets_the_running_reply_with_its_versions(app, fake):
    client = app.client()
    conversation = client.hello()["conversation_id"]
    first = client.turn("question")[-1]["message_id"]
    fake.queue(Reply(count=50, pace=0.02))
    client.send("regenerate")
    start = client.until("chunk")[0]
    ready = app.client().hello(conversation)
    assert texts(ready["history"]) == ["question"]
    assert ready["running"]["message_id"] == start["reply"]["id"]
    assert ready["running"]["versions"] == [first, start["reply"]["id"]]
    assert client.until("turn_end")[-1]["status"] == "complete"


@both
def test_the_version_shown_is_the_one_shown_after_a_restart(start_app, fake):
    app = start_app()
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]))
    client = app.client()
    conversation = client.hello()["conversation_id"]
    first = client.turn("question")[-1]["message_id"]
    second = answer_again(client)[-1]["message_id"]
    switch(client, first)
    app.stop()
    history = start_app().client().hello(conversation)["history"]
    assert texts(history) == ["question", "first"] and history[1]["versions"] == [first, second]


@pytest.mark.parametrize("mode", ["replicas"], indirect=True)
def test_a_switch_right_after_a_reply_ends_is_taken(mode, start_app, fake):
    # The page lets the versions be switched once `turn_end` comes; with replicas, the ended turn's last
    # copy to Redis (which lets its lease go) may still be on its way then.
    app = start_app()
    client = app.client()
    client.hello()
    fake.queue(Reply(tokens=["first"]), *(Reply(tokens=[f"again {n}"]) for n in range(10)))
    first = client.turn("question")[-1]["message_id"]
    for _ in range(10):
        answer_again(client)
        client.send("switch", message_id=first)
        while (frame := client.recv(10))["type"] not in ("path", "error"):
            pass
        assert frame["type"] == "path", frame


@pytest.mark.parametrize("mode", ["replicas"], indirect=True)
def test_a_switch_on_one_replica_shows_on_the_other(start_app, fake):
    a, b = start_app(), start_app()
    fake.queue(Reply(tokens=["first"]), Reply(tokens=["second"]))
    on_a = a.client()
    conversation = on_a.hello()["conversation_id"]
    on_b = b.client()
    on_b.hello(conversation)
    first = on_a.turn("question")[-1]["message_id"]
    on_b.until("turn_end")  # B has followed the first turn to its end before the next starts (see below)
    answer_again(on_a)
    assert on_b.until("turn_end")[0]["reply"]["versions"][0] == first
    on_a.send("switch", message_id=first)
    assert texts(on_b.until("path")[-1]["history"]) == ["question", "first"]
    assert texts(b.client().hello(conversation)["history"]) == ["question", "first"]


@pytest.mark.parametrize("mode", ["replicas"], indirect=True)
def test_a_turn_started_right_after_the_last_one_ended_is_followed_on_the_other_replica(start_app, fake):
    # The other replica may read the second turn's announcement before the first turn's end (its
    # reader had not yet joined the first turn's stream): it must follow the second once the first
    # ends there, not drop it. A matter of milliseconds, so tried several times.
    a, b = start_app(), start_app()
    for _ in range(8):
        on_a = a.client()
        conversation = on_a.hello()["conversation_id"]
        on_b = b.client()
        on_b.hello(conversation)
        on_a.turn("question")
        answer_again(on_a)
        assert on_b.until("turn_end")[-1]["status"] == "complete"
        assert on_b.until("turn_end", timeout=10)[-1]["status"] == "complete"
        on_a.close()
        on_b.close()


# ---- an existing database: its history becomes one path ---------------------------------------------

# Two conversations' messages, interleaved as two chats would be: (conversation, role, text).
OLD_HISTORY = [("a", "user", "a1"), ("b", "user", "b1"), ("a", "assistant", "a2"), ("b", "assistant", "b2")]
OLD_HISTORY += [("a", "user", "a3"), ("a", "assistant", "a4")]
CONVERSATION = "INSERT INTO conversations (id, title, model, system_prompt, created_at, updated_at) VALUES "
MESSAGE = "INSERT INTO messages (id, conversation_id, role, content, status, created_at) VALUES "


def before_versions(migrations: list[str]) -> int:
    """How many schema steps a database had before versions."""
    return next(number for number, step in enumerate(migrations) if "ADD COLUMN parent_id" in step)


def old_sqlite_database(path: Any) -> None:
    """A file made by the release before versions (the steps before its own), with a history."""
    with sqlite3.connect(path) as db:
        db.create_function("token_hash", 1, token_hash)
        for number, step in enumerate(sqlite_schema.MIGRATIONS[: before_versions(sqlite_schema.MIGRATIONS)], start=1):
            db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
        for conversation in "ab":
            db.execute(CONVERSATION + "(?, 'old', 'fake-model', '', 1, 1)", (conversation,))
        for at, (conversation, role, text) in enumerate(OLD_HISTORY):
            db.execute(MESSAGE + "(?, ?, ?, ?, 'complete', ?)", (text, conversation, role, text, at))


async def old_postgres_database(url: str) -> None:
    """The same, in PostgreSQL."""
    db = await asyncpg.connect(url)
    try:
        await db.execute(postgres_schema.SCHEMA_VERSION_TABLE)
        for number, step in enumerate(
            postgres_schema.MIGRATIONS[: before_versions(postgres_schema.MIGRATIONS)], start=1
        ):
            await db.execute(step)
            await db.execute("INSERT INTO schema_version VALUES ($1, 0)", number)
        for conversation in "ab":
            await db.execute(CONVERSATION + "($1, 'old', 'fake-model', '', 1, 1)", conversation)
        for at, (conversation, role, text) in enumerate(OLD_HISTORY):
            await db.execute(MESSAGE + "($1, $2, $3, $4, 'complete', $5)", text, conversation, role, text, at)
    finally:
        await db.close()


@both
def test_a_database_from_before_versions_opens_as_one_path_and_takes_new_versions(
    request, mode, start_app, fake, tmp_path
):
    if mode == "single":
        old_sqlite_database(tmp_path / "chat.db")
    else:
        asyncio.run(old_postgres_database(request.getfixturevalue("fresh_postgres_url")))
    app = start_app()
    client = app.client()
    assert texts(app.client().hello("b")["history"]) == ["b1", "b2"]
    history = client.hello("a")["history"]
    assert texts(history) == ["a1", "a2", "a3", "a4"] and not any("versions" in m for m in history)
    fake.queue(Reply(tokens=["a4, again"]))
    again = answer_again(client)
    assert prompt(fake) == ["a1", "a2", "a3"]
    assert again[0]["reply"]["versions"] == ["a4", again[-1]["message_id"]]
    assert texts(switch(client, "a4")) == ["a1", "a2", "a3", "a4"]
