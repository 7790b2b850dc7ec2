"""The operator's MCP servers (`--mcp-config FILE`), with the official `mcp` SDK: each one started with the
app and kept running by a task of its own, its tools listed at start and refreshed, offered to the model
as `server.tool`. Users can neither add nor start one: only the file can.

A server that fails to start, hangs or crashes is reported (the log, the page's tool list, /healthz's
`tools` part) and started again later, with a growing wait; meanwhile its tools are not offered, and a
call to it fails with an error the model reads. The file's `env` and `headers` are secrets: they reach
the server, never a log line or the page (`redact`).
"""

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pocketchat.background import CLEANUP_SECONDS, cancel_and_wait
from pocketchat.tools import BUILTIN, CLIENT

logger = logging.getLogger("pocketchat")

if TYPE_CHECKING:
    from pocketchat.tools.mcp_server import McpServer

SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*")  # never "__", which joins a server to its tools
REFRESH_SECONDS = 30.0  # how often a running server's tools are listed again (which also says it is alive)
RETRY_SECONDS = (1.0, 60.0)  # the first wait before starting a failed server again, and the longest
STEADY_SECONDS = 60.0  # a server that ran this long before failing starts again after the shortest wait
ERROR_CHARACTERS = 300


class McpConfigError(ValueError):
    """The --mcp-config file cannot be used; says why."""


class _Server(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # other apps' keys ("disabled", ...) are left alone
    type: Literal["stdio", "http", "streamable-http", "streamable_http"] | None = None


class StdioServer(_Server):
    command: str = Field(min_length=1)
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None


class HttpServer(_Server):
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = {}


ServerConfig = StdioServer | HttpServer


def load_config(path: Path) -> dict[str, ServerConfig]:
    """The servers of an `{"mcpServers": {name: {command, args, env} | {url, headers}}}` file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise McpConfigError(f"--mcp-config {path}: cannot read it as JSON ({error}).") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f'--mcp-config {path}: expected {{"mcpServers": {{name: ...}}}}.')
    configs: dict[str, ServerConfig] = {}
    for name, entry in servers.items():
        if not SERVER_NAME.fullmatch(name) or len(name) > 32 or name in (BUILTIN, CLIENT):
            raise McpConfigError(
                f"--mcp-config {path}: the server name {name!r:.40} must be 1-32 letters, digits, - or _ (not __), "
                f"and not {BUILTIN!r} or {CLIENT!r}."
            )
        kind: type[ServerConfig] = HttpServer if isinstance(entry, dict) and "url" in entry else StdioServer
        try:
            configs[name] = kind.model_validate(entry)
        except ValidationError as error:
            # The fields' names only: a value may be a secret.
            wrong = ", ".join(".".join(str(part) for part in problem["loc"]) or "it" for problem in error.errors())
            raise McpConfigError(
                f"--mcp-config {path}: server {name!r} needs 'command' (stdio) or an http(s) 'url'; wrong: {wrong}."
            ) from None
    return configs


def secrets_of(config: ServerConfig) -> list[str]:
    """What must never be shown of a server's config: its env and header values, and what its URL
    carries beside the host (a password, query parameters)."""
    if isinstance(config, StdioServer):
        found = list(config.env.values())
    else:
        parts = urlsplit(config.url)
        found = [*config.headers.values(), parts.password or "", *(value for _, value in parse_qsl(parts.query))]
        found += [value.split(" ", 1)[1] for value in config.headers.values() if " " in value]  # "Bearer <token>"
    return sorted((secret for secret in found if len(secret) >= 3), key=len, reverse=True)


class McpServers:
    """Every configured server, each run by a task of its own from `start` to `aclose`."""

    def __init__(self, configs: dict[str, ServerConfig], start_timeout: float, max_tools: int) -> None:
        self.servers: list[McpServer] = []
        if configs:
            # The MCP SDK loads only when the operator configured servers: a third of a second of every
            # start otherwise.
            from pocketchat.tools import mcp_server

            self.servers = [mcp_server.McpServer(name, c, start_timeout, max_tools) for name, c in configs.items()]
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
