"""PocketChat's web app: the page, a small JSON API and the `/ws` WebSocket that runs chat turns.

Run it with `python main.py` (see `python main.py --help` for every setting).
"""

import asyncio
import logging
import re
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import APIRouter, FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import PlainTextResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.websockets import WebSocketDisconnect

from flow import create_chat_flow
from utils import protocol
from utils.conversations import Conversation, Hub, Turn
from utils.export import conversation_markdown
from utils.llm_stream import ChatProvider
from utils.protocol import ProtocolError, ProviderError
from utils.providers import make_provider
from utils.settings import Settings
from utils.store import Store
from utils.turn_log import TurnLog

logger = logging.getLogger("pocketchat")
HERE = Path(__file__).parent
CHECKPOINT_SECONDS = 2.0
templates = Jinja2Templates(directory=HERE / "templates")


class AppState:
    """The process-wide resources, made in the lifespan and reached through `app.state.chat`."""

    def __init__(self, settings: Settings, store: Store, provider: ChatProvider) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.hub = Hub(store)

    async def new_conversation(self) -> Conversation:
        model = self.settings.model
        if model is None:
            try:
                model = await self.provider.default_model()
            except ProviderError:
                model = ""  # resolved again when the first turn runs, where the error is shown
        return self.hub.create(model, self.settings.system_prompt)


def chat_state(app: FastAPI) -> AppState:
    return app.state.chat


# ---- turns -------------------------------------------------------------------------------------


def start_turn(state: AppState, conversation: Conversation, turn: Turn) -> None:
    turn.task = asyncio.create_task(run_turn(state, conversation, turn))


async def run_turn(state: AppState, conversation: Conversation, turn: Turn) -> None:
    """Run the flow for one turn, then close its log with `turn_end`, whatever happened."""
    settings = state.settings
    shared: dict[str, Any] = {
        "conversation": conversation,
        "turn": turn,
        "channel": turn.log,
        "llm": state.provider,
        "store": state.store,
        "context_budget": settings.context_budget,
        "max_tokens": settings.max_tokens,
    }
    # The user message and an empty reply marked `streaming` are queued for the database first, so a
    # crash leaves a turn that start-up marks interrupted. Waiting for that write would delay the
    # first chunk under load; every later write of the turn is queued after it anyway.
    opened = state.hub.open_turn(conversation, turn)
    checkpoints = asyncio.create_task(checkpoint_reply(state.store, conversation.id, turn))
    try:
        await create_chat_flow(settings.retries, settings.retry_wait).run_async(shared)
    except Exception:
        logger.exception("turn %s failed", turn.id)
        await fail_turn(state, conversation, turn)
    finally:
        checkpoints.cancel()
        await asyncio.gather(opened, return_exceptions=True)  # a failed write is logged by the store
        reply = turn.reply
        stats = {k: reply.meta.get(k) for k in ("model", "usage", "ttft_ms", "tokens_per_second")}
        turn.log.append(protocol.turn_end(turn.id, reply.status, reply.id, stats))
        conversation.end(turn)
        state.hub.release(conversation)
        logger.info(
            "turn %s conversation %s… status=%s chunks=%d ttft_ms=%s duration_ms=%d usage=%s",
            turn.id,
            conversation.id[:6],
            reply.status,
            turn.log.seq,
            stats["ttft_ms"],
            (time.monotonic() - turn.started_at) * 1000,
            (stats["usage"] or {}).get("completion_tokens"),
        )


async def fail_turn(state: AppState, conversation: Conversation, turn: Turn) -> None:
    """Record a turn a bug cut short, keeping what streamed, and tell the client."""
    turn.reply_so_far()
    turn.reply.status, turn.reply.error = "error", "PocketChat failed while writing this reply; see the server log."
    if not any(message is turn.reply for message in conversation.history):
        conversation.history.append(turn.reply)
    turn.log.append(protocol.error(ProtocolError(turn.reply.error, turn.id)))
    try:
        await state.store.save_messages(conversation.id, [turn.reply])
    except Exception:
        logger.exception("could not record failed turn %s", turn.id)


async def checkpoint_reply(store: Store, conversation_id: str, turn: Turn) -> None:
    """Save the reply so far every few seconds, so that a crash loses little of it."""
    saved_seq = 0
    while True:
        await asyncio.sleep(CHECKPOINT_SECONDS)
        if turn.log.seq != saved_seq and turn.reply.status == "streaming":
            saved_seq = turn.log.seq
            store.checkpoint(conversation_id, turn.reply_so_far())


# ---- the WebSocket -----------------------------------------------------------------------------


class Client:
    """One WebSocket: sends frames in order and follows the logs of the turns it should see."""

    def __init__(self, websocket: WebSocket, state: AppState) -> None:
        self.websocket = websocket
        self.state = state
        self.conversation: Conversation | None = None
        self._sending = asyncio.Lock()
        self._following: asyncio.Task[None] | None = None

    async def send(self, frame: dict[str, Any]) -> None:
        await self._send_text(protocol.encode(frame))

    async def _send_text(self, text: str) -> None:
        # The lock is FIFO: frames leave in the order their sends began.
        async with self._sending:
            await self.websocket.send_text(text)

    def follow(self, log: TurnLog, after_seq: int) -> None:
        self._following = asyncio.create_task(self._follow(log, after_seq, self._following))

    async def _follow(self, log: TurnLog, after_seq: int, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await previous  # the previous turn's frames go first; cancelling this cancels it too
        try:
            async for text in log.follow(after_seq):
                await self._send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the socket is gone; the receive loop cleans up

    def attach(self, conversation: Conversation) -> None:
        self.detach()
        self.conversation = conversation
        conversation.subscribers.add(self)

    def detach(self) -> None:
        if self._following is not None:
            self._following.cancel()
            self._following = None
        if self.conversation is not None:
            self.conversation.subscribers.discard(self)
            self.state.hub.release(self.conversation)
            self.conversation = None

    async def hello(self, session_id: str | None) -> Conversation:
        hub = self.state.hub
        conversation = await hub.open(session_id) if session_id else await self.state.new_conversation()
        self.attach(conversation)
        frame, log, after_seq = conversation.ready_frame(self.state.provider.describe())
        if log is not None:
            self.follow(log, after_seq)
        await self.send(frame)
        return conversation

    async def handle(self, frame: protocol.ClientFrame) -> None:
        if isinstance(frame, protocol.Hello):
            await self.hello(frame.session_id)
            return
        conversation = self.conversation or await self.hello(None)
        if isinstance(frame, protocol.Message):
            start_turn(self.state, conversation, conversation.begin_message(frame.content))
        elif isinstance(frame, protocol.Regenerate):
            start_turn(self.state, conversation, conversation.begin_regenerate())
        elif isinstance(frame, protocol.Edit):
            start_turn(self.state, conversation, conversation.begin_edit(frame.message_id, frame.content))
        elif isinstance(frame, protocol.Stop):
            turn = conversation.turn
            # A stop that arrives after its turn ended is harmless and ignored.
            if turn is not None and frame.turn_id in (None, turn.id):
                turn.stop.set()


def origin_allowed(websocket: WebSocket, allowed: list[str]) -> bool:
    """Browsers send Origin: only the page's own origin and the configured ones may connect."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True  # not a browser: no page of another site can be behind it
    return urlsplit(origin).netloc == websocket.headers.get("host") or origin.rstrip("/") in allowed


async def chat_socket(websocket: WebSocket) -> None:
    state = chat_state(websocket.app)
    if not origin_allowed(websocket, state.settings.allowed_origins):
        logger.warning("refused a WebSocket from origin %s", websocket.headers.get("origin"))
        await websocket.close(code=1008)
        return
    await websocket.accept()
    client = Client(websocket, state)
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            try:
                await client.handle(protocol.parse_client_frame(message, state.settings.max_frame_bytes))
            except ProtocolError as error:
                await client.send(protocol.error(error))
    except WebSocketDisconnect:
        pass
    except Exception:
        logger.exception("WebSocket handler failed")
        await websocket.close(code=1011)
    finally:
        client.detach()


# ---- HTTP --------------------------------------------------------------------------------------

router = APIRouter()


# Defence in depth for the page: even markup that got past the sanitizer can neither run inline
# script nor load anything from another origin.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/")
async def page(request: Request) -> Any:
    return templates.TemplateResponse(request, "index.html", headers=PAGE_HEADERS)


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    state = chat_state(request.app)
    return {"status": "ok", "provider": state.provider.kind, "running_turns": len(state.hub.running_turns)}


@router.get("/api/models")
async def models(request: Request) -> dict[str, Any]:
    provider = chat_state(request.app).provider
    try:
        return {"models": await provider.list_models(), "provider": provider.describe()}
    except ProviderError as error:
        raise HTTPException(502, error.message) from None


@router.get("/api/conversations")
async def list_conversations(request: Request) -> dict[str, Any]:
    records = await chat_state(request.app).store.list_conversations()
    return {"conversations": [record.to_wire() for record in records]}


@asynccontextmanager
async def borrowed(state: AppState, conversation_id: str) -> AsyncIterator[Conversation]:
    """The conversation for one HTTP request (404 if there is none), shared with its sockets."""
    try:
        async with state.hub.borrow(conversation_id) as conversation:
            yield conversation
    except protocol.UnknownSession as error:
        raise HTTPException(404, error.message) from None


@router.get("/api/conversations/{conversation_id}")
async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    async with borrowed(chat_state(request.app), conversation_id) as conversation:
        return {**conversation.record.to_wire(), "messages": [m.to_wire() for m in conversation.history]}


class ConversationChanges(BaseModel):
    title: str | None = Field(None, min_length=1, max_length=200)
    model: str | None = Field(None, min_length=1, max_length=200)
    system_prompt: str | None = Field(None, max_length=20_000)


@router.patch("/api/conversations/{conversation_id}")
async def change_conversation(request: Request, conversation_id: str, changes: ConversationChanges) -> dict[str, Any]:
    """Rename, or change the model or system prompt of later turns; attached sockets are told."""
    state = chat_state(request.app)
    async with borrowed(state, conversation_id) as conversation:
        record = conversation.record
        for name, value in changes.model_dump(exclude_none=True).items():
            setattr(record, name, value.strip() if name == "title" else value)
        await state.hub.ensure_stored(conversation)
        await state.store.update_conversation(record)
        await conversation.broadcast(protocol.conversation(record))
        return record.to_wire()


@router.delete("/api/conversations/{conversation_id}", status_code=204)
async def delete_conversation(request: Request, conversation_id: str) -> None:
    """Delete a conversation: its running turn is stopped and its sockets are told."""
    state = chat_state(request.app)
    async with borrowed(state, conversation_id) as conversation:
        if (turn := conversation.turn) is not None and turn.task is not None:
            turn.stop.set()
            await asyncio.shield(turn.task)
        await conversation.broadcast(protocol.deleted(conversation.id))
        for subscriber in list(conversation.subscribers):
            subscriber.detach()
        state.hub.forget(conversation.id)
        if conversation.stored:
            await state.store.delete_conversation(conversation.id)


@router.get("/api/conversations/{conversation_id}/export.md", response_class=PlainTextResponse)
async def export_conversation(request: Request, conversation_id: str) -> PlainTextResponse:
    async with borrowed(chat_state(request.app), conversation_id) as conversation:
        markdown = conversation_markdown(conversation.record, conversation.history)
    filename = f"pocketchat-{conversation.id[:8]}.md"
    return PlainTextResponse(
        markdown,
        media_type="text/markdown; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


# ---- the app -----------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.db_path)
        interrupted = store.open()
        if interrupted:
            logger.warning("marked %d replies cut short by an earlier crash as interrupted", interrupted)
        provider = make_provider(settings)
        app.state.chat = state = AppState(settings, store, provider)
        warming = asyncio.create_task(provider.warm_up())
        logger.info("serving with provider %s, database %s", provider.kind, settings.db_path)
        try:
            yield
        finally:
            # Stop what is streaming so its partial replies are stored, then release the resources.
            turns = state.hub.running_turns
            for turn in turns:
                turn.stop.set()
            await asyncio.gather(*(t.task for t in turns if t.task is not None), return_exceptions=True)
            await asyncio.gather(warming, return_exceptions=True)
            await provider.aclose()
            store.close()

    app = FastAPI(title="PocketChat", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts)
    app.include_router(router)
    app.add_api_websocket_route("/ws", chat_socket)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    # The page's libraries, installed from the npm registry by `make` (package-lock.json pins them).
    app.mount("/vendor", StaticFiles(directory=HERE / "node_modules", check_dir=False), name="vendor")
    return app


class ShortenConversationIds(logging.Filter):
    """Access log lines name a conversation by its first six characters: a whole id grants access to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                CONVERSATION_PATH.sub(r"\1\2…", arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True


CONVERSATION_PATH = re.compile(r"(/api/conversations/)([\w-]{6})[\w-]+")


def main(argv: list[str]) -> None:
    settings = Settings(_cli_parse_args=argv)  # type: ignore[call-arg]  # pydantic-settings' init option
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.access").addFilter(ShortenConversationIds())
    # The HTTP client logs every request with its full URL, which may carry credentials; the turn's
    # own log line says what happened.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        # Frames above our own limit get a `too_large` error; far larger ones are refused by uvicorn.
        ws_max_size=settings.max_frame_bytes * 4,
        # Chat frames are small: compressing each one cost more CPU than it saved bandwidth.
        ws_per_message_deflate=False,
        log_level=settings.log_level.lower(),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
