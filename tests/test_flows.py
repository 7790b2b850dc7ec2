"""What flow.py builds graphs with (pocketchat/flows.py): lists chained in order, and nodes after a complete
reply that may fail without failing it."""

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

from pocketflow import AsyncFlow, AsyncNode

from pocketchat.flows import chain, may_fail


class Steps:
    """A turn log's `append_step`, kept."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, Any]] = []

    def append_step(self, node: str, kind: str, data: Any, **show: Any) -> None:
        self.steps.append((node, kind, data))


class Note(AsyncNode):
    def __init__(self, word: str) -> None:
        super().__init__()
        self.word = word

    async def post_async(self, shared: dict[str, Any], prep: Any, result: Any) -> None:
        shared["notes"].append(self.word)


class Broken(AsyncNode):
    async def post_async(self, shared: dict[str, Any], prep: Any, result: Any) -> None:
        raise KeyError("the-secret-in-a-bug")


def run(*nodes: AsyncNode) -> dict[str, Any]:
    shared = {"notes": [], "log": Steps(), "turn": SimpleNamespace(id="t1")}
    asyncio.run(AsyncFlow(start=chain(*nodes)).run_async(shared))
    return shared


def test_a_list_runs_in_order():
    assert run(Note("a"), Note("b"), Note("c"))["notes"] == ["a", "b", "c"]


def test_a_node_after_the_reply_that_fails_is_a_step_and_the_rest_runs(caplog):
    with caplog.at_level(logging.ERROR, logger="pocketchat"):
        shared = run(*may_fail([Note("first"), Broken(), Note("after")]), Note("save"))
    assert shared["notes"] == ["first", "after", "save"]  # SaveReply's place: it always runs
    ((node, kind, said),) = shared["log"].steps
    assert (node, kind) == ("Broken", "failed") and "could not run" in said
    assert "the-secret-in-a-bug" not in said  # plain words for the page; the detail is the log's
    assert "Broken failed in turn t1" in caplog.text and "the-secret-in-a-bug" in caplog.text
