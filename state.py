"""The process-wide resources, made once in the app's lifespan and reached through `app.state.chat`."""

import asyncio
import logging

from fastapi import FastAPI

from utils import protocol
from utils.conversations import Conversation, Hub
from utils.llm_stream import ChatProvider
from utils.protocol import ProviderError
from utils.settings import Settings
from utils.store import Store

logger = logging.getLogger("pocketchat")


class AppState:
    def __init__(self, settings: Settings, store: Store, provider: ChatProvider) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.hub = Hub(store)
        self.default_model = settings.model
        self._resolving: asyncio.Task[None] | None = None

    def new_conversation(self) -> Conversation:
        """A new conversation. Its model is the provider's default when known; a new chat never waits
        for the provider to say which (an unanswering one would hold `ready` for the idle limit)."""
        if self.default_model is None:
            self.resolve_default_model()
        return self.hub.create(self.default_model or "", self.settings.system_prompt)

    def resolve_default_model(self) -> asyncio.Task[None]:
        """Ask the provider for its default model in the background, one request at a time."""
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.create_task(self._resolve_default_model())
        return self._resolving

    async def _resolve_default_model(self) -> None:
        try:
            model = await self.provider.default_model()
        except ProviderError as error:
            # Asked again for the next new chat; a turn meanwhile resolves it itself, showing the error.
            logger.warning("could not get the provider's default model: %s", error.message)
            return
        self.default_model = model
        # Conversations made while it was unknown get it now, and their sockets are told.
        for conversation in self.hub.conversations:
            if not conversation.record.model:
                conversation.record.model = model
                if conversation.stored:
                    self.store.update_conversation(conversation.record)
                conversation.broadcast(protocol.conversation(conversation.record))

    async def aclose(self) -> None:
        """Stop what is streaming so its partial replies are stored, then release the resources."""
        if self._resolving is not None:
            self._resolving.cancel()
        turns = self.hub.running_turns
        for turn in turns:
            turn.stop.set()
        await asyncio.gather(*(t.task for t in turns if t.task is not None), return_exceptions=True)
        await self.provider.aclose()
        self.store.close()


def chat_state(app: FastAPI) -> AppState:
    return app.state.chat
