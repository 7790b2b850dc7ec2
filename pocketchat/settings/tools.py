"""The settings of the tools the model may call: the operator's MCP servers, and how many calls, tools,
seconds and characters a reply may spend on them."""

from pathlib import Path

from pydantic import BaseModel, Field


class ToolSettings(BaseModel):
    mcp_config: Path | None = Field(
        None,
        description="A JSON file of MCP servers whose tools the model may call, in the common format "
        '{"mcpServers": {name: {command, args, env} | {url, headers}}}; started with the app. Unset: the '
        "built-in tools only.",
    )
    max_tool_steps: int = Field(
        8,
        ge=0,
        description="Rounds of tool calls the model may make in one reply; then it answers without tools (0: "
        "tools are never offered, for a provider without tool calls).",
    )
    max_tools: int = Field(
        128,
        gt=0,
        description="Tools offered to the model in one turn, at most: an MCP server's first N, and of all the "
        "sources together the first N (built-in, then the servers in the file's order, then a client's). What "
        "is left out is said in the Tools dialog and the log.",
    )
    tool_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a tool call may take (an MCP server's, or a client's answer) before it fails with "
        "an error the model reads; also how long an MCP server may take to start.",
    )
    tool_result_chars: int = Field(
        8000, gt=0, description="Characters of a tool's result the model reads; the rest is cut off."
    )
