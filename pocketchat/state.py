"""The process-wide resources, made once in the app's lifespan and reached through `app.state.chat`."""

import asyncio
import logging
from typing import Any

from fastapi import FastAPI
from pocketflow import AsyncFlow

from pocketchat import protocol
from pocketchat.accounts import Accounts
from pocketchat.background import Background, cancel_and_wait
from pocketchat.cluster import Coordinator, make_coordinator
from pocketchat.conversations import Conversation, Hub
from pocketchat.documents import Library
from pocketchat.errors import ProviderError
from pocketchat.flows import ChatFlow, FlowFactory
from pocketchat.images import Images
from pocketchat.jobs import Jobs
from pocketchat.limits import UPLOADS_AT_ONCE, LocalGauge
from pocketchat.metrics import Metrics
from pocketchat.presses import handlers_of
from pocketchat.records import ConversationRecord
from pocketchat.settings import Settings
from pocketchat.store import Store
from pocketchat.tools.catalog import Catalog
from pocketchat.transfer.imports import Imports
from utils.llm_stream import ChatProvider

logger = logging.getLogger("pocketchat")


class AppState:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: ChatProvider,
        flows: dict[str, ChatFlow],
        indexing: FlowFactory,
    ) -> None:
        """`flows` and `indexing` are flow.py's (main.py hands them over): a turn's flows by name, and a
        document's indexing."""
        self.settings = settings
        self.store = store
        self.provider = provider
        # The flows people may pick (--flows; --flow always), each built once: PocketFlow runs each turn on
        # copies of its nodes, so turns share it safely.
        offered = [settings.flow, *(name for name in settings.flows or flows if name != settings.flow)]
        self.flows = {name: flows[name] for name in offered}
        self.built: dict[str, AsyncFlow] = {name: flow.create(settings) for name, flow in self.flows.items()}
        self.flow = self.built[settings.flow]  # the deployment's default
        self.press_handlers = handlers_of(list(self.built.values()))  # a step's button: its node's on_press
        self.hub = Hub(store)
        self.coordinator: Coordinator = make_coordinator(settings, self.hub, store)
        self.hub.coordinator = self.coordinator  # asked for turn logs, and of conversations elsewhere
        self.limits = self.coordinator.limits  # counted here, or in Redis across replicas
        self.uploading = LocalGauge(UPLOADS_AT_ONCE)  # a user's uploads coming in to this process now
        self.metrics = Metrics(lambda: sum(1 for turn in self.hub.running_turns if turn.task is not None))
        store.timing = self.metrics.store_writes.observe
        # What a user's input sets the cost of (reading files, calculating) runs in these, within budgets.
        self.jobs = Jobs(
            settings.job_workers,
            settings.job_workers_per_user,
            settings.job_seconds,
            settings.job_memory_mb * 1_000_000,
        )
        self.documents = Library(settings, store, provider, self.metrics, self.jobs, indexing)
        self.documents.tell = self.tell_documents
        self.coordinator.on_documents_removed = self.documents.removed_elsewhere
        self.images = Images(settings, store, provider, self.jobs)
        self.tools = Catalog(settings, store, self.limits, self.jobs)  # built-in tools and the MCP servers
        self.coordinator.on_lag = self.metrics.log_lag.observe
        self.accounts = Accounts(settings, store)  # the access token, the sessions and their sockets
        self.default_model = settings.model
        # Imported conversations whose file names no model get the app's default.
        self.imports = Imports(settings, store, lambda: self.default_model or "", self.coordinator, self.jobs)
        self.imports.gone = self.conversations_gone  # a failed import's conversations: their pages are told
        self._resolving: asyncio.Task[None] | None = None
        self.draining = False  # SIGTERM: the running replies may finish before shutdown stops them
        self._tasks = Background()

    async def start(self) -> None:
        await self.coordinator.start()
        await self.documents.start()
        await self.accounts.start()
        await self.tools.start()
        await self.imports.sweep()
        self._tasks.keep("the session watch", self.accounts.close_sockets_of_dead_sessions)

    def flow_for(self, record: ConversationRecord) -> AsyncFlow:
        """The flow a conversation's turns run: its own, if it picked one still offered; else the default."""
        return self.built.get(record.flow) or self.flow

    def stopped(self) -> str | None:
        """Which background work of this process ended, if any did: it cannot serve as it should."""
        parts = [self._tasks.failure, self.coordinator.stopped]
        return "; ".join(part for part in parts if part) or None

    async def new_conversation(self, owner: str) -> Conversation:
        """A new conversation. Its model is the provider's default when known; a new chat never waits
        for the provider to say which (an unanswering one would hold `ready` for the idle limit)."""
        await self.limits.take_conversation(owner)
        if self.default_model is None:
            self.resolve_default_model()
        return self.hub.create(owner, self.default_model or "", self.settings.system_prompt)

    def conversations_gone(self, conversation_ids: list[str]) -> None:
        """They were deleted: their sockets here and on every other replica are told (`deleted`), and let go."""
        for conversation_id in conversation_ids:
            self.hub.gone(conversation_id)
        self.coordinator.deleted(conversation_ids)

    def tell_documents(self, conversation_id: str, frame: dict[str, Any]) -> None:
        """A `document` frame, to the conversation's sockets here and on every other replica."""
        if (conversation := self.hub.live(conversation_id)) is not None:
            conversation.tell_document(frame)
        self.coordinator.documents_changed(conversation_id, frame)

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
                    self.store.update_conversation(conversation.record, ["model"])
                conversation.broadcast(protocol.conversation(conversation.record))

    async def aclose(self) -> None:
        """Stop what is streaming so its partial replies are stored, then release the resources."""
        await self._tasks.aclose()
        if self._resolving is not None:
            await cancel_and_wait([self._resolving])
        tasks = [turn.task for turn in self.hub.running_turns if turn.task is not None]
        if self.draining and tasks:
            # A rolling restart: the sockets were closed with 1012 and reconnect to another replica,
            # which follows these replies from the shared log while they finish here.
            logger.info("draining: %d replies may finish for up to %g s", len(tasks), self.settings.drain_timeout)
            await asyncio.wait(tasks, timeout=self.settings.drain_timeout)
        for turn in self.hub.running_turns:
            turn.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.imports.aclose()
        await self.documents.aclose()
        await self.tools.aclose()
        await self.jobs.aclose()
        await self.provider.aclose()
        await self.coordinator.aclose()
        await self.store.close()


def chat_state(app: FastAPI) -> AppState:
    return app.state.chat
