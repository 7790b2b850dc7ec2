"""A hostile MCP server over stdio, for issue 30's rows 11 and 12 (tests/hostile_files.py builds its
--mcp-config entry): `python tests/hostile_mcp_server.py --flood MB` writes MB megabytes without a newline
on stdout, where the client waits for JSON-RPC lines, then exits (the app starts it again, and it floods
again); `--tools N` is a well-behaved server that lists N tools (each echoes its text), in one page.

Not tests/mcp_server.py: that one's tools are what the app's tests call, and registering 10,000 tools
through MCPServer's decorators takes ~12 s of pydantic; the low-level Server answers from a list."""

import argparse
import os
import sys
import threading
import time

parser = argparse.ArgumentParser()
mode = parser.add_mutually_exclusive_group(required=True)
mode.add_argument("--flood", type=float, metavar="MB", help="write this many megabytes without a newline, then exit")
mode.add_argument("--tools", type=int, metavar="N", help="list N tools")
options = parser.parse_args()

FLOOD_PIECE = b"x" * (1 << 20)


def exit_with_parent() -> None:
    """The bench kills apps with SIGKILL: a server blocked writing to a dead pipe must not outlive its app."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def flood(megabytes: float) -> None:
    left = int(megabytes * 1_000_000)
    with os.fdopen(sys.stdout.fileno(), "wb", closefd=False) as out:
        while left > 0:
            out.write(FLOOD_PIECE[: min(left, len(FLOOD_PIECE))])
            left -= len(FLOOD_PIECE)
        out.flush()


def serve_tools(count: int) -> None:
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tools = [
        types.Tool(name=f"tool_{n}", description=f"Echo the text (tool {n} of {count}).", input_schema=schema)
        for n in range(count)
    ]

    async def list_tools(_context: object, _params: object) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(_context: object, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server = Server("hostile-tools", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


if __name__ == "__main__":
    threading.Thread(target=exit_with_parent, daemon=True).start()
    if options.flood is not None:
        flood(options.flood)
    else:
        serve_tools(options.tools)
