"""Every tool source of this process (the built-in tools, the operator's MCP servers), made in the
lifespan; and a turn's `ToolBox`: the sources its conversation has on, and its client's tools."""

import logging
from typing import Any

from pocketchat.jobs import Jobs
from pocketchat.limits import Limits
from pocketchat.records import ConversationRecord
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.tools import BUILTIN, CallContext, Tool, ToolBox
from pocketchat.tools.builtin import builtin_tools
from pocketchat.tools.client import ClientTools
from pocketchat.tools.mcp import McpServers
from pocketchat.tools.mcp_config import load_config

START_WAIT_SECONDS = 5.0  # start-up waits this long at most for the MCP servers to list their tools

logger = logging.getLogger("pocketchat")


class Catalog:
    def __init__(self, settings: Settings, store: Store, limits: Limits, jobs: Jobs) -> None:
        self.settings = settings
        self.limits = limits
        self.builtin = builtin_tools(store, jobs)
        configs = load_config(settings.mcp_config) if settings.mcp_config else {}
        self.mcp = McpServers(configs, settings.tool_timeout, settings.max_tools)
        self._cuts_said: set[int] = set()  # totals of tools whose cut to --max-tools the log said

    async def start(self) -> None:
        await self.mcp.start(min(START_WAIT_SECONDS, self.settings.tool_timeout))

    async def aclose(self) -> None:
        await self.mcp.aclose()

    def failure(self) -> str | None:
        """Which MCP servers fail now, if any (for /healthz's `tools` part and the log)."""
        return self.mcp.failure()

    def describe(self) -> dict[str, Any]:
        """The page's tool list: every source with its state and tools (no secret of any)."""
        builtin = {"name": BUILTIN, "status": "ok", "tools": [tool.summary() for tool in self.builtin]}
        return {
            "enabled": self.settings.max_tool_steps > 0,
            "max_tools": self.settings.max_tools,
            "sources": [builtin, *(server.describe() for server in self.mcp.servers)],
        }

    def for_turn(self, record: ConversationRecord, turn_id: str, client: ClientTools | None) -> ToolBox:
        """A turn's tools: the sources the conversation has not turned off (`tools_off`, read at each
        offer: a change applies from the next step), and those `client` offers (the socket that started
        the turn, if it declared any). The tools that read the user's data read its owner's only."""

        def available() -> list[Tool]:
            off = record.tools_off
            tools = [] if BUILTIN in off else list(self.builtin)
            for server in self.mcp.servers:
                if server.status == "ok" and server.name not in off:
                    tools += server.tools
            tools += client.tools if client is not None else []
            return self._cut(tools)

        def context(call_id: str) -> CallContext:
            return CallContext(record.owner, record.id, turn_id, call_id)

        return ToolBox(available, context, self.limits, self.settings)

    def _cut(self, tools: list[Tool]) -> list[Tool]:
        """The first --max-tools of a turn's tools: each is declared in every request of the turn."""
        limit = self.settings.max_tools
        if len(tools) > limit and len(tools) not in self._cuts_said:
            self._cuts_said.add(len(tools))
            logger.warning(
                "a turn has %d tools; the first %d are offered, the last %d left out (--max-tools)",
                len(tools),
                limit,
                len(tools) - limit,
            )
        return tools[:limit]
