"""A small MCP server over stdio (the official SDK), started by the tests: `python tests/mcp_server.py`.

Its tools: `add` (two integers), `shout` (a text, upper-cased, `times` times: a result of any size),
`slow` (sleeps, and notes its cancellation in the file `--cancelled-file` names), `hang` (never
returns), `crash` (the process exits), `grow` (adds a tool, and says so), `environment` (a variable of its
environment). `--fail-at-start`
exits before speaking MCP (saying its TOKEN variable on stderr); `--hang-at-start` never answers;
`--http PORT` serves streamable HTTP. Misbehaving before it speaks MCP: `--flood BYTES` writes that many
bytes to stdout without a newline (a server stuck writing), `--junk LINES` writes lines that are not
JSON-RPC (a banner, debug prints), `--stderr-flood BYTES` writes one long line to stderr;
`--many-tools N` lists N more tools (and two whose names are too long): a big catalogue."""

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import anyio
from mcp import types
from mcp.server import MCPServer
from mcp.server.mcpserver import Context

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at-start", action="store_true")
parser.add_argument("--hang-at-start", action="store_true")
parser.add_argument("--cancelled-file", type=Path)
parser.add_argument("--http", type=int)
parser.add_argument("--flood", type=int, default=0)
parser.add_argument("--junk", type=int, default=0)
parser.add_argument("--stderr-flood", type=int, default=0)
parser.add_argument("--many-tools", type=int, default=0)
options = parser.parse_args()


def exit_with_parent() -> None:
    """The tests kill apps with SIGKILL: a server whose `hang` holds a thread would outlive its app."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


threading.Thread(target=exit_with_parent, daemon=True).start()
if options.fail_at_start:
    sys.exit(f"this server fails at start on purpose (TOKEN={os.environ.get('TOKEN', '')})")  # a secret, said
if options.hang_at_start:
    time.sleep(3600)
for stream, size in ((sys.stdout.buffer, options.flood), (sys.stderr.buffer, options.stderr_flood)):
    for start in range(0, size, 1 << 20):
        stream.write(b"x" * min(1 << 20, size - start))
    if size and stream is sys.stderr.buffer:
        stream.write(b"\nafter the flood\n")
    stream.flush()
sys.stdout.write("".join(f"not JSON-RPC, line {n}\n" for n in range(options.junk)))
sys.stdout.flush()

server = MCPServer("test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str, times: int = 1) -> str:
    """The text in capitals, repeated `times` times."""
    return text.upper() * times


@server.tool()
async def slow(seconds: float) -> str:
    """Wait `seconds`, then say done."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        if options.cancelled_file:
            options.cancelled_file.write_text("cancelled")
        raise
    return "done"


@server.tool()
def hang() -> str:
    """Never answer (a badly written tool: the SDK runs it on a thread, the server itself goes on)."""
    time.sleep(3600)
    return "never"


@server.tool()
def crash() -> str:
    """Exit the server process."""
    os._exit(3)


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool `extra`, and say the tool list changed."""

    def extra() -> str:
        """A tool added while the server runs."""
        return "extra"

    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
def environment(name: str) -> str:
    """The value of an environment variable of the server (the config's `env` reaches it)."""
    return os.environ.get(name, "")


if options.many_tools:
    own_tools = server.list_tools

    async def catalogue() -> list[types.Tool]:
        """Its own tools, then `--many-tools` more like `add` (a call to one is refused), and two too long."""
        own = await own_tools()
        names = [f"t{n}" for n in range(options.many_tools)] + ["long_" * 13, "longer_" * 13]
        return own + [own[0].model_copy(update={"name": name}) for name in names]

    server.list_tools = catalogue  # type: ignore[method-assign]


if __name__ == "__main__":
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run()
