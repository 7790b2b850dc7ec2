"""Both stores, on real databases (a SQLite file; a PostgreSQL database of the test's own), held to the
same behaviour by the same tests; then what only one of them can be made to do (a full disk for SQLite;
replicas migrating together, a lost connection, a database refusing writes for PostgreSQL)."""

import asyncio
import dataclasses
import logging
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from pocketchat.errors import StorageError
from pocketchat.records import ConversationRecord, Message
from pocketchat.search import parse_query
from pocketchat.settings import Settings
from pocketchat.store import SAVE_WAIT_SECONDS, Store, make_store, save_reply, sqlite_schema, writes
from pocketchat.store import postgres as pg_store
from pocketchat.store import postgres_connection as pg_connection
from pocketchat.store.postgres import PostgresStore
from pocketchat.store.postgres_schema import MIGRATIONS
from pocketchat.store.sqlite import Job, SqliteStore
from tests.services import database_name, postgres_admin

ROOT = Path(__file__).resolve().parent.parent


class Stores:
    """Makes stores of one kind on one database: every call a new one, as a restart or a replica makes."""

    def __init__(self, kind: str, make: Callable[[], Store]) -> None:
        self.kind = kind
        self._make = make

    def __call__(self) -> Store:
        return self._make()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> Stores:
    if request.param == "sqlite":
        path = tmp_path / "chat.db"
        return Stores("sqlite", lambda: SqliteStore(path))
    url = request.getfixturevalue("fresh_postgres_url")
    return Stores("postgres", lambda: PostgresStore(url))


def postgres(url: str) -> Stores:
    return Stores("postgres", lambda: PostgresStore(url))


@asynccontextmanager
async def opened(stores: Stores, sweep_streaming: bool = True) -> AsyncIterator[Store]:
    """A new store, open for the block, closed after it (closing again is harmless: a test may time it)."""
    db = stores()
    await db.open(sweep_streaming)
    try:
        yield db
    finally:
        await db.close()


# What a write that fails on its own (a message of no conversation) raises, store by store.
FOREIGN_KEY_ERROR = {"sqlite": sqlite3.IntegrityError, "postgres": asyncpg.ForeignKeyViolationError}


# ---- the same behaviour from both stores -----------------------------------------------------------


def test_queued_writes_land_in_order_and_a_failing_one_takes_no_other_down(store, caplog):
    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            writes = [db.create_conversation(record)]
            writes += [db.save_messages(record.id, [Message(role="user", content=str(i))]) for i in range(5)]
            writes.insert(3, db.save_messages("no-such-conversation", [Message(role="user", content="orphan")]))
            results = await asyncio.gather(*writes, return_exceptions=True)
            _, messages = await db.load(record.id)
            return results, messages, db.failure, db.unwritten(record.id)

    with caplog.at_level(logging.ERROR):
        results, messages, failure, unwritten = asyncio.run(scenario())
    assert [r is None for r in results] == [True] * 3 + [False] + [True] * 3
    assert type(results[3]) is FOREIGN_KEY_ERROR[store.kind]  # its own failure, not the database's
    assert [m.content for m in messages] == ["0", "1", "2", "3", "4"]
    assert "database write failed" in caplog.text
    assert (failure, unwritten) == (None, False)  # nothing waits: one job's failure is no database failure


@pytest.mark.parametrize("group", [1, writes.BATCH_SIZE], ids=["groups of one", "one long group"])
def test_a_reply_saved_behind_a_long_queue_waits_while_the_database_answers_and_not_once_it_stops(
    tmp_path, monkeypatch, group
):
    # Under a steady load the writer is seconds behind, yet every write lands, in groups of one or in
    # one group that takes 3 s (a burst's, on a busy machine): a turn's end waits for its reply's save
    # (it is told "not saved yet" only when the database stops answering).
    monkeypatch.setattr(writes, "BATCH_SIZE", group)

    async def scenario() -> tuple[float, float, list[str]]:
        async with opened(Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))) as db:
            record = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(record)
            for _ in range(30):  # 3 s of writes ahead of it, each answered in 0.1 s
                db._queue(Job(lambda _: time.sleep(0.1), None))
            started = time.monotonic()
            await save_reply(db, record.id, Message(role="assistant", content="kept"))
            waited = time.monotonic() - started
            db._queue(Job(lambda _: time.sleep(4), None))  # then one write that hangs
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await save_reply(db, record.id, Message(role="assistant", content="late"))
            gave_up = time.monotonic() - started
        async with opened(Stores("sqlite", lambda: SqliteStore(tmp_path / "chat.db"))) as db:
            _, messages = await db.load(record.id)
        return waited, gave_up, [m.content for m in messages]

    waited, gave_up, contents = asyncio.run(scenario())
    assert waited > SAVE_WAIT_SECONDS + 0.5  # the queue ahead took longer than the wait for a stall
    assert SAVE_WAIT_SECONDS <= gave_up < SAVE_WAIT_SECONDS + 1.5
    assert contents == ["kept", "late"]  # the late one landed once the database answered again


def test_a_turn_round_trips_every_field_and_keeps_the_versions_before_it(store):
    record = ConversationRecord(model="m", system_prompt="Be brief.", title="Ünïcode ✓", owner="ada")
    question = Message(role="user", content="q?", turn_id="t1")
    reply = Message(
        parent_id=question.id,
        role="assistant",
        content="**a**",
        status="error",
        turn_id="t1",
        reasoning="thought about it",
        error="provider said no",
        meta={"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 1}, "ttft_ms": 12.5, "z": None},
        created_at=1_700_000_000.123456,
    )
    retry = Message(role="assistant", content="again", turn_id="t2", status="streaming", parent_id=question.id)

    async def scenario():
        async with opened(store) as db:
            first = db.open_turn(record.id, record, [question, reply])  # not awaited: later writes follow it
            record.title = "Renamed"
            renamed = db.update_conversation(record)
            await asyncio.gather(first, renamed)
            after_first = await db.load(record.id)
            await db.choose_path(ConversationRecord(**{**record.__dict__, "leaf_id": reply.id}))
            chosen, _ = await db.load(record.id)
            await db.open_turn(record.id, None, [retry])  # a regenerate: the path shown is the latest again
            return after_first, chosen, await db.load(record.id)

    (stored, messages), chosen, (later, versions) = asyncio.run(scenario())
    # Every field, updated_at included (update_conversation set it); the opening wrote the path's first version.
    assert stored == dataclasses.replace(record, path_version=1)
    assert messages == [question, reply]  # every field: reasoning, error, meta, exact float timestamps
    assert (chosen.leaf_id, chosen.title) == (reply.id, "Renamed")
    assert later.leaf_id is None and versions == [question, reply, retry]


def test_deleting_a_conversation_deletes_its_messages(store):
    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            kept = ConversationRecord(model="m", system_prompt="")
            message = Message(role="user", content="gone with it")
            await db.open_turn(record.id, record, [message])
            await db.open_turn(kept.id, kept, [Message(role="user", content="stays")])
            deleted = await db.delete_conversation(record.id)
            again = await db.delete_conversation(record.id)
            # The message's id is free again: its row went with the conversation.
            await db.open_turn(kept.id, None, [message])
            return deleted, again, await db.load(record.id), await db.load(kept.id)

    deleted, again, loaded, (_, kept_messages) = asyncio.run(scenario())
    assert (deleted, again, loaded) == (True, False, None)
    assert [m.content for m in kept_messages] == ["stays", "gone with it"]


def test_search_finds_every_message_at_once_whether_in_the_index_yet_or_waiting_to_go_in_it(store):
    """SQLite puts new messages in its index 64 at a time (the schema's steps 12 and 14): a search finds
    those in it and those waiting, newest first, the owner's only; a reply once it is final; and a
    deleted message is gone from both at once."""

    async def scenario() -> None:
        async with opened(store) as db:
            bob = ConversationRecord(model="m", system_prompt="", owner="bob")
            first = ConversationRecord(model="m", system_prompt="", owner="alice")
            second = ConversationRecord(model="m", system_prompt="", owner="alice")
            await db.open_turn(bob.id, bob, [Message(role="user", content="wombat of bob")])
            await db.open_turn(first.id, first, [])
            await db.open_turn(second.id, second, [])
            written = []
            for conversation_id, count in ((first.id, 100), (second.id, 50)):
                for _ in range(count):
                    written.append(Message(role="user", content=f"wombat number{len(written)}"))
                    await db.save_messages(conversation_id, [written[-1]])

            async def wombats() -> list[str]:
                return [hit.content for hit in await db.search_messages("alice", ["wombat"], 500, "none")]

            assert await wombats() == [message.content for message in reversed(written)]
            if store.kind == "sqlite":  # the second conversation's newest still wait, its oldest are indexed
                after_mark = "SELECT count(*) FROM messages WHERE seq > (SELECT seq FROM messages_index_mark)"
                waiting = await db._read(lambda c: c.execute(after_mark).fetchone())
                assert waiting[0] == 151 % 64
            hits = await db.search("alice", parse_query("number3 "), 50)
            assert [hit.message_id for hit in hits] == [written[3].id]
            question, reply = (
                Message(role="user", content="wombat question"),
                Message("assistant", "", status="streaming"),
            )
            await db.open_turn(second.id, None, [question, reply])
            reply.content = "wombat answer"
            await db.save_messages(second.id, [reply])
            assert (await wombats())[:1] == ["wombat question"]  # not the reply while it streams
            reply.status = "complete"
            await db.save_messages(second.id, [reply])
            assert (await wombats())[:2] == ["wombat answer", "wombat question"]
            await db.delete_conversation(second.id)
            assert await wombats() == [message.content for message in reversed(written[:100])]
            assert await db.search_messages("bob", ["wombat"], 10, "none") != []

    asyncio.run(scenario())


def sqlite_before(path: Path, marker: str) -> sqlite3.Connection:
    """A SQLite file at the schema before the first step that says `marker`, open (autocommit)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.create_function("token_hash", 1, lambda value: value)
    before = next(n for n, step in enumerate(sqlite_schema.MIGRATIONS) if marker in step)
    for number, step in enumerate(sqlite_schema.MIGRATIONS[:before], start=1):
        db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
    return db


def indexed_and_should_be(path: Path, owner: str) -> tuple[list[int], list[int]]:
    """The owner's messages in a SQLite file's index, and those that should be: every finished message at
    or before the index's mark but those listed to go in it again (each once)."""
    with sqlite3.connect(path) as file:
        owned = f'owner : "{owner.encode().hex()}"'
        indexed = file.execute("SELECT rowid FROM messages_text WHERE messages_text MATCH ?", (owned,)).fetchall()
        should = file.execute(
            "SELECT seq FROM messages m JOIN conversations c ON c.id = m.conversation_id"
            " WHERE c.owner = ? AND status != 'streaming' AND seq <= (SELECT seq FROM messages_index_mark)"
            " AND seq NOT IN (SELECT seq FROM messages_unindexed) ORDER BY seq",
            (owner,),
        ).fetchall()
    return sorted(seq for (seq,) in indexed), [seq for (seq,) in should]


def test_a_reply_that_streams_while_its_index_moves_on_is_found_as_it_ends_and_as_it_is_changed(store):
    """A reply begun before 64 other messages went in the index (SQLite: before its mark) is listed when it
    ends; a finished message changed is found by its new words only (SQLite); one deleted is found no
    more; and the index holds what it should."""

    async def scenario() -> None:
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="", owner="alice")
            question, reply = Message("user", "koala question"), Message("assistant", "", status="streaming")
            await db.open_turn(record.id, record, [question, reply])
            for number in range(130):  # two of SQLite's batches go in the index meanwhile
                await db.save_messages(record.id, [Message("user", f"filler {number}")])

            async def koalas() -> list[str]:
                return [hit.content for hit in await db.search_messages("alice", ["koala"], 10, "none")]

            reply.content = "koala answer"
            await db.save_messages(record.id, [reply])
            assert await koalas() == ["koala question"]  # not while it streams
            reply.status = "complete"
            await db.save_messages(record.id, [reply])
            assert await koalas() == ["koala answer", "koala question"]
            for number in range(70):  # and the listed reply goes in the index with the next batch
                await db.save_messages(record.id, [Message("user", f"more filler {number}")])
            assert await koalas() == ["koala answer", "koala question"]
            if store.kind == "sqlite":
                # A finished message, in the index, changed (no store call does that now; the schema allows it).
                with sqlite3.connect(db.path) as file:
                    file.execute("UPDATE messages SET content = 'wallaby question' WHERE id = ?", (question.id,))
                assert await koalas() == ["koala answer"]
                wallabies = await db.search_messages("alice", ["wallaby"], 10, "none")
                assert [hit.content for hit in wallabies] == ["wallaby question"]
                indexed, should = indexed_and_should_be(db.path, "alice")
                assert indexed == should and len(should) > 64
            await db.delete_conversation(record.id)
            assert await koalas() == []

    asyncio.run(scenario())


def test_sqlite_puts_messages_in_its_index_64_at_a_time_however_many_checkpoints_use_seqs_up(tmp_path):
    """Every upsert that updates (a reply's checkpoint) uses a seq up: the index is written once 64 messages
    wait, not once the seqs have moved 64 on (a segment of FTS5 every turn or two, for long replies)."""
    path = tmp_path / "chat.db"

    async def scenario() -> list[int]:
        marks = []
        async with opened(Stores("sqlite", lambda: SqliteStore(path))) as store:
            record = ConversationRecord(model="m", system_prompt="", owner="alice")
            await store.open_turn(record.id, record, [])
            for turn in range(40):
                question, reply = Message("user", f"question {turn}"), Message("assistant", "", status="streaming")
                await store.open_turn(record.id, None, [question, reply])
                for words in range(10):
                    reply.content += f" word{words}"
                    await store.save_messages(record.id, [reply])
                reply.status = "complete"
                await store.save_messages(record.id, [reply])
                with sqlite3.connect(path) as file:
                    marks.append(file.execute("SELECT seq FROM messages_index_mark").fetchone()[0])
        return marks

    marks = asyncio.run(scenario())
    assert len(set(marks)) == 2  # 80 messages: the index written once, as the 64th came (turn 32)
    assert marks.index(max(marks)) == 31


def test_a_file_whose_index_lists_its_waiting_messages_upgrades_with_every_message_found(tmp_path):
    """A SQLite file from before the index's mark (step 12: each final message listed, 64 at a time into
    the index), with messages in the index, some listed and a reply streaming, upgrades: every message is
    found, the reply once it ends, and what is written next goes in the index as it should."""
    path = tmp_path / "chat.db"
    db = sqlite_before(path, "messages_index_mark")
    db.execute("INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at)"
               " VALUES ('old', 'alice', 'Old', 'm', '', 1, 1)")  # fmt: skip
    insert = (
        "INSERT INTO messages (id, conversation_id, role, content, status, created_at) VALUES (?, 'old', ?, ?, ?, 1)"
    )
    db.executemany(insert, [(f"m{n}", "user", f"echidna {n}", "complete") for n in range(70)])
    db.execute(insert, ("streaming", "assistant", "echidna reply so far", "streaming"))
    assert db.execute("SELECT count(*) FROM messages_unindexed").fetchone() == (70 - 64,)
    db.close()

    async def scenario() -> None:
        async with opened(Stores("sqlite", lambda: SqliteStore(path)), sweep_streaming=False) as store:

            async def echidnas() -> list[str]:
                return [hit.content for hit in await store.search_messages("alice", ["echidna"], 500, "none")]

            assert sorted(await echidnas()) == sorted(f"echidna {n}" for n in range(70))
            loaded = await store.load("old")
            assert loaded is not None
            reply = next(message for message in loaded[1] if message.id == "streaming")
            for number in range(70):  # the index moves past the reply, which then ends
                await store.save_messages("old", [Message("user", f"numbat {number}")])
            reply.content, reply.status = "echidna reply", "complete"
            await store.save_messages("old", [reply])
            assert len(await echidnas()) == 71 and (await echidnas())[0] == "echidna reply"
            indexed, should = indexed_and_should_be(path, "alice")
            assert indexed == should and len(should) > 64

    asyncio.run(scenario())


def test_a_conversation_two_replicas_both_store_is_stored_once(store):
    async def scenario():
        async with opened(store) as one, opened(store, sweep_streaming=False) as two:
            record = ConversationRecord(model="m", system_prompt="", title="first")
            again = ConversationRecord(**{**record.__dict__, "title": "second"})
            await asyncio.gather(
                one.open_turn(record.id, record, [Message(role="user", content="from one")]),
                two.open_turn(record.id, again, [Message(role="user", content="from two")]),
            )
            await one.create_conversation(record)  # no error either
            stored, messages = await one.load(record.id)
            return stored.title, sorted(m.content for m in messages), len(await one.list_conversations("local"))

    title, contents, listed = asyncio.run(scenario())
    assert title in ("first", "second") and listed == 1
    assert contents == ["from one", "from two"]


def test_a_reply_whose_replica_died_is_stored_interrupted_unless_stored_since(store):
    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            cut = Message(role="assistant", content="", status="streaming")
            done = Message(role="assistant", content="all of it", status="complete")
            await db.open_turn(record.id, record, [cut, done])
            # What another replica's log held when its replica died.
            await db.save_interrupted(record.id, Message(**{**cut.__dict__, "content": "half", "reasoning": "r"}))
            await db.save_interrupted(record.id, Message(**{**done.__dict__, "content": "stale"}))
            _, messages = await db.load(record.id)
            return [(m.content, m.reasoning, m.status) for m in messages]

    assert asyncio.run(scenario()) == [("half", "r", "interrupted"), ("all of it", "", "complete")]


def test_a_reply_taken_over_is_stored_whole_where_its_opening_was_lost_and_keeps_its_row_where_not(store):
    # The replica that ends a dead replica's turn passes what it followed of the turn's opening.
    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            question = Message(role="user", content="q1")
            answer = Message(role="assistant", content="a1", parent_id=question.id)
            await db.open_turn(record.id, record, [question, answer])
            # A turn whose opening landed, its reply checkpointed with a tool step, then a switch back.
            asked = Message(role="user", content="q2", parent_id=answer.id)
            cut = Message(role="assistant", content="", status="streaming", parent_id=asked.id)
            cut.meta = {"model": "m", "steps": [{"node": "RunTools", "kind": "tool_call", "data": {}}]}
            await db.open_turn(record.id, None, [asked, cut])
            await db.choose_path(ConversationRecord(**{**record.__dict__, "leaf_id": answer.id}))
            taken = Message(**{**cut.__dict__, "content": "so far", "status": "interrupted", "meta": {"model": "m"}})
            await db.save_interrupted(record.id, taken, (record, asked))
            kept = await db.load(record.id)
            # A turn whose opening never landed: written whole, and the path shows it (the copy that
            # followed it knows the stored path version; a copy that does not, moves no path).
            lost_q = Message(role="user", content="q3", parent_id=answer.id)
            lost = Message(role="assistant", content="half", status="interrupted", parent_id=lost_q.id)
            told: list[bool | None] = []
            await db.save_interrupted(record.id, lost, (kept[0], lost_q), told.append)
            stale_q = Message(role="user", content="q4", parent_id=answer.id)
            stale = Message(role="assistant", content="cut", status="interrupted", parent_id=stale_q.id)
            await db.save_interrupted(record.id, stale, (kept[0], stale_q), told.append)
            whole = await db.load(record.id)
            await asyncio.sleep(0)  # what the writes gave is told once they landed
        return kept, whole, told

    (chosen, kept), (after, whole), told = asyncio.run(scenario())
    reply = next(m for m in kept if m.content == "so far")
    assert reply.status == "interrupted" and reply.meta["steps"][0]["node"] == "RunTools"  # its steps kept
    assert chosen.leaf_id == kept[1].id  # the version chosen since stays chosen
    assert [(m.content, m.status) for m in whole if m.content in ("q3", "half")] == [
        ("q3", "complete"),
        ("half", "interrupted"),
    ]
    assert after.leaf_id is None and told == [True, False]  # the latest: the turn lost with its replica
    assert [m.content for m in whole if m.content in ("q4", "cut")] == ["q4", "cut"]  # stored all the same


def test_a_path_is_written_only_over_the_version_it_replaces(store):
    # What replicas write (pocketchat/paths.py): a switch, a turn's opening, each over the version its
    # copy knows; one that lands over another (late, or chosen on a stale copy) is refused.
    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            question = Message(role="user", content="q")
            first = Message(role="assistant", content="first", parent_id=question.id)
            told: list[bool] = []
            await db.open_turn(record.id, record, [question, first], 0, told.append)
            second = Message(role="assistant", content="second", parent_id=question.id)
            await db.open_turn(record.id, None, [second], 1, told.append)  # a regenerate
            switched = ConversationRecord(**{**record.__dict__, "leaf_id": first.id})
            await db.choose_path(switched, 1, told.append)  # chosen before the regenerate was read: refused
            refused = await db.load(record.id)
            await db.choose_path(switched, 2, told.append)
            third = Message(role="assistant", content="third", parent_id=question.id)
            await db.open_turn(record.id, None, [third], 2, told.append)  # written late: refused
            stored = await db.load(record.id)
            await asyncio.sleep(0)
        return told, refused, stored

    told, (refused, _), (stored, messages) = asyncio.run(scenario())
    assert told == [True, True, False, True, False]
    assert (refused.leaf_id, refused.path_version) == (None, 2)
    assert (stored.leaf_id, stored.path_version) == (messages[1].id, 3) and messages[-1].content == "third"


def test_conversations_are_listed_by_owner_newest_first(store):
    async def scenario():
        async with opened(store) as db:
            old = ConversationRecord(model="m", system_prompt="", owner="ada", title="old")
            new = ConversationRecord(model="m", system_prompt="", owner="ada", title="new")
            other = ConversationRecord(model="m", system_prompt="", owner="bob", title="bob's")
            for record in (old, new, other):
                await db.create_conversation(record)
            await db.save_messages(new.id, [Message(role="user", content="touches it")])
            await asyncio.sleep(0.01)
            await db.save_messages(old.id, [Message(role="user", content="touched last")])  # now the newest
            return [[r.title for r in await db.list_conversations(who)] for who in ("ada", "bob", "nobody")]

    assert asyncio.run(scenario()) == [["old", "new"], ["bob's"], []]


def test_loading_an_unknown_conversation_gives_none(store):
    async def scenario():
        async with opened(store) as db:
            return await db.load("no-such-id")

    assert asyncio.run(scenario()) is None


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "replica"])
def test_a_reply_left_streaming_is_marked_interrupted_on_the_next_open_only_with_the_sweep(store, sweep):
    async def scenario():
        record = ConversationRecord(model="m", system_prompt="")
        reply = Message(role="assistant", content="half a repl", status="streaming")
        async with opened(store) as db:
            await db.open_turn(record.id, record, [Message(role="user", content="q"), reply])
        again = store()
        interrupted = await again.open(sweep)
        try:
            _, messages = await again.load(record.id)
        finally:
            await again.close()
        return interrupted, [(m.status, m.content) for m in messages]

    interrupted, messages = asyncio.run(scenario())
    if sweep:
        assert (interrupted, messages) == (1, [("complete", "q"), ("interrupted", "half a repl")])
    else:  # another replica may be streaming it right now
        assert (interrupted, messages) == (0, [("complete", "q"), ("streaming", "half a repl")])


def test_a_secret_is_made_once_even_when_two_stores_ask_at_once(store):
    async def scenario():
        async with opened(store) as one, opened(store, sweep_streaming=False) as two:
            first = await asyncio.gather(one.secret("key", lambda: "from one"), two.secret("key", lambda: "from two"))
            later = await two.secret("key", lambda: "made again")
            other = await one.secret("other", lambda: "another secret")
            return first, later, other

    (a, b), later, other = asyncio.run(scenario())
    assert a == b == later and a in ("from one", "from two")
    assert other == "another secret"


def test_sessions_live_until_they_expire_or_are_revoked(store):
    async def scenario():
        async with opened(store) as db:
            await db.create_session("ada-1", "ada", 3600)
            await db.create_session("ada-2", "ada", 3600)
            await db.create_session("bob-1", "bob", 3600)
            await db.create_session("old-1", "old", -1)  # expired as soon as made
            users = [await db.session_user(s) for s in ("ada-1", "bob-1", "old-1", "unknown")]
            revoked_one = await db.revoke_sessions("ada-1")
            revoked_again = await db.revoke_sessions("ada-1")
            dead = await db.dead_sessions(["ada-1", "ada-2", "bob-1", "old-1", "unknown"])
            revoked_all = await db.revoke_sessions()
            left = [await db.session_user(s) for s in ("ada-2", "bob-1")]
            return users, revoked_one, revoked_again, dead, revoked_all, left, await db.dead_sessions([])

    users, revoked_one, revoked_again, dead, revoked_all, left, none = asyncio.run(scenario())
    assert users == ["ada", "bob", None, None]
    assert (revoked_one, revoked_again) == (1, 0)
    assert dead == {"ada-1", "old-1", "unknown"}
    assert revoked_all == 3  # ada-2, bob-1 and the expired old-1: every one not revoked before
    assert left == [None, None]
    assert none == set()


def test_an_upgraded_files_message_index_is_one_segment_that_the_next_writes_leave_alone(tmp_path):
    """'rebuild' leaves an index of megabytes in several segments low in FTS5's merge tree, which the merges
    of the writes after it would copy whole again and again (the writes of a turn twice as slow at a million
    messages: bench/search.py); the upgrade merges them into one, on the top level."""
    db = sqlite_before(tmp_path / "chat.db", "'optimize'")
    db.execute("BEGIN")
    db.execute("INSERT INTO conversations (id, owner, title, model, system_prompt, created_at, updated_at)"
               " VALUES ('c', 'alice', 'a title', 'm', '', 1, 1)")  # fmt: skip
    words = [f"w{n:x}" for n in range(200_000)]  # some megabytes of index: FTS5 writes a segment a megabyte
    messages = [(f"m{n}", " ".join(words[n * 100 : (n + 1) * 100])) for n in range(2000)]
    db.executemany("INSERT INTO messages (id, conversation_id, role, content, status, created_at)"
                   " VALUES (?, 'c', 'user', ?, 'complete', 1)", messages)  # fmt: skip
    db.execute("COMMIT")
    sqlite_schema.migrate(db)
    assert db.execute("SELECT count(DISTINCT segid) FROM messages_text_idx").fetchone()[0] == 1
    assert db.execute("SELECT rowid FROM messages_text WHERE messages_text MATCH 'w1f40'").fetchall() == [(81,)]
    db.close()


def test_make_store_picks_postgresql_for_a_database_url_and_sqlite_never_imports_asyncpg(tmp_path):
    url = "postgresql://app:secret@db.example:5432/chat"
    assert isinstance(make_store(Settings(database_url=url)), PostgresStore)
    assert isinstance(make_store(Settings(db_path=tmp_path / "c.db")), SqliteStore)
    check = (
        "import sys; from pocketchat.settings import Settings; from pocketchat.store import make_store; "
        "make_store(Settings()); print('asyncpg' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ---- SQLite only: a full disk ----------------------------------------------------------------------


def fill_the_disk(store: SqliteStore) -> None:
    """The database may not grow by a single page: the next write that needs one fails as on a full disk."""
    store._jobs.put_nowait(Job(lambda db: db.execute("PRAGMA max_page_count = 1"), None, retry=False))


def free_the_disk(store: SqliteStore) -> None:
    # On the writer's connection at once, not queued behind the writes waiting for room.
    store._database.connection.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_disk_fails_only_its_own_writes_and_they_are_written_once_it_recovers(tmp_path):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(record)
        fill_the_disk(store)
        big = Message(role="assistant", content="a reply that needs room " * 2000)
        with pytest.raises(StorageError, match="full"):
            await store.save_messages(record.id, [big])
        failing_while_full = store.failure
        kept_while_full = store.unwritten(record.id)
        # The writer is alive: later writes are answered (and fail too while the disk is full).
        with pytest.raises(StorageError):
            await store.save_messages(record.id, [Message(role="user", content="more " * 2000)])
        free_the_disk(store)
        await store.save_messages(record.id, [Message(role="user", content="after")])
        _, messages = await store.load(record.id)
        recovered = (store.failure, store.unwritten(record.id))
        await store.close()  # shutdown completes
        return failing_while_full, kept_while_full, recovered, [m.content[:5] for m in messages]

    failing, kept, recovered, stored = asyncio.run(scenario())
    assert "full" in failing and kept
    assert recovered == (None, False)
    assert stored == ["a rep", "more ", "after"]  # the refused writes landed first, in order


def test_writes_still_refused_at_shutdown_are_reported_and_shutdown_completes(tmp_path, caplog):
    async def scenario():
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        record = ConversationRecord(model="m", system_prompt="")
        await store.create_conversation(record)
        fill_the_disk(store)
        with pytest.raises(StorageError):
            await store.save_messages(record.id, [Message(role="user", content="x" * 100_000)])
        await store.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert "1 writes could not be saved before shutdown" in caplog.text


# ---- PostgreSQL only: replicas, a lost connection, a database that refuses writes ----------------------


def with_password(url: str, password: str) -> str:
    """`url` carrying a password (trust authentication ignores it; the store must never show it)."""
    parts = urlsplit(url)
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port or 5432}"))


async def refuse_writes(url: str, how: str, refuse: bool) -> None:
    """Make the database refuse the store's writes, as it may for a while, or take them again: by refusing
    connections (a server going down: the writer's connection is ended and cannot be made again), or by
    turning read-only (a failover to a standby: every write statement fails on a live connection)."""
    name = database_name(url)
    change = {
        ("connections", True): f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false',
        ("connections", False): f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true',
        ("read-only", True): f'ALTER DATABASE "{name}" SET default_transaction_read_only = on',
        ("read-only", False): f'ALTER DATABASE "{name}" RESET default_transaction_read_only',
    }[how, refuse]
    admin = await postgres_admin()
    try:
        await admin.execute(change)
        if refuse:  # connections made before the change are ended: the writer has to make a new one
            ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1"
            await admin.execute(ended, name)
    finally:
        await admin.close()


async def end_the_writers_connection(url: str) -> None:
    admin = await postgres_admin()
    try:
        ended = (
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND application_name = 'pocketchat-writer'"
        )
        await admin.execute(ended, database_name(url))
    finally:
        await admin.close()


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_replicas_opening_a_fresh_database_together_apply_the_schema_once(fresh_postgres_url, caplog):
    async def scenario():
        replicas = [PostgresStore(fresh_postgres_url) for _ in range(6)]
        opened = await asyncio.gather(*(replica.open(sweep_streaming=False) for replica in replicas))
        admin = await asyncpg.connect(fresh_postgres_url)
        try:
            versions = [row["version"] for row in await admin.fetch("SELECT version FROM schema_version ORDER BY 1")]
        finally:
            await admin.close()
        for replica in replicas:
            await replica.close()
        return opened, versions

    with caplog.at_level(logging.INFO, logger="pocketchat.store.postgres_schema"):
        opened, versions = asyncio.run(scenario())
    assert opened == [0] * 6
    assert versions == list(range(1, len(MIGRATIONS) + 1))
    assert caplog.text.count("database schema upgraded to version 1\n") == 1


def test_a_lost_writer_connection_is_replaced_without_a_failed_write(fresh_postgres_url):
    async def scenario():
        async with opened(postgres(fresh_postgres_url)) as db:
            record = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(record)
            await end_the_writers_connection(fresh_postgres_url)  # a server restart, an idle timeout
            await asyncio.sleep(0.3)  # the client hears of it
            await db.save_messages(record.id, [Message(role="user", content="after")])
            _, messages = await db.load(record.id)
            return db.failure, [m.content for m in messages]

    assert asyncio.run(scenario()) == (None, ["after"])


@pytest.mark.parametrize("how", ["connections", "read-only"])
def test_writes_the_database_refuses_fail_are_kept_and_land_in_order_once_it_recovers(fresh_postgres_url, how, caplog):
    password = urlsplit(fresh_postgres_url).password or "not-to-be-logged-3f9a"
    url = with_password(fresh_postgres_url, password)

    async def scenario():
        async with opened(postgres(url)) as db:
            record = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(record)
            await refuse_writes(url, how, True)
            await asyncio.sleep(0.1)  # the client hears of its ended connections
            with pytest.raises(StorageError) as refused:
                await db.save_messages(record.id, [Message(role="user", content="one")])
            failing = (db.failure, db.unwritten(record.id))
            db.checkpoint(record.id, Message(role="assistant", content="two"))  # queued behind, fails as well
            with pytest.raises(StorageError):
                await db.delete_conversation(record.id)  # never written again: the caller said it failed
            await refuse_writes(url, how, False)
            await until(lambda: not db.unwritten(record.id))  # the writer retries by itself every 2 s
            _, messages = await db.load(record.id)
            return str(refused.value), failing, db.failure, [m.content for m in messages]

    with caplog.at_level(logging.INFO):
        refused, (failure, kept), recovered, stored = asyncio.run(scenario())
    assert refused.startswith("The database could not save this") and kept
    # PostgreSQL's own words: at connect, or (read-only) from a write statement on a live connection.
    assert {"connections": "not currently accepting connections", "read-only": "read-only transaction"}[how] in failure
    assert recovered is None
    assert stored == ["one", "two"]  # in the order queued; the refused delete did not happen later
    assert "database writes failed" in caplog.text
    assert password not in caplog.text + refused + failure


FULL_DISK_TRIGGER = """
CREATE FUNCTION refuse_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.content LIKE 'FULL%' THEN
        RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_full BEFORE INSERT OR UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION refuse_full();
"""


def test_a_write_the_database_refuses_holds_up_only_its_own_conversation(fresh_postgres_url):
    """As a write too big for the space left: the server refuses that one write (disk_full, SQLSTATE
    53100, raised by a trigger for text that starts with FULL) and takes the others."""

    async def scenario():
        written: list[str] = []
        async with opened(postgres(fresh_postgres_url)) as db:
            db.on_written = written.append
            a = ConversationRecord(model="m", system_prompt="")
            b = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(a)
            await db.create_conversation(b)
            owner = await asyncpg.connect(fresh_postgres_url)
            await owner.execute(FULL_DISK_TRIGGER)
            reply = Message(role="assistant", content="FULL half a rep", status="streaming")
            db.checkpoint(a.id, reply)  # the turn's last checkpoint (its row is copied now)
            reply.content, reply.status = "FULL half a reply, and the rest", "complete"
            with pytest.raises(StorageError, match="No space left"):
                await db.save_messages(a.id, [reply])  # held behind the refused checkpoint, in order
            refused = db.failure
            with pytest.raises(StorageError):
                await db.save_messages(a.id, [Message(role="user", content="small, but after them")])
            await db.save_messages(b.id, [Message(role="user", content="small")])  # b is not held up
            while_full = (refused, db.unwritten(a.id), db.unwritten(b.id), written[:])
            await owner.execute("DROP TRIGGER refuse_full ON messages")
            await owner.close()
            await until(lambda: not db.unwritten(a.id))
            await asyncio.sleep(0)  # on_written is called soon after, on the event loop
            loaded = [[(m.content, m.status) for m in (await db.load(c.id))[1]] for c in (a, b)]
            return while_full, written, db.failure, loaded

    while_full, written, failure, (a_messages, b_messages) = asyncio.run(scenario())
    assert while_full == ("could not extend file: No space left on device", True, False, [])
    assert len(written) == 1 and failure is None
    # The kept checkpoint landed before the final save, never after it.
    assert a_messages == [("FULL half a reply, and the rest", "complete"), ("small, but after them", "complete")]
    assert b_messages == [("small", "complete")]


def test_shutdown_completes_while_the_database_refuses_and_reports_what_is_lost(fresh_postgres_url, caplog):
    async def scenario():
        async with opened(postgres(fresh_postgres_url)) as db:
            record = ConversationRecord(model="m", system_prompt="")
            await db.create_conversation(record)
            await refuse_writes(fresh_postgres_url, "connections", True)
            with pytest.raises(StorageError):
                await db.save_messages(record.id, [Message(role="user", content="lost")])
            db.checkpoint(record.id, Message(role="assistant", content="lost too"))
            started = time.monotonic()
            await db.close()
            return time.monotonic() - started

    with caplog.at_level(logging.ERROR):
        took = asyncio.run(scenario())
    assert took < 10
    assert "2 writes could not be saved before shutdown" in caplog.text


class FreezingRelay:
    """A TCP relay to the PostgreSQL server that can stop passing bytes on, both ways, without closing
    anything: a server that hangs, or a network that drops every packet. Nothing is refused: every wait
    on it lasts until the client's own timeout."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.upstream = (parts.hostname, parts.port or 5432)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, url: str) -> str:
        """Listen; the URL that reaches the server through the relay."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"))

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        self._writers += [writer, upstream_writer]
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self.flowing.wait()
            writer.write(data)

    def close(self) -> None:
        self._server.close()
        for writer in self._writers:
            writer.close()


def test_shutdown_is_bounded_when_the_server_stops_answering(fresh_postgres_url, monkeypatch, caplog):
    # Short timeouts, so that the test lasts seconds; the app's own are longer, and the bound with them.
    for module in (pg_connection, pg_store):  # the writer's connection, and the readers' pool
        monkeypatch.setattr(module, "CONNECT_TIMEOUT", 0.5)
        monkeypatch.setattr(module, "COMMAND_TIMEOUT", 0.5)
    monkeypatch.setattr(pg_store, "CLOSE_TIMEOUT", 3.0)

    async def scenario():
        relay = FreezingRelay(fresh_postgres_url)
        try:
            async with opened(postgres(await relay.start(fresh_postgres_url))) as db:
                record = ConversationRecord(model="m", system_prompt="")
                await db.create_conversation(record)
                relay.flowing.clear()
                started = time.monotonic()
                with pytest.raises(StorageError):
                    await db.save_messages(record.id, [Message(role="user", content="never answered")])
                refused_after = time.monotonic() - started
                db.checkpoint(record.id, Message(role="assistant", content="never sent"))
                started = time.monotonic()
                await db.close()
                return db.failure, refused_after, time.monotonic() - started
        finally:
            relay.close()

    with caplog.at_level(logging.ERROR):
        failure, refused_after, closed_after = asyncio.run(scenario())
    assert failure == "TimeoutError"
    assert refused_after < 2 and closed_after < 3
    assert "2 writes could not be saved before shutdown" in caplog.text


def test_a_final_reply_is_never_written_over_only_a_streaming_one_is(store):
    """A producer paused past its lease wakes up and writes its reply (a checkpoint, its final save) after
    the replica that took the turn over stored it interrupted: the stored reply stays as it is."""

    async def scenario():
        async with opened(store) as db:
            record = ConversationRecord(model="m", system_prompt="")
            reply = Message(role="assistant", content="", status="streaming")
            await db.open_turn(record.id, record, [reply])
            db.checkpoint(record.id, Message(**{**reply.__dict__, "content": "so far"}))
            await db.save_interrupted(record.id, Message(**{**reply.__dict__, "content": "so far, and a bit"}))
            db.checkpoint(record.id, Message(**{**reply.__dict__, "content": "so far, and a bit more"}))
            woken = Message(**{**reply.__dict__, "content": "so far, and a lot more", "status": "error"})
            await db.save_messages(record.id, [woken])
            _, messages = await db.load(record.id)
            return [(m.content, m.status) for m in messages]

    assert asyncio.run(scenario()) == [("so far, and a bit", "interrupted")]


def test_a_change_writes_only_its_fields_and_a_turn_names_only_an_untitled_conversation(store):
    """Two replicas each hold a copy of the record, each a little out of date: a rename on one and a
    model change on the other both land, and a turn's naming does not undo the rename."""

    async def scenario():
        async with opened(store) as one, opened(store, sweep_streaming=False) as two:
            record = ConversationRecord(model="m", system_prompt="p")
            await one.create_conversation(record)
            here, there = ConversationRecord(**record.__dict__), ConversationRecord(**record.__dict__)
            here.title = "Renamed here"
            await one.update_conversation(here, ["title"])
            there.model = "m2"
            await two.update_conversation(there, {"model": "m2"})
            there.title = "the first message"  # a turn there names it, not knowing of the rename
            await two.name_conversation(there)
            stored, _ = await one.load(record.id)
            return stored.title, stored.model, stored.system_prompt

    assert asyncio.run(scenario()) == ("Renamed here", "m2", "p")


def test_the_models_title_replaces_the_first_messages_and_nothing_else(store):
    """NameConversation's write says what it replaces: a rename on another replica meanwhile wins."""

    async def scenario():
        async with opened(store) as one, opened(store, sweep_streaming=False) as two:
            named, renamed = (
                ConversationRecord(model="m", system_prompt=""),
                ConversationRecord(model="m", system_prompt=""),
            )
            titles = []
            for record in (named, renamed):
                await one.create_conversation(record)
                record.title = "Plan a trip to Rome"
                await one.name_conversation(record)
            there = ConversationRecord(**renamed.__dict__)
            there.title = "My own name for it"
            await two.update_conversation(there, ["title"])  # a rename, on another replica
            for record in (named, renamed):
                record.title = "Rome trip plan"
                await one.name_conversation(record, replacing="Plan a trip to Rome")
                titles.append((await one.load(record.id))[0].title)
            return titles

    assert asyncio.run(scenario()) == ["Rome trip plan", "My own name for it"]


def test_a_deleted_conversation_is_never_stored_again(store):
    """A replica's first turn of a conversation may reach the database after another replica deleted
    it: it stores nothing (the conversation's later writes fail alone)."""

    async def scenario():
        async with opened(store) as db, opened(store, sweep_streaming=False) as other:
            record = ConversationRecord(model="m", system_prompt="")
            await other.delete_conversation(record.id)  # nothing stored yet: deleted all the same
            late = db.open_turn(record.id, record, [Message(role="user", content="late")])
            await asyncio.gather(late, db.create_conversation(record), return_exceptions=True)
            return await db.load(record.id), await db.list_conversations("local")

    assert asyncio.run(scenario()) == (None, [])
