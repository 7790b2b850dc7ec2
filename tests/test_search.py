"""Search (GET /api/search) over real HTTP against the app under uvicorn, in both storage modes: what it
finds, for whom, how it ranks and highlights, and that the index follows every write at once."""

import asyncio
import re
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import asyncpg
import pytest

from pocketchat.store import postgres_schema, sqlite_schema
from tests.conftest import MODES, AppProcess, ChatClient
from tests.fake_openai import Reply
from tests.test_auth import call

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)

ALICE, BOB = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}


def search(app: AppProcess, q: str, headers: dict[str, str] = ALICE, **params: Any) -> list[dict[str, Any]]:
    answer = call(app, "GET", "/api/search?" + urlencode({"q": q, **params}), **headers)
    assert answer.status == 200, answer.body
    return answer.json()["results"]


def chat(app: AppProcess, headers: dict[str, str], *messages: str) -> tuple[ChatClient, str]:
    """A new conversation of the user with these messages, each answered (the fake's default reply)."""
    client = app.client(**headers)
    conversation_id = client.hello()["conversation_id"]
    for message in messages:
        assert client.turn(message)[-1]["status"] == "complete"
    return client, conversation_id


def marked(text: str, ranges: list[list[int]]) -> list[str]:
    return [text[start:end] for start, end in ranges]


@pytest.fixture
def app(start_app: Any) -> AppProcess:
    return start_app("--auth", "header")


def test_a_user_finds_their_own_messages_and_titles_and_never_another_users(app):
    _, kube = chat(app, ALICE, "Why does the Kubernetes ingress drop websockets?")
    _, garden = chat(app, ALICE, "Plan my garden", "Which kubernetes operator backs up Postgres?")
    _, bobs = chat(app, BOB, "Bob's kubernetes cluster secrets")
    call(app, "PATCH", f"/api/conversations/{bobs}", {"title": "Alice kubernetes ingress"}, **BOB)
    results = search(app, "kubernetes")
    assert {hit["conversation_id"] for hit in results} == {kube, garden}
    # The title holds the word too (it is the first message): that conversation ranks first.
    assert [hit["conversation_id"] for hit in results] == [kube, garden]
    first = results[0]
    assert first["title"] == "Why does the Kubernetes ingress drop websockets?"
    assert marked(first["title"], first["title_highlights"]) == ["Kubernetes"]
    assert first["role"] == "user" and marked(first["snippet"], first["highlights"]) == ["Kubernetes"]
    assert results[1]["snippet"] == "Which kubernetes operator backs up Postgres?"
    assert results[0]["rank"] > results[1]["rank"]
    # Bob's words, in his messages or his title, are never Alice's results; and the other way round.
    assert search(app, "secrets") == [] and search(app, "cluster") == []
    assert [hit["conversation_id"] for hit in search(app, "kubernetes", BOB)] == [bobs]
    assert search(app, "garden", BOB) == [] and search(app, "websockets", BOB) == []


def test_every_word_must_match_the_last_one_as_a_prefix_while_typing_and_words_are_stemmed(app):
    _, conversation = chat(app, ALICE, "The deployment pipeline failed twice yesterday")
    assert [hit["conversation_id"] for hit in search(app, "pipeline twic")] == [conversation]
    assert search(app, "pipeline twic ") == []  # a finished word is matched whole
    assert search(app, "pipeline twi") == []  # and so is a short one, even while typed
    assert [hit["conversation_id"] for hit in search(app, "failing pipel")] == [conversation]
    assert [hit["conversation_id"] for hit in search(app, "FAILS Pipelines ")] == [conversation]  # stems
    assert search(app, "pipeline tuesday") == []
    hit = search(app, "yesterday pipe")[0]
    assert marked(hit["snippet"], hit["highlights"]) == ["pipeline", "yesterday"]


def test_replies_are_found_at_their_message(app, fake):
    fake.queue(Reply(tokens=["Use a ", "sourdough ", "starter fed twice a day."]))
    _, conversation = chat(app, ALICE, "How do I bake bread?")
    hit = search(app, "sourdough")[0]
    reply = call(app, "GET", f"/api/conversations/{conversation}", **ALICE).json()["messages"][1]
    assert (hit["conversation_id"], hit["message_id"], hit["role"]) == (conversation, reply["id"], "assistant")


JUNK = [
    '"', '""', "'", "*", "**", "AND", "OR", "NOT", "NEAR(", "NEAR(a b", "-", "--", ":", "a:b", "title:x",
    "content : kubernetes", '"unbalanced', "(", ")", "((a)", "^", "a*b", "{content}: x", "\\", "%", "_",
    "' OR 1=1 --", "'; DROP TABLE messages; --", "&", "|", "!", "<->", "a & b | !c", "x:*", "\x00", "é",
    "日本語", "🙂", "   ", "", "\t\n",
]  # fmt: skip


def test_junk_and_query_syntax_never_fail(app):
    chat(app, ALICE, 'kubernetes AND docker: the (NEAR) story of "quotes" and a-b tests')
    for junk in JUNK:
        answer = call(app, "GET", "/api/search?" + urlencode({"q": junk}), **ALICE)
        assert answer.status == 200, (junk, answer.body)
        assert isinstance(answer.json()["results"], list)
    # Operators are words like any other (common ones left out), never syntax.
    assert len(search(app, "kubernetes AND docker")) == 1
    assert len(search(app, 'NEAR( "quotes')) == 1
    assert search(app, "the and of") == []  # common words only: nothing to look for


def test_a_word_holding_a_letter_the_index_takes_for_a_separator_is_found(app):
    # U+19B0, a New Tai Lue vowel sign: a letter to Python, a separator to FTS5's tokenizer (Unicode 6.1),
    # for which "ab\u19b0cd" is two words, and two words in one quoted string a phrase, which an index
    # without positions refuses.
    _, conversation = chat(app, ALICE, "the word ab\u19b0cd is here")
    assert [hit["conversation_id"] for hit in search(app, "ab\u19b0cd ")] == [conversation]
    assert [hit["conversation_id"] for hit in search(app, "ab\u19b0cd")] == [conversation]  # while typed
    assert search(app, "\u19b0") == []


def test_bad_parameters_get_a_clear_422_and_the_limit_is_kept(app):
    bad = ({"q": "x" * 10_000}, {"q": "x", "limit": "0"}, {"q": "x", "limit": "51"}, {"q": "x", "limit": "a"}, {})
    for params in bad:
        answer = call(app, "GET", "/api/search?" + urlencode(params), **ALICE)
        assert answer.status == 422, params
        assert "x" * 100 not in answer.body.decode()  # the value is not echoed
    for n in range(3):
        chat(app, ALICE, f"limit test number {n}")
    assert len(search(app, "limit test")) == 3
    assert len(search(app, "limit test", limit=2)) == 2


def test_a_snippet_is_plain_text_with_ranges_never_markup(app):
    attack = 'look <img src=x onerror="alert(1)"> <b>bold</b> &amp; \ue000marker\ue001 done'
    chat(app, ALICE, attack)
    hit = search(app, "onerror")[0]
    assert "<img src=x onerror=" in hit["snippet"] and "<b>bold</b>" in hit["snippet"]
    # The message holds the characters PostgreSQL's headlines are asked to mark words with: there its
    # snippet comes without highlights; never with wrong ones.
    assert marked(hit["snippet"], hit["highlights"]) in (["onerror"], [])
    chat(app, ALICE, "another <script>alert('x')</script> script")
    hit = search(app, "script")[0]
    assert hit["snippet"] == "another <script>alert('x')</script> script"
    assert set(marked(hit["snippet"], hit["highlights"])) == {"script"}


def test_highlights_count_characters_not_bytes_or_utf16_units(app):
    chat(app, ALICE, "🙂🙂 a naïve café order")
    hit = search(app, "café")[0]
    assert hit["highlights"] == [[11, 15]] and marked(hit["snippet"], hit["highlights"]) == ["café"]


def test_a_deleted_conversation_is_gone_from_the_results_at_once(app):
    _, conversation = chat(app, ALICE, "ephemeral zebra notes")
    assert len(search(app, "zebra")) == 1
    assert call(app, "DELETE", f"/api/conversations/{conversation}", **ALICE).status == 204
    assert search(app, "zebra") == [] and search(app, "ephemeral") == []


def test_earlier_versions_stay_found_each_at_its_own_message(app, fake):
    fake.queue(Reply(tokens=["the first answer mentions ", "walrus"]))
    client, _ = chat(app, ALICE, "tell me about the narwhal")
    [first] = search(app, "walrus")
    fake.queue(Reply(tokens=["a second answer about ", "penguins"]))
    client.send("regenerate")
    regenerated = client.until("turn_end")[-1]
    assert regenerated["status"] == "complete"
    # A regenerate keeps the earlier reply as a version: still found, at its own message (the page shows
    # its branch), beside the new one.
    assert [hit["message_id"] for hit in search(app, "walrus")] == [first["message_id"]]
    assert [hit["message_id"] for hit in search(app, "penguins")] == [regenerated["message_id"]]
    question = next(m for m in client.hello(first["conversation_id"])["history"] if m["role"] == "user")
    client.send("edit", message_id=question["id"], content="tell me about the axolotl")
    assert client.until("turn_end")[-1]["status"] == "complete"
    [edited] = search(app, "axolotl")
    assert edited["role"] == "user" and edited["message_id"] != question["id"]
    assert len(search(app, "narwhal")) == 1  # the earlier question, and the title's first words


def test_a_reply_is_found_once_it_ends_not_while_it_streams(app, fake):
    fake.queue(Reply(tokens=["streaming ", "quokka "] + ["more "] * 80, pace=0.05))
    client = app.client(**ALICE)
    client.hello()
    client.send("message", content="start")
    client.until("chunk")
    time.sleep(2.5)  # a checkpoint of the reply so far has been written
    assert search(app, "quokka") == []
    assert client.until("turn_end")[-1]["status"] == "complete"
    assert len(search(app, "quokka")) == 1


# ---- existing databases ------------------------------------------------------------------------------


def before_search(migrations: list[str]) -> list[str]:
    """The schema's steps before the one that made the search index (later ones are applied at start)."""
    return migrations[
        : next(n for n, step in enumerate(migrations) if "messages_text" in step or "messages_words" in step)
    ]


def old_sqlite_database(path: Path) -> None:
    """A file at the schema before search, holding a conversation with a message."""
    db = sqlite3.connect(path)
    db.create_function("token_hash", 1, lambda value: value)
    for number, step in enumerate(before_search(sqlite_schema.MIGRATIONS), start=1):
        db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
    fill_old(lambda query, *args: db.execute(re.sub(r"\$\d", "?", query), args))
    db.commit()
    db.close()


def fill_old(run: Any) -> None:
    run("INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at)"
        " VALUES ('oldconversation', 'alice', 'Ancient platypus', 'm', '', 1, 1)")  # fmt: skip
    for seq, (role, content) in enumerate([("user", "an old question on marsupials"), ("assistant", "old answer")]):
        run("INSERT INTO messages (id, conversation_id, role, content, status, created_at)"
            " VALUES ($1, 'oldconversation', $2, $3, 'complete', 1)", f"old{seq}", role, content)  # fmt: skip


async def old_postgres_database(url: str) -> None:
    db = await asyncpg.connect(url)
    try:
        await db.execute(postgres_schema.SCHEMA_VERSION_TABLE)
        for number, step in enumerate(before_search(postgres_schema.MIGRATIONS), start=1):
            await db.execute(step)
            await db.execute("INSERT INTO schema_version VALUES ($1, 0)", number)
        for query, args in recorded(fill_old):
            await db.execute(query, *args)
    finally:
        await db.close()


def recorded(fill: Any) -> list[tuple[str, tuple[Any, ...]]]:
    statements: list[tuple[str, tuple[Any, ...]]] = []
    fill(lambda query, *args: statements.append((query, args)))
    return statements


def test_an_existing_database_is_indexed_when_it_upgrades(start_app, mode, tmp_path, request):
    if mode == "single":
        old_sqlite_database(tmp_path / "chat.db")
    else:
        asyncio.run(old_postgres_database(request.getfixturevalue("fresh_postgres_url")))
    app = start_app("--auth", "header")
    assert [hit["conversation_id"] for hit in search(app, "platypus")] == ["oldconversation"]
    hit = search(app, "marsupial")[0]
    assert (hit["message_id"], hit["title"]) == ("old0", "Ancient platypus")
    assert search(app, "marsupials", BOB) == []
    assert [hit["message_id"] for hit in search(app, "answer")] == ["old1"]
