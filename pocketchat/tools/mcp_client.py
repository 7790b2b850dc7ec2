"""The client side of one configured MCP server, with the official `mcp` SDK (stdio or streamable HTTP):
the server started, its tools listed and refreshed, called with a timeout, and started again after a
failure. Loaded only when the operator configured servers (`pocketchat/tools/mcp.py`)."""

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, TextIO

import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from pocketchat.tools import WIRE_NAME, CallContext, Tool, ToolFailed, wire_name
from pocketchat.tools.mcp_config import ServerConfig, StdioServer, secrets_of
from pocketchat.tools.mcp_stdio import JunkLines, LineTooLong, bounded_stdio_client
from utils.clean import DESCRIPTION_CHARACTERS, clean_json, clean_text

logger = logging.getLogger("pocketchat")
REFRESH_SECONDS = 30.0  # how often a running server's tools are listed again (which also says it is alive)
RETRY_SECONDS = (1.0, 60.0)  # the first wait before starting a failed server again, and the longest
STEADY_SECONDS = 60.0  # a server that ran this long before failing starts again after the shortest wait
ERROR_CHARACTERS = 300


def text_of(result: types.CallToolResult) -> str:
    """A tool's result as the text the model reads: its text parts; other parts named; or its structured
    content as JSON when it has no text."""
    parts = []
    for content in result.content:
        text = getattr(content, "text", None)
        parts.append(text if isinstance(text, str) else f"[{content.type} content]")
    if not any(parts) and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class McpClient:
    """The client of one configured server, which it keeps running by `run` (its own task, for the app's
    life)."""

    def __init__(self, name: str, config: ServerConfig, start_timeout: float, max_tools: int) -> None:
        self.name = name
        self.config = config
        self.start_timeout = start_timeout
        self.max_tools = max_tools  # of its tools, the first this many are offered
        self.status: Literal["starting", "ok", "failed"] = "starting"
        self.error: str | None = None  # why it failed, redacted
        self.tools: list[Tool] = []
        self.listed = 0  # the tools it lists that could be offered (over max_tools, the first are)
        self._said: tuple[int, int] = (0, 0)  # what the log said of its listing: (tools left out, refused)
        self.settled = asyncio.Event()  # its first start succeeded or failed
        self._secrets = secrets_of(config)
        self._session: ClientSession | None = None
        self._wake = asyncio.Event()  # a call found it gone, or it says its tools changed
        self._lost: str | None = None  # why its connection ended, when PocketChat ended it

    def describe(self) -> dict[str, Any]:
        """What the page's tool list shows of it (no secret: its name, state, redacted error, tools)."""
        described: dict[str, Any] = {
            "name": self.name,
            "status": self.status,
            "tools": [tool.summary() for tool in self.tools],
        }
        if self.error:
            described["error"] = self.error
        if self.listed > len(self.tools):
            described["listed"] = self.listed
        return described

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text[:ERROR_CHARACTERS]

    async def run(self) -> None:
        """Start the server and keep it running: started again after a failure, waiting longer each time."""
        wait = RETRY_SECONDS[0]
        while True:
            started = time.monotonic()
            try:
                await self._serve()  # it ends only by raising
            except Exception as error:
                if time.monotonic() - started > STEADY_SECONDS:
                    wait = RETRY_SECONDS[0]
                self._failed(_reason(error, self.start_timeout), wait)
            finally:
                self._session, self.tools = None, []
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_SECONDS[1])

    def _failed(self, reason: str, wait: float) -> None:
        """Reported in one log line (no traceback: the reason says it), the page's list and /healthz."""
        self.status, self.error = "failed", self.redact(reason)
        self.settled.set()
        logger.warning("MCP server %s failed: %s; starting it again in %g s", self.name, self.error, wait)

    async def _serve(self) -> None:
        self._wake.clear()
        self._lost = None
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport())
            session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._on_message))
            async with asyncio.timeout(self.start_timeout):
                await session.initialize()
                await self._list_tools(session)
            self._session, self.status, self.error = session, "ok", None
            self.settled.set()
            logger.info("MCP server %s: %d tools", self.name, len(self.tools))
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), REFRESH_SECONDS)
                self._wake.clear()
                async with asyncio.timeout(self.start_timeout):
                    await self._list_tools(session)  # fails if it died: then it is started again

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        config = self.config
        if isinstance(config, StdioServer):
            # The server gets the SDK's short default environment (PATH, HOME...) and the file's env:
            # none of PocketChat's own secrets. What it writes to stderr is logged as its own, redacted.
            parameters = StdioServerParameters(command=config.command, args=config.args, env=config.env, cwd=config.cwd)
            junk = JunkLines(self.name, self.redact)
            async with (
                self._stderr() as errlog,
                bounded_stdio_client(parameters, errlog, junk, self._lost_because) as streams,
            ):
                errlog.close()  # the server has its copy: its exit ends the reading
                yield streams
            return
        timeout = httpx2.Timeout(self.start_timeout, read=300.0)
        async with (
            create_mcp_http_client(headers=config.headers, timeout=timeout) as http,
            streamable_http_client(config.url, http_client=http) as streams,
        ):
            yield streams

    @asynccontextmanager
    async def _stderr(self) -> AsyncIterator[TextIO]:
        """A file for the server's stderr, whose lines are logged as its own with its secrets redacted
        (a server may print its environment when it fails)."""
        read_end, write_end = os.pipe()
        reader = asyncio.StreamReader()
        pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", 0)
        )
        errlog = os.fdopen(write_end, "w")

        async def log_lines() -> None:
            said_long = False
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # over the reader's 64 KiB, which readline drops: read on, or the pipe fills
                    if not said_long:
                        logger.info("MCP server %s says a line over 64 KiB (not logged)", self.name)
                    said_long = True
                    continue
                if not line:
                    return
                logger.info("MCP server %s says: %s", self.name, self.redact(line.decode(errors="replace").rstrip()))

        logging_task = asyncio.create_task(log_lines())
        try:
            yield errlog
        finally:
            errlog.close()
            await asyncio.wait({logging_task}, timeout=1.0)  # its last words, if it is gone
            logging_task.cancel()
            pipe.close()

    async def _list_tools(self, session: ClientSession) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        tools, seen, refused = [], set(), []
        for tool in listed:
            # Shown as server.tool; a tool name OpenAI would refuse (a dot, a slash...) is sent with _ instead.
            shown = f"{self.name}.{re.sub(r'[^A-Za-z0-9_-]', '_', tool.name)}"
            if not WIRE_NAME.fullmatch(wire_name(shown)) or shown in seen:
                refused.append(tool.name)
                continue
            seen.add(shown)
            if len(tools) < self.max_tools:  # every tool offered is declared in every request of a turn
                # Declared in every request and listed in the page: a description and a schema as the
                # server wrote them (a NUL, megabytes, deep nesting) are made safe first.
                schema = clean_json(tool.input_schema or {"type": "object", "properties": {}})
                description = clean_text(tool.description or "", DESCRIPTION_CHARACTERS)
                tools.append(Tool(self.name, shown, description, schema, self._caller(tool.name)))
        self.tools, self.listed = tools, len(seen)
        self._say_what_is_left_out(len(seen) - len(tools), refused)

    def _say_what_is_left_out(self, cut: int, refused: list[str]) -> None:
        """One line each time what is left out of its listing changes (it is listed every 30 s)."""
        if self._said == (cut, len(refused)):
            return
        self._said = (cut, len(refused))
        if cut:
            logger.warning(
                "MCP server %s offers %s tools; the first %d are used (--max-tools)",
                self.name,
                f"{self.listed:,}",
                self.max_tools,
            )
        if refused:
            logger.warning(
                "MCP server %s: %d tools are not offered (their names are too long or taken), e.g. %r",
                self.name,
                len(refused),
                refused[0][:80],
            )

    def _caller(self, tool_name: str) -> Any:
        async def call(arguments: dict[str, Any], context: CallContext) -> str:
            return await self.call(tool_name, arguments)

        return call

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """Call one of its tools; cancelling this cancels the call on the server (notifications/cancelled)."""
        session = self._session
        if session is None:
            raise ToolFailed(f"The MCP server {self.name} is not running ({self.error or 'starting'}).")
        try:
            result = await session.call_tool(tool_name, arguments)
        except MCPError as error:
            if "closed" in str(error).lower():
                self._wake.set()  # its task notices it is gone, reports it and starts it again
            why = self._lost or self.redact(str(error))
            raise ToolFailed(f"The MCP server {self.name} failed: {why}") from None
        except Exception as error:  # the connection broke under the call
            self._wake.set()
            raise ToolFailed(f"The MCP server {self.name} failed: {self.redact(_reason(error, 0))}") from None
        text = text_of(result)
        if result.is_error:
            raise ToolFailed(text or "The tool reported an error.")
        return text

    def _lost_because(self, why: str) -> None:
        self._lost = why

    async def _on_message(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed":
            self._wake.set()


def _reason(error: BaseException, timeout: float) -> str:
    """A failure said plainly: the first leaf of an exception group, what a timeout waited for."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, TimeoutError):
        return f"it did not answer within {timeout:g} s"
    if isinstance(error, LineTooLong):
        return str(error)
    if isinstance(error, MCPError) and "closed" in str(error).lower():
        return "it exited, or its connection closed"
    if isinstance(error, OSError) and error.strerror:
        return f"it could not be started: {error.strerror}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
