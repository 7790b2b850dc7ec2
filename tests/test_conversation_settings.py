"""Per-conversation sampling (temperature, top_p, max_tokens): validated, stored, told to every socket
and replica, sent to the provider, honoured by the embedded model."""

import json
import urllib.error
import urllib.request

import pytest

from tests.conftest import MODES

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)
USER = "X-Forwarded-User"


def request(app, method: str, path: str, body: dict | None = None, user: str = "alice") -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", USER: user}
    req = urllib.request.Request(app.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def change(app, conversation: str, sampling: dict, user: str = "alice") -> dict:
    status, body = request(app, "PATCH", f"/api/conversations/{conversation}", {"sampling": sampling}, user)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture
def app(start_app):
    return start_app("--auth", "header")


def test_unset_settings_are_not_sent_to_the_provider(app, fake):
    client = app.client(**{USER: "alice"})
    assert client.hello()["sampling"] == {}
    client.turn("hello")
    sent = fake.chat_requests[-1]["json"]
    assert not {"temperature", "top_p", "max_tokens"} & set(sent)


def test_settings_are_stored_told_to_every_socket_and_sent(app, fake):
    client = app.client(**{USER: "alice"})
    conversation = client.hello()["conversation_id"]
    settings = {"temperature": 0.7, "top_p": 0.5, "max_tokens": 64}
    assert change(app, conversation, settings)["sampling"] == settings
    assert client.until("conversation")[-1]["sampling"] == settings
    client.turn("hello")
    sent = fake.chat_requests[-1]["json"]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.7, 0.5, 64)
    # Kept with the conversation: a new socket, the list and the conversation itself say so.
    assert app.client(**{USER: "alice"}).hello(conversation)["sampling"] == settings
    status, body = request(app, "GET", "/api/conversations")
    assert status == 200 and json.loads(body)["conversations"][0]["sampling"] == settings


def test_null_returns_a_setting_to_the_default_and_leaves_the_others(app, fake):
    client = app.client(**{USER: "alice"})
    conversation = client.hello()["conversation_id"]
    change(app, conversation, {"temperature": 1.5, "max_tokens": 32})
    assert change(app, conversation, {"temperature": None})["sampling"] == {"max_tokens": 32}
    client.turn("hello")
    sent = fake.chat_requests[-1]["json"]
    assert "temperature" not in sent and sent["max_tokens"] == 32


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": 2.25}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": 1.75}, "top_p"),
        ({"top_p": -0.25}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 12.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 98765432109}, "max_tokens"),
        ({"temperature": 0.5, "top_p": 7.125}, "top_p"),
    ],
)
def test_an_out_of_range_value_is_refused_naming_the_field_and_changes_nothing(app, fake, sampling, field):
    client = app.client(**{USER: "alice"})
    conversation = client.hello()["conversation_id"]
    change(app, conversation, {"temperature": 0.25})
    status, body = request(app, "PATCH", f"/api/conversations/{conversation}", {"sampling": sampling})
    assert status == 422
    problems = json.loads(body)["detail"]
    assert [problem["loc"] for problem in problems] == [["body", "sampling", field]]
    for value in sampling.values():
        assert str(value).encode() not in body  # never echoed
    assert app.client(**{USER: "alice"}).hello(conversation)["sampling"] == {"temperature": 0.25}


def test_another_user_can_neither_see_nor_change_the_settings(app):
    conversation = app.client(**{USER: "alice"}).hello()["conversation_id"]
    change(app, conversation, {"top_p": 0.5})
    status, _ = request(app, "PATCH", f"/api/conversations/{conversation}", {"sampling": {"top_p": 0.1}}, "bob")
    assert status == 404
    status, body = request(app, "GET", "/api/conversations", user="bob")
    assert json.loads(body)["conversations"] == []
    assert app.client(**{USER: "alice"}).hello(conversation)["sampling"] == {"top_p": 0.5}


def test_a_change_on_one_replica_reaches_the_sockets_and_turns_of_another(start_app, fake, mode):
    if mode == "single":
        pytest.skip("replicas only")
    first, second = start_app("--auth", "header"), start_app("--auth", "header")
    watcher = second.client(**{USER: "alice"})
    conversation = first.client(**{USER: "alice"}).hello()["conversation_id"]
    change(first, conversation, {"temperature": 0.0})  # stored: the other replica can open it
    assert watcher.hello(conversation)["sampling"] == {"temperature": 0.0}
    change(first, conversation, {"temperature": 1.25, "max_tokens": 9})
    assert watcher.until("conversation")[-1]["sampling"] == {"temperature": 1.25, "max_tokens": 9}
    watcher.turn("from the other replica")
    sent = fake.chat_requests[-1]["json"]
    assert (sent["temperature"], sent["max_tokens"]) == (1.25, 9)


def test_a_conversation_stored_before_settings_existed_has_none(request, mode, start_app, fake, tmp_path):
    """The migration step: a conversation of an older database loads with no settings, and takes some."""
    import asyncio
    import sqlite3

    import asyncpg

    from pocketchat.hashes import token_hash
    from pocketchat.store.postgres_schema import MIGRATIONS as postgres_schema
    from pocketchat.store.postgres_schema import SCHEMA_VERSION_TABLE
    from pocketchat.store.sqlite_schema import MIGRATIONS as sqlite_schema

    def before_settings(steps: list[str]) -> list[str]:
        return steps[: next(i for i, step in enumerate(steps) if "ADD COLUMN sampling" in step)]

    row = ("old-conversation-id", "alice", "Before settings", "fake-model", "", 1.0, 2.0)
    insert = "INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at) VALUES "
    if mode == "single":
        with sqlite3.connect(tmp_path / "chat.db") as db:
            db.create_function("token_hash", 1, token_hash)
            for number, step in enumerate(before_settings(sqlite_schema), start=1):
                db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
            db.execute(insert + "(?, ?, ?, ?, ?, ?, ?)", row)
    else:

        async def older() -> None:
            db = await asyncpg.connect(request.getfixturevalue("fresh_postgres_url"))
            try:
                await db.execute(SCHEMA_VERSION_TABLE)
                for number, step in enumerate(before_settings(postgres_schema), start=1):
                    await db.execute(step)
                    await db.execute("INSERT INTO schema_version VALUES ($1, 0)", number)
                await db.execute(insert + "($1, $2, $3, $4, $5, $6, $7)", *row)
            finally:
                await db.close()

        asyncio.run(older())
    app = start_app("--auth", "header")
    client = app.client(**{USER: "alice"})
    assert client.hello("old-conversation-id")["sampling"] == {}
    change(app, "old-conversation-id", {"top_p": 0.25})
    client.turn("hello")
    assert fake.chat_requests[-1]["json"]["top_p"] == 0.25


@pytest.mark.model
@pytest.mark.timeout(600)  # the embedded model on a busy machine
def test_the_embedded_model_honours_max_tokens_and_temperature(start_app, mode):
    if mode == "replicas":
        pytest.skip("the embedded model runs alike in both modes; once is enough for its seconds")
    app = start_app("--auth", "header", "--provider", "local")
    client = app.client(**{USER: "alice"})
    conversation = client.hello()["conversation_id"]
    change(app, conversation, {"max_tokens": 5})
    client.send("message", content="Write a long story about a lighthouse keeper.")
    end = client.until("turn_end", timeout=180)[-1]  # the weights load first
    assert end["status"] == "complete" and end["usage"]["completion_tokens"] <= 5
    # Temperature 0 is greedy: the same prompt gets the same reply (the default, 0.2, samples).
    change(app, conversation, {"max_tokens": 12, "temperature": 0})
    replies = []
    for _ in range(2):
        client.send("regenerate")
        frames = client.until("turn_end", timeout=180)  # a busy machine: seconds a token
        assert frames[-1]["status"] == "complete"
        replies.append("".join(f["content"] for f in frames if f["type"] == "chunk"))
    assert replies[0] == replies[1] and replies[0].strip()
