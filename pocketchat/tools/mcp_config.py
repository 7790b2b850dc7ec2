"""The --mcp-config file: the operator's MCP servers, in the format other MCP clients read
(`{"mcpServers": {name: {command, args, env} | {url, headers}}}`), checked whole at start-up, and what
of each entry is a secret (`secrets_of`: never shown in a log line or the page)."""

import json
import re
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pocketchat.tools import BUILTIN, CLIENT

SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*")  # never "__", which joins a server to its tools


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
