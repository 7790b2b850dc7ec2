"""What flow.py builds its graphs with, beyond PocketFlow's own `>>`: a list of nodes chained in order, and
nodes that may fail without failing the turn (those after a complete reply: the reply is whole already);
and how it names them to the app (`ChatFlow`): main.py hands flow.py's graphs to the app, which never
imports flow.py or nodes.py itself."""

import copy
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pocketflow import AsyncFlow, AsyncNode, BaseNode

from pocketchat.settings import Settings

logger = logging.getLogger("pocketchat")


def chain(*nodes: BaseNode) -> BaseNode:
    """`a >> b >> c` for a list: each node's default action goes to the next; the first is returned."""
    for node, following in itertools.pairwise(nodes):
        node >> following
    return nodes[0]


class MayFail(AsyncNode):
    """Runs `node`; if it raises, the turn goes on as if it had not run: its failure is a `failed` step of
    its own in plain words (the log has the traceback), and the flow takes the default action."""

    def __init__(self, node: AsyncNode) -> None:
        super().__init__()
        self.node = node

    async def _run_async(self, shared: dict[str, Any]) -> str | None:
        name = type(self.node).__name__
        try:
            await copy.copy(self.node)._run_async(shared)  # a copy, as PocketFlow runs each node
        except Exception:
            logger.exception("%s failed in turn %s; the reply goes on without it", name, shared["turn"].id)
            said = f"{name} could not run; the reply is not affected."
            shared["log"].append_step(name, "failed", said, shape="text", display="below")
        return None


def may_fail(nodes: list[AsyncNode]) -> list[BaseNode]:
    return [MayFail(node) for node in nodes]


FlowFactory = Callable[[Settings], AsyncFlow]  # a graph, built once from the settings


@dataclass(frozen=True)
class ChatFlow:
    """A flow a turn can run: what people see of it, and how it is built."""

    title: str
    description: str  # one line
    create: FlowFactory
