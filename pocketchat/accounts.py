"""Accounts: the access token of `--auth token` and the sessions signing in with it gives, below the web.

The database keeps the token's hash only and each session by its id's hash; a browser carries its session
id in a cookie signed with a key the database also keeps. Revoking a session closes its open sockets here
at once and on other replicas within seconds (the session watch). How a request shows who it is (cookies,
proxy headers, origins) is the web's part: pocketchat/web/sign_in.py.
"""

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from typing import Protocol

from pocketchat.hashes import token_hash
from pocketchat.settings import Settings
from pocketchat.store import Store

logger = logging.getLogger("pocketchat")

LOCAL_USER = "local"
ACCESS_TOKEN_HASH = "access_token_hash"  # the name the database keeps a generated token's hash under
SESSION_CACHE_SECONDS = 5.0  # a session checked this recently is not read again (revocation: see below)
SESSION_CHECK_SECONDS = 5.0  # how soon a socket notices its session was revoked elsewhere


class SignedInSocket(Protocol):
    def sign_out(self) -> None:
        """Close with 4401: the page shows the sign-in page."""


class Accounts:
    """Checks the access token, makes and revokes sessions, and keeps the secrets they need."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self._checked: dict[str, tuple[str, float]] = {}  # session id: (user, when)
        self._sockets: dict[str, set[SignedInSocket]] = {}  # by session id

    async def start(self) -> None:
        """Load (or make, on first start) the key that signs session cookies, and the access token."""
        self._key = (await self.store.secret("session_key", lambda: secrets.token_urlsafe(32))).encode()
        fixed = self.settings.token
        self._fixed_token = fixed.get_secret_value() if fixed is not None else None
        # The token to show in the sign-in link now: --token, or one made at this first start (the
        # database keeps only its hash, so a token made earlier cannot be shown: --login-link makes another).
        self.token: str | None = None
        if self.settings.auth_mode == "token":
            self.token = self._fixed_token or await first_access_token(self.store)

    # ---- the token -------------------------------------------------------------------------------

    async def token_matches(self, token: str) -> bool:
        """Whether `token` is --token, or the one whose hash the database keeps (read each time: another
        process may have made a new one with --login-link). Compared in constant time, as bytes: a wrong
        guess tells nothing of how close it came."""
        if self._fixed_token is not None:
            return hmac.compare_digest(token.encode(), self._fixed_token.encode())
        kept = await self.store.read_secret(ACCESS_TOKEN_HASH)
        return kept is not None and hmac.compare_digest(token_hash(token).encode(), kept.encode())

    # ---- sessions ----------------------------------------------------------------------------------

    async def new_session(self) -> str:
        """A new session for the local user; the signed cookie value that carries it."""
        session_id = secrets.token_urlsafe(24)
        await self.store.create_session(session_id, LOCAL_USER, self.settings.session_days * 86400)
        return f"{session_id}.{self._signature(session_id)}"

    async def session_of(self, cookie: str) -> tuple[str | None, str] | None:
        """The user (None: revoked or expired) and the session id a cookie carries; None if it is not ours."""
        if (session_id := self._unsign(cookie)) is None:
            return None
        return await self._session_user(session_id), session_id

    def _signature(self, session_id: str) -> str:
        return hmac.new(self._key, session_id.encode(), hashlib.sha256).hexdigest()

    def _unsign(self, cookie: str) -> str | None:
        """The session id a cookie carries, if its signature is ours. A cookie that is not even ASCII
        (any service on this host can plant one: cookies ignore ports) is no session, like a missing one."""
        if not cookie.isascii():
            return None
        session_id, _, signature = cookie.partition(".")
        return session_id if hmac.compare_digest(signature, self._signature(session_id)) else None

    async def _session_user(self, session_id: str) -> str | None:
        cached = self._checked.get(session_id)
        if cached and time.monotonic() - cached[1] < SESSION_CACHE_SECONDS:
            return cached[0]
        user = await self.store.session_user(session_id)
        if user is None:
            self._checked.pop(session_id, None)
        else:
            self._checked[session_id] = (user, time.monotonic())
        return user

    # ---- sessions and their sockets -------------------------------------------------------------

    def add_socket(self, session_id: str, socket: SignedInSocket) -> None:
        self._sockets.setdefault(session_id, set()).add(socket)

    def remove_socket(self, session_id: str, socket: SignedInSocket) -> None:
        if (sockets := self._sockets.get(session_id)) is not None:
            sockets.discard(socket)
            if not sockets:
                del self._sockets[session_id]

    async def sign_out(self, session_id: str) -> None:
        """Revoke a session; its sockets on this process close now (on another, within seconds)."""
        await self.store.revoke_sessions(session_id)
        self._ended(session_id)

    def _ended(self, session_id: str) -> None:
        self._checked.pop(session_id, None)
        for socket in self._sockets.pop(session_id, set()):
            socket.sign_out()

    async def close_sockets_of_dead_sessions(self) -> None:
        """A round of the session watch. Sessions are revoked by another tab's sign-out, by
        --revoke-sessions in another process, or expire."""
        await asyncio.sleep(SESSION_CHECK_SECONDS)
        if not self._sockets:
            return
        try:
            dead = await self.store.dead_sessions(list(self._sockets))
        except Exception:
            logger.exception("could not check the sessions of open sockets")
            return
        for session_id in dead:
            self._ended(session_id)


async def first_access_token(store: Store) -> str | None:
    """On first start, a new access token (192 random bits), of which the database keeps the hash; None
    if the database has one already (another replica may have made it a moment ago)."""
    token = secrets.token_urlsafe(24)
    kept = await store.secret(ACCESS_TOKEN_HASH, lambda: token_hash(token))
    return token if kept == token_hash(token) else None


async def new_access_token(store: Store) -> str:
    """A new access token, replacing the one before (`--login-link`): the database keeps its hash."""
    token = secrets.token_urlsafe(24)
    await store.set_secret(ACCESS_TOKEN_HASH, token_hash(token))
    return token
