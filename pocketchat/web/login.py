"""The sign-in and sign-out routes of `--auth token` (`/login`, `/logout`), and the access log that
never shows the token a sign-in link carries."""

import logging
import math
import re
from urllib.parse import parse_qs, unquote_plus

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from pocketchat.limits import SignInAttempt
from pocketchat.web.pages import render_page
from pocketchat.web.sign_in import SESSION_COOKIE, SignIn, visitor_of

logger = logging.getLogger("pocketchat")

router = APIRouter()
WRONG_TOKEN = "That token is not right."


def login_page(request: Request, status: int = 200, error: str | None = None, **headers: str) -> Response:
    return render_page(request, "login.html", {"error": error}, status, headers)


@router.get("/login", response_model=None)
async def login(request: Request) -> Response:
    sign_in: SignIn = request.app.state.sign_in
    if sign_in.mode != "token":
        return RedirectResponse("/", status_code=303)  # nothing to sign in to here
    if (token := request.query_params.get("token")) is not None:
        # A sign-in link: sign in, then show a clean URL, so the token stays out of the history.
        return await _sign_in(request, token, RedirectResponse("/login?failed", status_code=303))
    failed = "failed" in request.query_params
    return login_page(request, 401 if failed else 200, WRONG_TOKEN if failed else None)


@router.post("/login", response_model=None)
async def login_form(request: Request) -> Response:
    body = await request.body()  # a few KiB at most: pocketchat/web/body_limit.py refuses more while it comes in
    token = parse_qs(body.decode(errors="replace")).get("token", [""])[0].strip()
    return await _sign_in(request, token, login_page(request, 401, WRONG_TOKEN))


async def _sign_in(request: Request, token: str, failed: Response) -> Response:
    sign_in: SignIn = request.app.state.sign_in
    visitor = visitor_of(request)
    # Counted as a wrong token before the token is looked at: attempts sent at once cannot all be checked
    # before any is counted. A right one is uncounted.
    attempt = await sign_in.limits.take_sign_in(visitor.address)
    if not isinstance(attempt, SignInAttempt):
        seconds = str(max(1, math.ceil(attempt)))
        error = f"Too many wrong tokens: try again in {seconds} s."
        return login_page(request, 429, error, **{"Retry-After": seconds})
    if not await sign_in.accounts.token_matches(token):
        sign_in.wrong_tokens.warn(visitor.address)
        return failed
    await sign_in.limits.succeeded(attempt)
    response = RedirectResponse("/", status_code=303)
    # HttpOnly: no script reads it. SameSite=Lax: sent when a link from another site (a bookmark, a
    # mail) is followed, never with another site's requests that change something (those are refused
    # by their Origin as well). Secure whenever the page came over https.
    response.set_cookie(
        SESSION_COOKIE,
        await sign_in.accounts.new_session(),
        max_age=int(sign_in.settings.session_days * 86400),
        httponly=True,
        samesite="lax",
        secure=visitor.https,
    )
    return response


@router.post("/logout", response_model=None)
async def logout(request: Request) -> Response:
    """Sign this browser out: its session is revoked, and its open sockets are closed with 4401."""
    visitor = visitor_of(request)
    if visitor.session_id is not None:
        await request.app.state.chat.accounts.sign_out(visitor.session_id)
    response = RedirectResponse("/login" if request.app.state.sign_in.mode == "token" else "/", 303)
    response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="lax", secure=visitor.https)
    return response


def access_log_without_secrets(target: str) -> str:
    """A request line's path and query with the value of anything that may be a sign-in token hidden.

    Judged on the decoded text, however it is spelt: `%74oken=`, `+token=`, `;` or an encoded `?` as a
    separator, a key repeated, an encoded `&` inside a value. Any part (between `?`, `&`, `;` and `#`)
    whose fully decoded text mentions a token, in any case, is hidden whole; its key is kept when it
    is just `token`, however encoded."""
    if "token" not in _fully_decoded(target).lower():
        return target  # nearly every line: one decode, no split
    pieces = re.split(r"([?&;#])", target)  # the separators kept, to rebuild the line as it came
    for index in range(0, len(pieces), 2):
        if "token" in _fully_decoded(pieces[index]).lower():
            key, equals, _ = pieces[index].partition("=")
            named = equals and _fully_decoded(key).strip().lower() == "token"
            pieces[index] = f"{key}=[hidden]" if named else "[hidden]"
    return "".join(pieces)


def _fully_decoded(text: str) -> str:
    """`text` percent- and plus-decoded until it changes no more (`%2574` is `%74` is `t`)."""
    for _ in range(5):
        decoded = unquote_plus(text)
        if decoded == text:
            break
        text = decoded
    return text
