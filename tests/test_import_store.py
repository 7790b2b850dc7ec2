"""An import against both stores on real databases: trees written whole and read back; an import whose
write fails part-way leaves nothing of itself, and a process stopping mid-import does the same."""

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from pocketchat.cluster.local import LocalCoordinator
from pocketchat.conversations import Hub
from pocketchat.errors import ImportUnderWay, UnknownConversation
from pocketchat.jobs import Jobs
from pocketchat.search import parse_query
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.transfer import imports as imports_module
from pocketchat.transfer.imports import ImportRunning, Imports
from pocketchat.transfer.native import to_file
from pocketchat.transfer.read import read_trees
from pocketchat.transfer.tree import ConversationTree, TreeMessage
from tests.test_store import opened
from tests.test_store import store as store  # the fixture: both stores

CHATGPT = Path(__file__).parent / "files" / "chatgpt_conversations.json"
SETTINGS = Settings(_cli_parse_args=[])  # type: ignore[call-arg]


def many(count: int) -> bytes:
    lisbon = json.loads(CHATGPT.read_text())[0]
    return json.dumps([lisbon | {"title": f"Trip {number}"} for number in range(count)]).encode()


async def run_import(db: Store, data: bytes, tmp_path: Path) -> Any:
    upload = tmp_path / "upload.json"
    upload.write_bytes(data)
    jobs = Jobs.from_settings(SETTINGS)
    imports = Imports(SETTINGS, db, lambda: "default-model", LocalCoordinator(SETTINGS), jobs)
    try:
        with upload.open("rb") as file:
            job = await imports.start("alice", file)
    finally:
        await jobs.aclose()
    while job.status == "importing":
        await asyncio.sleep(0.01)
    return job


async def under_way(imports: Imports, data: bytes, tmp_path: Path, written: int) -> Any:
    """Alice's import of `data`, once it has written `written` conversations."""
    upload = tmp_path / "upload.json"
    upload.write_bytes(data)
    with upload.open("rb") as file:
        job = await imports.start("alice", file)
    while job.imported < written:
        await asyncio.sleep(0.001)
    return job


def test_trees_are_written_whole_under_their_owner_and_read_back(store):
    trees = [tree.with_new_ids() for tree in read_trees(io.BytesIO(CHATGPT.read_bytes()))]
    for tree in trees:
        tree.model, tree.system_prompt = "m", ""

    async def scenario() -> Any:
        async with opened(store) as db:
            await db.claim_import("import-1", "alice", "replica-1")
            await db.import_conversations("alice", trees, "import-1")
            back = [await db.conversation_tree(tree.id, "alice") for tree in trees]
            return back, await db.conversation_tree(trees[0].id, "bob"), await db.list_conversations("bob")

    back, bobs, bobs_list = asyncio.run(scenario())
    assert [to_file(tree) for tree in back] == [to_file(tree) for tree in trees]
    assert bobs is None and bobs_list == []


def test_an_import_whose_write_fails_part_way_keeps_nothing(store, tmp_path, monkeypatch):
    monkeypatch.setattr(imports_module, "BATCH_CONVERSATIONS", 10)

    async def scenario() -> Any:
        async with opened(store) as db:
            write = db.import_conversations
            batches = 0

            def failing(owner: str, trees: list[Any], *unfinished: str) -> Any:
                nonlocal batches
                batches += 1
                if batches == 3:
                    trees[-1].messages.append(trees[-1].messages[0])  # a duplicate id: the database refuses
                return write(owner, trees, *unfinished)

            db.import_conversations = failing  # type: ignore[method-assign]
            job = await run_import(db, many(40), tmp_path)
            return job, batches, await db.list_conversations("alice")

    job, batches, left = asyncio.run(scenario())
    assert job.status == "failed" and "nothing of it was kept" in (job.error or "")
    assert batches == 3 and job.imported == 0
    assert left == []


def test_a_process_that_stops_mid_import_keeps_nothing_of_it(store, tmp_path, monkeypatch):
    monkeypatch.setattr(imports_module, "BATCH_CONVERSATIONS", 5)

    async def scenario() -> Any:
        async with opened(store) as db:
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), Jobs.from_settings(SETTINGS))
            job = await under_way(imports, many(200), tmp_path, 10)
            await imports.aclose()
            return job, await db.list_conversations("alice")

    job, left = asyncio.run(scenario())
    assert job.status == "failed" and left == []


def titled(title: str) -> list[Any]:
    """Two conversations of the test file under new ids, titled `title`."""
    made = [tree.with_new_ids() for tree in read_trees(io.BytesIO(many(2)))]
    for tree in made:
        tree.model, tree.system_prompt, tree.title = "m", "", title
    return made


def test_what_a_dead_process_left_of_its_import_is_deleted_and_nothing_else(store):
    """A process killed mid-import (no undo ran) left its import running and its conversations listed: the
    next process deletes them at start, and keeps a finished import's and one of its own under way."""

    async def scenario() -> Any:
        async with opened(store) as db:
            here = LocalCoordinator(SETTINGS)
            imports = Imports(SETTINGS, db, lambda: "m", here, Jobs.from_settings(SETTINGS))
            for import_id, replica in (("killed", "a-dead-process"), ("finished", "a-dead-process")):
                await db.claim_import(import_id, import_id, replica)
                await db.import_conversations("alice", titled(import_id), import_id)
            await db.finish_import("finished")
            await db.claim_import("under way here", "under way here", here.replica)
            await db.import_conversations("alice", titled("under way here"), "under way here")
            left = await imports.clear_stopped()
            return left, sorted(record.title or "" for record in await db.list_conversations("alice"))

    left, titles = asyncio.run(scenario())
    assert left == {"under way here"}
    assert titles == ["finished"] * 2 + ["under way here"] * 2


def test_an_import_taken_for_stopped_while_it_runs_fails_whole(store, tmp_path, monkeypatch):
    """Should a running import be taken for stopped (its replica's heartbeat missing for a moment) and
    undone, its next batch writes nothing: it ends failed with nothing kept, never done with gaps."""
    monkeypatch.setattr(imports_module, "BATCH_CONVERSATIONS", 5)

    async def scenario() -> Any:
        async with opened(store) as db:
            running = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), Jobs.from_settings(SETTINGS))
            job = await under_way(running, many(100), tmp_path, 20)
            # Another process, to which every other process seems gone.
            other = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), Jobs.from_settings(SETTINGS))
            await other.clear_stopped()
            while job.status == "importing":
                await asyncio.sleep(0.01)
            return job, await db.list_conversations("alice"), await db.running_imports()

    job, left, running = asyncio.run(scenario())
    assert job.status == "failed" and "nothing of it was kept" in (job.error or "")
    assert left == [] and running == []


def test_a_conversation_reads_as_importing_until_its_import_ends_and_an_undo_names_what_it_deleted(store):
    """What the hub asks before a change (a failed import deletes the conversation whole): importing, kept
    or gone; and what the app tells the pages of: the conversations a failed import deleted."""

    async def scenario() -> Any:
        async with opened(store) as db:
            done, failed = titled("done"), titled("failed")
            for import_id, trees in (("import-done", done), ("import-failed", failed)):
                await db.claim_import(import_id, import_id, "replica-1")
                await db.import_conversations("alice", trees, import_id)
            loaded = await db.load(done[0].id)
            under_way = (loaded[0].importing, await db.import_state(done[0].id))
            await db.finish_import("import-done")
            loaded = await db.load(done[0].id)
            ended = (loaded[0].importing, await db.import_state(done[0].id))
            undone = await db.undo_import("import-failed", "failed")
            left = [await db.load(tree.id) for tree in failed]
            return under_way, ended, undone, left, await db.import_state(failed[0].id), {tree.id for tree in failed}

    under_way, ended, undone, left, failed_state, failed_ids = asyncio.run(scenario())
    assert under_way == (True, "importing") and ended == (False, "kept")
    assert set(undone) == failed_ids and len(undone) == 2 and left == [None, None]
    assert failed_state == "gone"


def test_a_copy_that_outlived_its_failed_import_finds_it_gone_at_the_next_change(store):
    """A copy in memory whose import failed, and which nobody told (with replicas, Redis lost the news):
    the next change finds it gone, tells its sockets, and forgets it, rather than start a turn in it."""

    async def failure(change: Any) -> Exception | None:
        try:
            await change
        except Exception as error:
            return error
        return None

    async def scenario() -> Any:
        async with opened(store) as db:
            hub = Hub(db)
            trees = titled("failed")
            await db.claim_import("import-1", "alice", "replica-1")
            await db.import_conversations("alice", trees, "import-1")
            conversation = await hub.open(trees[0].id, "alice")
            refused = await failure(hub.check_changeable(conversation))
            await db.undo_import("import-1", "failed")
            gone = await failure(hub.check_changeable(conversation))
            return refused, gone, hub.live(trees[0].id), conversation.deleting

    refused, gone, live, deleting = asyncio.run(scenario())
    assert isinstance(refused, ImportUnderWay) and isinstance(gone, UnknownConversation)
    assert live is None and deleting


@pytest.mark.parametrize("count", [3])
def test_an_import_writes_every_conversation_with_the_apps_defaults(store, tmp_path, count):
    async def scenario() -> Any:
        async with opened(store) as db:
            job = await run_import(db, many(count), tmp_path)
            return job, await db.list_conversations("alice")

    job, listed = asyncio.run(scenario())
    assert job.status == "done" and job.imported == count
    assert sorted(record.title or "" for record in listed) == [f"Trip {number}" for number in range(count)]
    assert {record.model for record in listed} == {"default-model"}


def test_a_user_runs_one_import_at_a_time_and_another_user_is_not_held_up(store, tmp_path):
    async def scenario() -> Any:
        async with opened(store) as db:
            upload = tmp_path / "upload.json"
            upload.write_bytes(many(100))
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS), Jobs.from_settings(SETTINGS))
            with upload.open("rb") as one, upload.open("rb") as two, upload.open("rb") as three:
                first, second = await asyncio.gather(
                    imports.start("alice", one), imports.start("alice", two), return_exceptions=True
                )
                bobs = await imports.start("bob", three)
            while "importing" in (first.status, bobs.status):
                await asyncio.sleep(0.01)
            return first, second, bobs, await imports.state(first.id, "bob")

    first, second, bobs, seen_by_bob = asyncio.run(scenario())
    assert isinstance(second, ImportRunning)
    assert first.status == bobs.status == "done" and seen_by_bob is None


def chain(count: int, leaf: int | None, branch_at: int | None = None) -> ConversationTree:
    """A conversation of `count` messages one after another (and, with `branch_at`, one more answering
    that message), showing message `leaf` (None: its latest)."""
    messages = [
        TreeMessage(f"m{n}", f"m{n - 1}" if n else None, ("user", "assistant")[n % 2], f"wombat {n}", "", "complete")
        for n in range(count)
    ]
    if branch_at is not None:
        messages.append(TreeMessage("other", f"m{branch_at}", "assistant", "wombat other", "", "complete"))
    chosen = None if leaf is None else f"m{leaf}"
    return ConversationTree("Chain", "m", "", 1.0, 2.0, chosen, messages, id="c")


def shape(tree: ConversationTree) -> tuple[Any, ...]:
    """A tree without its ids: each parent and the message shown named by position."""
    position = {message.id: number for number, message in enumerate(tree.messages)}
    messages = [(position.get(m.parent_id), m.role, m.content) for m in tree.messages]
    return position.get(tree.leaf_id), messages


@pytest.mark.parametrize(
    ("count", "leaf", "branch_at"),
    [(12, 3, None), (10, None, None), (13, 11, 6), (6, 5, None)],
    ids=["leaf in the first part", "parts of exactly 5, no leaf", "a branch in the last part", "one more"],
)
def test_a_long_conversation_goes_in_parts_and_comes_back_exactly(store, tmp_path, monkeypatch, count, leaf, branch_at):
    """Over BATCH_MESSAGES, a conversation is written in parts (5 here), each its own write: it comes back
    whole, with the path it showed."""
    monkeypatch.setattr(imports_module, "BATCH_MESSAGES", 5)
    tree = chain(count, leaf, branch_at)
    calls = []

    async def scenario() -> Any:
        async with opened(store) as db:
            write = db.import_messages

            def counted(*args: Any) -> Any:
                calls.append(len(args[1]))
                return write(*args)

            db.import_messages = counted  # type: ignore[method-assign]
            job = await run_import(db, json.dumps(to_file(tree)).encode(), tmp_path)
            (record,) = await db.list_conversations("alice")
            return job, await db.conversation_tree(record.id, "alice")

    job, back = asyncio.run(scenario())
    assert job.status == "done" and job.imported == 1
    assert calls == [len(tree.messages[start : start + 5]) for start in range(5, len(tree.messages), 5)]
    assert shape(back) == shape(tree)


def test_a_conversation_written_in_parts_is_hidden_until_its_last_part_is_in(store):
    """Until then no one lists it, opens it or finds it: a delete, a turn or a branch switch meanwhile
    would meet a conversation the next part changes under it."""
    tree = chain(8, None).with_new_ids()
    first, rest = tree.messages[:5], tree.messages[5:]

    async def seen(db: Store) -> tuple[Any, ...]:
        listed = [record.id for record in await db.list_conversations("alice")]
        found = await db.search("alice", parse_query("wombat"), 10)
        for_the_model = await db.search_messages("alice", ["wombat"], 10, "none")
        found_ids = [hit.conversation_id for hit in found] + [hit.conversation_id for hit in for_the_model][:1]
        return listed, await db.load(tree.id) is not None, found_ids

    async def scenario() -> tuple[Any, ...]:
        async with opened(store) as db:
            await db.claim_import("import-1", "alice", "replica-1")
            tree.messages = first
            await db.import_conversations("alice", [tree], "import-1", partial=True)
            meanwhile = await seen(db)
            await db.import_messages(tree.id, rest, "import-1", True, None)
            return meanwhile, await seen(db)

    meanwhile, after = asyncio.run(scenario())
    assert meanwhile == ([], False, [])
    assert after == ([tree.id], True, [tree.id, tree.id])


def test_a_users_import_is_claimed_once_and_how_it_went_is_kept_once_it_ended(store):
    """The database is what every replica asks (Redis may forget): a second claim by the same user is
    refused while the first runs, and an import's state is read back running, done or failed."""

    async def scenario() -> Any:
        async with opened(store) as db:
            claims = [await db.claim_import(name, "alice", "replica-1") for name in ("first", "second")]
            claims.append(await db.claim_import("bobs", "bob", "replica-2"))
            await db.import_read("first", 2, {"files": 1})
            await db.import_conversations("alice", titled("first"), "first")
            running = await db.find_import("first")
            await db.finish_import("first")
            done = await db.find_import("first")
            claims.append(await db.claim_import("third", "alice", "replica-1"))
            await db.import_conversations("alice", titled("third"), "third")
            await db.undo_import("third", "it failed")
            return claims, running, done, await db.find_import("third"), await db.find_import("nothing")

    claims, running, done, failed, unknown = asyncio.run(scenario())
    assert claims == [True, False, True, True]
    assert (running.owner, running.replica) == ("alice", "replica-1")
    wire = {"id": "first", "total": 2, "imported": 2, "dropped": {"files": 1}}
    assert running.wire == wire | {"status": "importing"} and done.wire == wire | {"status": "done"}
    assert done.replica is None and unknown is None
    assert (failed.wire["status"], failed.wire["imported"], failed.wire["error"]) == ("failed", 0, "it failed")
