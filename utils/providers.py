"""Pick the chat provider the settings ask for."""

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from utils.llm_stream import ChatProvider, Chunk
from utils.openai_provider import OpenAIProvider
from utils.protocol import ProviderError
from utils.settings import Settings

logger = logging.getLogger(__name__)


class UnavailableProvider:
    """Stands in when no model can run, so the app still starts and the page says how to fix it."""

    kind = "unavailable"
    usage_source = "estimated"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "local": False, "message": self.reason}

    async def warm_up(self) -> None:
        return None

    async def default_model(self) -> str:
        raise ProviderError(self.reason)

    async def list_models(self) -> list[str]:
        return []

    @asynccontextmanager
    async def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        raise ProviderError(self.reason)
        yield  # pragma: no cover - makes this a generator

    async def aclose(self) -> None:
        return None


def make_provider(settings: Settings) -> ChatProvider:
    if settings.provider_kind == "openai":
        return OpenAIProvider(
            base_url=settings.base_url,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            model=settings.model,
            idle_limit=settings.idle_limit,
            temperature=settings.temperature,
        )
    from utils.local_provider import LocalModelMissing, LocalProvider

    try:
        return LocalProvider(settings.model_path, settings.max_tokens, settings.temperature)
    except LocalModelMissing as missing:
        logger.warning("embedded model unavailable: %s", missing)
        return UnavailableProvider(str(missing))
