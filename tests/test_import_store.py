"""An import against both stores on real databases: trees written whole and read back; an import whose
write fails part-way leaves nothing of itself, and a process stopping mid-import does the same."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pocketchat.cluster.local import LocalCoordinator
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.transfer import imports as imports_module
from pocketchat.transfer.imports import ImportRunning, Imports
from pocketchat.transfer.native import to_file
from pocketchat.transfer.read import parse, read_trees
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
    imports = Imports(SETTINGS, db, lambda: "default-model", LocalCoordinator(SETTINGS))
    with upload.open("rb") as file:
        job = await imports.start("alice", file)
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
    trees = [tree.with_new_ids() for tree in read_trees(parse(CHATGPT.read_bytes()))]
    for tree in trees:
        tree.model, tree.system_prompt = "m", ""

    async def scenario() -> Any:
        async with opened(store) as db:
            await db.begin_import("import-1", "replica-1")
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
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS))
            job = await under_way(imports, many(200), tmp_path, 10)
            await imports.aclose()
            return job, await db.list_conversations("alice")

    job, left = asyncio.run(scenario())
    assert job.status == "failed" and left == []


def titled(title: str) -> list[Any]:
    """Two conversations of the test file under new ids, titled `title`."""
    made = [tree.with_new_ids() for tree in read_trees(parse(many(2)))]
    for tree in made:
        tree.model, tree.system_prompt, tree.title = "m", "", title
    return made


def test_what_a_dead_process_left_of_its_import_is_deleted_and_nothing_else(store):
    """A process killed mid-import (no undo ran) left its import running and its conversations listed: the
    next process deletes them at start, and keeps a finished import's and one of its own under way."""

    async def scenario() -> Any:
        async with opened(store) as db:
            here = LocalCoordinator(SETTINGS)
            imports = Imports(SETTINGS, db, lambda: "m", here)
            for import_id, replica in (("killed", "a-dead-process"), ("finished", "a-dead-process")):
                await db.begin_import(import_id, replica)
                await db.import_conversations("alice", titled(import_id), import_id)
            await db.finish_import("finished")
            await db.begin_import("under way here", here.replica)
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
            running = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS))
            job = await under_way(running, many(100), tmp_path, 20)
            # Another process, to which every other process seems gone.
            await Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS)).clear_stopped()
            while job.status == "importing":
                await asyncio.sleep(0.01)
            return job, await db.list_conversations("alice"), await db.running_imports()

    job, left, running = asyncio.run(scenario())
    assert job.status == "failed" and "nothing of it was kept" in (job.error or "")
    assert left == [] and running == []


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
            imports = Imports(SETTINGS, db, lambda: "m", LocalCoordinator(SETTINGS))
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
