"""The stdio transport of the operator's MCP servers, bounded. The SDK's `stdio_client` joins its whole
read buffer with every chunk it reads (`(buffer + chunk).split("\\n")`, on the event loop): a line of n
bytes costs O(n²), so a server that wrote 100 MB without a newline stalled every user's chat for
seconds, and it logs a traceback for every line that is not JSON-RPC. This one reads a line in linear
time up to a cap, ends the connection of a server that goes over it (its task starts it again, saying
why), and counts the lines it cannot read. The rest is the SDK's: the process is started and stopped
with its helpers (its own session; stdin closed, then SIGTERM, then SIGKILL), and the session reads and
writes the same memory streams."""

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import StdioServerParameters, types
from mcp.client._transport import TransportStreams

# The SDK's own process helpers (mcp is pinned: an upgrade that renames them fails at import, in the tests).
from mcp.client.stdio import (
    _create_platform_compatible_process,
    _drain_stdout,
    _stop_server_process,
    _terminate_process_tree,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

logger = logging.getLogger("pocketchat")

MAX_LINE_BYTES = 4 * 1024 * 1024  # one message, a tool's result with it (the model reads 8,000 characters)
WRITER_FLUSH_SECONDS = 0.5  # at the end, for the messages accepted to reach the server
JUNK_LOG_SECONDS = 60.0  # lines that are not JSON-RPC are counted in the log this often at most


class LineTooLong(Exception):
    """The server wrote a line over the cap: its connection ends. Says why, plainly."""


class JunkLines:
    """The lines a server writes that are not JSON-RPC (a banner, debug prints): ignored; the first is
    logged, then how many more, once a minute at most and when the connection ends."""

    def __init__(self, server: str, redact: Callable[[str], str]) -> None:
        self.server = server
        self.redact = redact  # the server's secrets, out of what is logged
        self.unsaid = 0
        self.said_at: float | None = None

    def add(self, line: bytes) -> None:
        self.unsaid += 1
        if self.said_at is None:
            sample = self.redact(line[:80].decode(errors="replace"))
            logger.warning("MCP server %s wrote a line that is not JSON-RPC, ignored: %r", self.server, sample)
            self.unsaid, self.said_at = 0, time.monotonic()
        elif time.monotonic() - self.said_at >= JUNK_LOG_SECONDS:
            self.say()

    def say(self) -> None:
        if self.unsaid:
            logger.warning("MCP server %s wrote %d more lines that are not JSON-RPC, ignored", self.server, self.unsaid)
            self.unsaid, self.said_at = 0, time.monotonic()


@asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters,
    errlog: TextIO,
    junk: JunkLines,
    on_too_long: Callable[[str], None],
    max_line: int = MAX_LINE_BYTES,
) -> AsyncIterator[TransportStreams]:
    """As the SDK's `stdio_client`. A line over `max_line` bytes calls `on_too_long(why)` (before the
    session sees its connection end: a call waiting then can say why), and raises LineTooLong out of the
    block."""
    process = await _create_platform_compatible_process(
        command=server.command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    too_long = False

    async def read_lines() -> None:
        nonlocal too_long
        assert process.stdout is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        async with read_writer:
            while True:
                try:
                    line = await stdout.receive_until(b"\n", max_line)
                except anyio.DelimiterNotFound:
                    why = f"it wrote a line over {max_line / 2**20:g} MB, the most one message may take"
                    on_too_long(why)
                    too_long = True
                    raise LineTooLong(why) from None  # no drain: it would read the rest of the flood
                except (anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    return  # it exited, or the shutdown closed its stdout
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    junk.add(line)
                    continue
                try:
                    await read_writer.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break  # the session is gone
        # What it still writes is read and dropped: a server blocked on a full pipe could not exit.
        await _drain_stdout(process)

    async def write_lines() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # it stopped reading: the session sees the connection end
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_lines)
        tasks.start_soon(write_lines)
        try:
            yield read_stream, write_stream
        finally:
            # Even when cancelled: the process must not outlive its connection (each wait is bounded).
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(WRITER_FLUSH_SECONDS):
                    await writer_done.wait()
                if too_long:  # stuck writing, it would not notice its stdin close: no grace
                    await _terminate_process_tree(process)
                await _stop_server_process(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
                junk.say()
            tasks.cancel_scope.cancel()
