"""PocketChat, wired together. A message on the `/ws` WebSocket starts a turn, and a turn runs a flow
of flow.py (`--flow`, default `chat`) on a shared store; its nodes (nodes.py) stream the reply into the
turn's log, which every socket on the conversation follows.

This file makes the app: the settings, the process-wide resources (store, provider, coordinator of
replicas: `pocketchat.state.AppState`), the HTTP routes and sign-in (`pocketchat/web/`), and the
socket (`pocketchat.web.socket`), whose turns run the flow (`pocketchat.turns.run_turn`).

Run it with `python main.py` (see `python main.py --help` for every setting). Two commands work on the
database instead: `python main.py --login-link` makes a new sign-in link for `--auth token`, and
`python main.py --revoke-sessions` signs every browser out.
"""

import asyncio
import contextlib
import gc
import logging
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.middleware.trustedhost import TrustedHostMiddleware

from flow import FLOWS, create_indexing_flow
from pocketchat.accounts import new_access_token
from pocketchat.providers import make_provider
from pocketchat.settings import Settings
from pocketchat.state import AppState
from pocketchat.store import make_store
from pocketchat.tools.mcp_config import McpConfigError, load_config
from pocketchat.web import assets, documents, images, login, memory, search, shares, sign_in, transfer
from pocketchat.web.body_limit import BodyLimit
from pocketchat.web.routes import invalid_request, router
from pocketchat.web.socket import chat_socket

logger = logging.getLogger("pocketchat")
HERE = Path(__file__).parent
COMMANDS = ("--login-link", "--revoke-sessions")
STARTUP_MODEL_WAIT = 2.0  # seconds


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = make_store(settings)
        # With replicas, a reply marked streaming may be another replica's running turn.
        interrupted = await store.open(sweep_streaming=not settings.clustered)
        if interrupted:
            logger.warning("marked %d replies cut short by an earlier crash as interrupted", interrupted)
        provider = make_provider(settings)
        app.state.chat = state = AppState(settings, store, provider, FLOWS, create_indexing_flow)
        app.state.sign_in = sign_in.SignIn(settings, state.accounts, state.limits)
        await state.start()
        announce_sign_in(settings, state.accounts.token)
        warming = asyncio.create_task(provider.warm_up())
        if state.default_model is None:
            # Most providers name their default model in milliseconds: the first page then shows it at
            # once. One that does not answer delays start-up briefly, never a `ready`.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.resolve_default_model()), STARTUP_MODEL_WAIT)
        where = "PostgreSQL" if settings.database_url else settings.db_path  # the URL may hold a password
        logger.info("serving with provider %s, database %s, %s", provider.kind, where, type(state.coordinator).__name__)
        try:
            yield
        finally:
            await asyncio.gather(warming, return_exceptions=True)
            await state.aclose()

    app = FastAPI(title="PocketChat", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    # The last added runs first: a request for a host we do not serve is refused before sign-in, and a
    # body over its limit before anything reads it.
    app.add_middleware(assets.CompressPage)
    app.add_middleware(sign_in.SignInMiddleware)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts)
    app.add_middleware(
        BodyLimit,
        upload_bytes=settings.limit_document_bytes,
        image_bytes=settings.limit_image_bytes,
        import_bytes=settings.limit_import_bytes,
    )
    app.include_router(login.router)
    app.include_router(router)
    app.include_router(documents.router)
    app.include_router(images.router)
    app.include_router(search.router)
    app.include_router(transfer.router)
    app.include_router(shares.router)
    app.include_router(memory.router)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_api_websocket_route("/ws", chat_socket)
    app.mount("/static", assets.page_files(), name="static")
    # The page's libraries, installed from the npm registry by `make` (package-lock.json pins them).
    app.mount("/vendor", assets.library_files(), name="vendor")
    return app


class HideSecretsInAccessLog(logging.Filter):
    """Access log lines show no sign-in or share link token, and name a conversation by its first six
    characters (with auth none, a whole id is enough to read it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._hide(arg) for arg in record.args)
        return True

    @staticmethod
    def _hide(arg: object) -> object:
        if not isinstance(arg, str):
            return arg
        arg = SHARE_PATH.sub(r"\1[hidden]", login.access_log_without_secrets(arg))
        return CONVERSATION_PATH.sub(r"\1\2…", arg)


CONVERSATION_PATH = re.compile(r"(/api/conversations/)([\w-]{6})[\w-]+")
SHARE_PATH = re.compile(r"(/s/|/api/shared/)[^?#\s]+")  # a share link's token: the link itself


def sign_in_link(settings: Settings, token: str) -> str:
    host = settings.host
    if host in ("0.0.0.0", "::"):
        # Bound to every interface: the first name the server answers to (beyond loopback, it answers
        # only to --allowed-hosts).
        named = [name for name in settings.allowed_hosts if "*" not in name]
        host = named[0].strip("[]") if named else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}/login?token={token}"


def announce_sign_in(settings: Settings, token: str | None) -> None:
    """Show the sign-in link, on the console only: a log collected elsewhere never holds the token. A
    token made on an earlier start cannot be shown (the database keeps its hash): --login-link makes
    a new one."""
    if settings.auth_mode != "token":
        return
    if token is not None and sys.stderr.isatty():
        print(f"\n    Sign in to PocketChat: {sign_in_link(settings, token)}\n", file=sys.stderr, flush=True)
    else:
        logger.info("sign-in is on (--auth token); `python main.py --login-link` makes a new sign-in link")


async def run_command(command: str, settings: Settings) -> None:
    """--login-link or --revoke-sessions: work on the database, then exit."""
    store = make_store(settings)
    await store.open(sweep_streaming=False)
    try:
        if command == "--login-link":
            if settings.token is not None:
                token = settings.token.get_secret_value()
            else:
                token = await new_access_token(store)
                print("A new access token: the link before this one no longer signs in.", file=sys.stderr)
            print(sign_in_link(settings, token))
        else:
            revoked = await store.revoke_sessions()
            print(f"Revoked {revoked} sessions: every browser must sign in again (open sockets close within seconds).")
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    # Two commands that work on the database (with the settings that say where it is) instead of serving.
    commands = [arg for arg in argv if arg in COMMANDS]
    settings = Settings(_cli_parse_args=[arg for arg in argv if arg not in COMMANDS])  # type: ignore[call-arg]
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if commands:
        asyncio.run(run_command(commands[0], settings))
        return
    if problem := settings.startup_problem():
        sys.exit(problem)
    for name in (settings.flow, *settings.flows):
        if name not in FLOWS:
            sys.exit(f"--flow or --flows: {name!r} is not a flow of flow.py; it has: {', '.join(FLOWS)}.")
    if settings.mcp_config is not None:
        try:
            load_config(settings.mcp_config)  # read again at start-up; refused here with the reason
        except McpConfigError as error:
            sys.exit(str(error))
    if settings.auth_mode == "none" and not settings.on_loopback:
        logger.warning(
            "serving %s with no sign-in (--insecure-no-auth): anyone who reaches it reads everything", settings.host
        )
    logging.getLogger("uvicorn.access").addFilter(HideSecretsInAccessLog())
    # The HTTP client logs every request with its full URL, which may carry credentials; the turn's
    # own log line says what happened.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # Frames above our own limit get a `too_large` error; far larger ones are refused by uvicorn.
        ws_max_size=settings.max_frame_bytes * 4,
        # Chat frames are small: compressing each one cost more CPU than it saved bandwidth.
        ws_per_message_deflate=False,
        log_level=settings.log_level.lower(),
        # Forwarded headers are read by the sign-in, from --trusted-proxies only; uvicorn's own reading
        # would replace the peer address that decides whether to trust them.
        proxy_headers=False,
        # A socket that reads nothing never finishes closing; shutdown waits for it no longer than
        # for any one frame, then stops the turns and stores their replies.
        timeout_graceful_shutdown=max(1, round(settings.send_timeout)),
    )
    tune_garbage_collector()
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises it again after a clean Ctrl+C shutdown
        DrainingServer(config, app).run()


def tune_garbage_collector() -> None:
    """Keep the garbage collector's pauses off the event loop's hot path (docs/benchmarks.md). What the
    imports made (about 144,000 objects: a full collection took 85 ms) is frozen, never scanned again;
    and a young collection waits for 10,000 new objects rather than 700. Under a burst of 300 streams
    the collector took 2.7 s of the app's CPU in 165 ms pauses; after this, 0.6 s."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


class DrainingServer(uvicorn.Server):
    """Uvicorn, telling the app how it is asked to stop: SIGTERM (a rolling restart) drains, letting
    the running replies finish for up to --drain-timeout; Ctrl+C stops them at once, storing them."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and (state := getattr(self.app.state, "chat", None)) is not None:
            state.draining = True
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main(sys.argv[1:])
