"""Sign-in: who is asking, decided for every HTTP request and WebSocket handshake before any route,
socket or node runs (`--auth`):

- `none`: everyone is the one local user (loopback only, unless --insecure-no-auth);
- `token`: one access token, as Jupyter does it; signing in with it gives a session cookie, recorded
  in the database so that signing out (or --revoke-sessions) ends it (the token and the sessions are
  pocketchat/accounts.py's; this module reads them off requests);
- `header`: an authenticating proxy names the user in a header, believed only from --trusted-proxies.

State-changing requests from a page of another origin are refused here too.
"""

import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pocketchat.accounts import LOCAL_USER, Accounts
from pocketchat.limits import Limits
from pocketchat.settings import Settings

logger = logging.getLogger("pocketchat")

SESSION_COOKIE = "pocketchat_session"
VISITOR = "pocketchat.visitor"  # the scope key the middleware leaves for routes and sockets
PUBLIC_PATHS = {"/login", "/healthz", "/livez", "/metrics"}  # none shows a secret or a conversation
# A share link's page and snapshot: each shows what its token names, and nothing else (web/shares.py).
PUBLIC_PREFIXES = ("/static/", "/vendor/", "/s/", "/api/shared/")
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
SIGNED_OUT = 4401  # the WebSocket close code for "sign in first"; the page shows the sign-in page
MAX_USER_LENGTH = 256


@dataclass
class Visitor:
    """Who sent a request: the user (None: not signed in), their session, and where they are."""

    user: str | None
    address: str
    https: bool
    session_id: str | None = None


class ThrottledWarning:
    """A warning logged at most `per_minute` times a minute: thousands of wrong tokens are thousands of
    log lines otherwise. Those held back are counted, and the count said when the next minute starts."""

    def __init__(self, message: str, per_minute: int = 10) -> None:
        self.message = message
        self.per_minute = per_minute
        self._minute_began = -math.inf
        self._logged = self._held = 0

    def warn(self, *args: object) -> None:
        now = time.monotonic()
        if now - self._minute_began >= 60:
            if self._held:
                logger.warning("%d more like the above in that minute, not logged one by one", self._held)
            self._minute_began, self._logged, self._held = now, 0, 0
        if self._logged < self.per_minute:
            self._logged += 1
            logger.warning(self.message, *args)
            if self._logged == self.per_minute:
                logger.warning("more of these this minute are counted, not logged one by one")
        else:
            self._held += 1


class SignIn:
    """Tells who a request is from: its session cookie, or the proxy's header, believed from
    --trusted-proxies only."""

    def __init__(self, settings: Settings, accounts: Accounts, limits: Limits) -> None:
        self.settings = settings
        self.mode = settings.auth_mode
        self.accounts = accounts
        self.limits = limits
        self.proxies = [ipaddress.ip_network(network) for network in settings.trusted_proxies]
        self.wrong_tokens = ThrottledWarning("a wrong sign-in token from %s")

    # ---- who is asking ---------------------------------------------------------------------------

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.proxies)

    async def visitor(self, scope: Scope) -> Visitor:
        headers = Headers(scope=scope)
        peer = scope["client"][0] if scope.get("client") else ""
        from_proxy = self._trusted(peer)
        visitor = Visitor(
            user=None,
            address=self._client_address(peer, headers) if from_proxy else peer,
            https=scope["scheme"] in ("https", "wss") or (from_proxy and _forwarded_https(headers)),
        )
        if self.mode == "none":
            visitor.user = LOCAL_USER
        elif self.mode == "header":
            visitor.user = self._proxy_user(headers) if from_proxy else None
        elif (cookie := _cookie(headers, SESSION_COOKIE)) and (session := await self.accounts.session_of(cookie)):
            visitor.user, visitor.session_id = session
        return visitor

    def _proxy_user(self, headers: Headers) -> str | None:
        """The one user the proxy names. Two names (two headers, or a list in one) mean the proxy added
        its header to one the browser sent rather than replacing it: whichever came first, the browser
        may have chosen it, so nobody is signed in."""
        values = headers.getlist(self.settings.auth_header)
        if len(values) > 1 or any("," in value for value in values):
            logger.warning(
                "refused a request whose %s names more than one user: the proxy must replace that "
                "header, never add to it",
                self.settings.auth_header,
            )
            return None
        name = values[0].strip() if values else ""
        return name if 0 < len(name) <= MAX_USER_LENGTH else None

    def _client_address(self, peer: str, headers: Headers) -> str:
        """The address the proxies say the request came from: the last one in X-Forwarded-For that is
        not a proxy of ours (anything before it, the client could have written itself)."""
        hops = [hop.strip() for hop in headers.get("x-forwarded-for", "").split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else peer


def _forwarded_https(headers: Headers) -> bool:
    """Whether the browser's own connection was https, as the proxies say: the first hop of
    X-Forwarded-Proto (`https, http`: TLS ended at the first proxy) or of RFC 7239 Forwarded
    (`proto=https`), in any case. Read only from a trusted proxy; a browser that forges it only makes
    its own cookie Secure."""
    first_proto = headers.get("x-forwarded-proto", "").split(",")[0].strip()
    if first_proto.lower() == "https":
        return True
    first_hop = headers.get("forwarded", "").split(",")[0]
    for pair in first_hop.split(";"):
        name, _, value = pair.partition("=")
        if name.strip().lower() == "proto":
            return value.strip().strip('"').lower() == "https"
    return False


def _cookie(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def same_origin(headers: Headers, allowed: list[str], websocket: bool = False) -> bool:
    """Whether a browser request comes from the page's own origin (or an allowed one); requests
    without Origin do not come from a page of another site."""
    origin = headers.get("origin")
    if origin is None:
        return True  # not a browser: browsers send Origin with every WebSocket and every unsafe method
    if origin == "null":
        # An opaque origin: a sandboxed iframe, a data: URL, a file, or a page whose Referrer-Policy hid
        # its origin. Refused unless the operator allows "null" explicitly; but the page's own forms
        # (its Referrer-Policy is no-referrer, so Chromium sends null for them) are told apart by their
        # fetch metadata, which no page can forge. WebSocket handshakes carry none: always refused.
        same_site_form = not websocket and headers.get("sec-fetch-site") == "same-origin"
        return "null" in allowed or same_site_form
    origin = origin.lower().rstrip("/")
    return urlsplit(origin).netloc == headers.get("host", "").lower() or origin in allowed


# ---- the middleware ----------------------------------------------------------------------------


class SignInMiddleware:
    """Leaves the `Visitor` in the scope for routes and sockets, and turns away whoever may not pass."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        sign_in: SignIn = scope["app"].state.sign_in
        visitor = scope[VISITOR] = await sign_in.visitor(scope)
        headers = Headers(scope=scope)
        path = scope["path"]
        changes = scope["type"] == "http" and scope["method"] in UNSAFE_METHODS
        if changes and not same_origin(headers, sign_in.settings.allowed_origins):
            logger.warning("refused a %s from another origin", scope["method"])
            await _refuse(403, "Refused: this request came from a page of another site.")(scope, receive, send)
            return
        if visitor.user is not None or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
        elif sign_in.mode == "header":
            # Not from a trusted proxy, or the proxy named nobody: the proxy must do the sign-in.
            await _refuse(403, "Forbidden: sign in through the proxy in front of PocketChat.")(scope, receive, send)
        elif scope["type"] == "websocket":
            await _close_websocket(receive, send)
        elif scope["method"] == "GET" and path == "/":
            await RedirectResponse("/login", status_code=303)(scope, receive, send)
        else:
            await _refuse(401, "Sign in first: open the page and enter the access token.")(scope, receive, send)


def _refuse(status: int, detail: str) -> ASGIApp:
    response = JSONResponse({"detail": detail}, status_code=status)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
        else:
            await response(scope, receive, send)

    return app


async def _close_websocket(receive: Receive, send: Send) -> None:
    """Accept, then close at once with 4401: a browser sees the code (a refused handshake hides it)."""
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": SIGNED_OUT, "reason": "sign in first"})


def visitor_of(request: Request) -> Visitor:
    return request.scope[VISITOR]


def user_of(request: Request) -> str:
    """The signed-in user (the middleware lets only them through to the routes that ask)."""
    user = visitor_of(request).user
    assert user is not None
    return user
