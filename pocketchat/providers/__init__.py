"""Pick the chat provider the settings ask for."""

import fnmatch
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from pocketchat.errors import ProviderError
from pocketchat.providers.local import LocalModelMissing, LocalProvider
from pocketchat.providers.openai_compatible import OpenAIProvider
from pocketchat.settings import Settings
from utils.llm_stream import ChatProvider, Chunk, Sampling, ToolOffer

logger = logging.getLogger(__name__)


class UnavailableProvider:
    """Stands in when no model can run, so the app still starts and the page says how to fix it."""

    kind = "unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "local": False, "message": self.reason}

    def usage_source(self, model: str) -> str:
        return "estimated"

    def supports_tools(self, model: str) -> bool:
        return False

    async def warm_up(self) -> None:
        return None

    async def default_model(self) -> str:
        raise ProviderError(self.reason)

    async def list_models(self) -> list[str]:
        return []

    def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
        tools: ToolOffer | None = None,
        sampling: Sampling | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        raise ProviderError(self.reason)

    async def aclose(self) -> None:
        return None


class WithEmbeddedModel:
    """A remote provider, with the embedded model as one more entry of its model list: a conversation
    can pick it, offline, and only then are its weights loaded."""

    def __init__(self, remote: OpenAIProvider, embedded: LocalProvider) -> None:
        self.remote = remote
        self.embedded = embedded
        self.kind = remote.kind

    def _for(self, model: str) -> ChatProvider:
        return self.embedded if model == self.embedded.model_name else self.remote

    def describe(self) -> dict[str, Any]:
        return {**self.remote.describe(), "embedded_model": self.embedded.model_name}

    def usage_source(self, model: str) -> str:
        return self._for(model).usage_source(model)

    def supports_tools(self, model: str) -> bool:
        return self._for(model).supports_tools(model)

    async def warm_up(self) -> None:
        await self.remote.warm_up()

    async def default_model(self) -> str:
        return await self.remote.default_model()

    async def list_models(self) -> list[str]:
        return [*await self.remote.list_models(), self.embedded.model_name]

    def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
        tools: ToolOffer | None = None,
        sampling: Sampling | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        return self._for(model).open_stream(messages, model, max_tokens, on_queued, tools, sampling)

    async def aclose(self) -> None:
        await self.remote.aclose()
        await self.embedded.aclose()


async def available_models(provider: ChatProvider) -> tuple[list[str], str | None]:
    """Every model a conversation can pick, and why the remote provider's list is missing if it is:
    the embedded model stays pickable (offline) whatever the remote provider does."""
    remote, embedded = (
        (provider.remote, [provider.embedded.model_name]) if isinstance(provider, WithEmbeddedModel) else (provider, [])
    )
    try:
        return [*await remote.list_models(), *embedded], None
    except ProviderError as error:
        return embedded, error.message


def sees_images(provider: ChatProvider, model: str, patterns: list[str]) -> bool:
    """Whether `model` takes images: a remote model whose name (or its last part after '/', as OpenRouter
    names them) matches one of `patterns`, in any case. The embedded model is a text model."""
    if provider.kind != "openai" or not model:
        return False
    if isinstance(provider, WithEmbeddedModel) and model == provider.embedded.model_name:
        return False
    return _matches(model, tuple(patterns))


@functools.lru_cache(maxsize=1024)
def _matches(model: str, patterns: tuple[str, ...]) -> bool:
    # Asked at every turn, of a few models and one list: each answer is kept (a fifth of ReadImages'
    # time was the patterns' matching).
    names = {model.lower(), model.rsplit("/", 1)[-1].lower()}
    return any(fnmatch.fnmatchcase(name, pattern.lower()) for name in names for pattern in patterns)


def make_provider(settings: Settings) -> ChatProvider:
    """The embedded model, or the remote provider with the embedded model beside it when it is installed."""
    try:
        embedded = LocalProvider(settings.model_path, settings.max_tokens, settings.temperature)
    except LocalModelMissing as missing:
        logger.warning("embedded model unavailable: %s", missing)
        if settings.provider_kind == "local":
            return UnavailableProvider(str(missing))
        embedded = None
    if settings.provider_kind == "local" and embedded is not None:
        return embedded
    remote = OpenAIProvider(
        base_url=settings.base_url,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        model=settings.model,
        idle_limit=settings.idle_limit,
        temperature=settings.temperature,
    )
    return WithEmbeddedModel(remote, embedded) if embedded else remote
