"""PocketChat's web app, wired together: settings, the process-wide resources, the HTTP routes
(`api.py`) and the `/ws` WebSocket (`chat_socket.py`), whose turns run the flow (`turns.py`).

Run it with `python main.py` (see `python main.py --help` for every setting).
"""

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from api import invalid_request, router
from chat_socket import chat_socket
from state import AppState
from utils.providers import make_provider
from utils.settings import Settings
from utils.store import Store

logger = logging.getLogger("pocketchat")
HERE = Path(__file__).parent
STARTUP_MODEL_WAIT = 2.0  # seconds


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
        if state.default_model is None:
            # Most providers name their default model in milliseconds: the first page then shows it at
            # once. One that does not answer delays start-up briefly, never a `ready`.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.resolve_default_model()), STARTUP_MODEL_WAIT)
        logger.info("serving with provider %s, database %s", provider.kind, settings.db_path)
        try:
            yield
        finally:
            await asyncio.gather(warming, return_exceptions=True)
            await state.aclose()

    app = FastAPI(title="PocketChat", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts)
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, invalid_request)
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
        # A socket that reads nothing never finishes closing; shutdown waits for it no longer than
        # for any one frame, then stops the turns and stores their replies.
        timeout_graceful_shutdown=max(1, round(settings.send_timeout)),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
