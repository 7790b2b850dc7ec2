"""The operator's MCP servers (`--mcp-config FILE`), with the official `mcp` SDK: each one started with the
app and kept running by a task of its own, its tools listed at start and refreshed, offered to the model
as `server.tool`. Users can neither add nor start one: only the file can.

A server that fails to start, hangs or crashes is reported (the log, the page's tool list, /healthz's
`tools` part) and started again later, with a growing wait; meanwhile its tools are not offered, and a
call to it fails with an error the model reads. The file's `env` and `headers` are secrets: they reach
the server, never a log line or the page (`redact`). The file is read by `mcp_config.py`; each server is
run by its own client, `mcp_client.py`.
"""

import asyncio
from typing import TYPE_CHECKING

from pocketchat.background import CLEANUP_SECONDS, cancel_and_wait
from pocketchat.tools.mcp_config import ServerConfig

if TYPE_CHECKING:
    from pocketchat.tools.mcp_client import McpClient


class McpServers:
    """Every configured server, each run by its client's task from `start` to `aclose`."""

    def __init__(self, configs: dict[str, ServerConfig], start_timeout: float, max_tools: int) -> None:
        self.servers: list[McpClient] = []
        if configs:
            # The MCP SDK loads only when the operator configured servers: a third of a second of every
            # start otherwise.
            from pocketchat.tools import mcp_client

            self.servers = [mcp_client.McpClient(name, c, start_timeout, max_tools) for name, c in configs.items()]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, wait: float) -> None:
        """Start them all; wait up to `wait` seconds for each to start or fail (a slow one goes on starting)."""
        self._tasks = [asyncio.create_task(server.run(), name=f"mcp {server.name}") for server in self.servers]
        if self.servers:
            settling = [asyncio.ensure_future(server.settled.wait()) for server in self.servers]
            await asyncio.wait(settling, timeout=wait)
            for waiting in settling:
                waiting.cancel()

    def failure(self) -> str | None:
        failed = [server.name for server in self.servers if server.status == "failed"]
        return f"MCP servers failing: {', '.join(failed)}" if failed else None

    async def aclose(self) -> None:
        await cancel_and_wait(self._tasks, patience=CLEANUP_SECONDS)
