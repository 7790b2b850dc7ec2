"""Request bodies are refused (413) while they come in, as soon as they pass their route's limit:
before the sign-in, its limiter or the route see the request. A client can make the server hold no
more than a limit's worth of a body, however much it sends, and a route that reads no body (a
sign-out, a delete) is not run for a request that carries a huge one.

A declared Content-Length over the limit is refused before a byte of the body is read; a chunked
body is counted as it arrives. A body within its limit is read whole here, then handed to the route:
the limits are a few KiB. The routes that take uploads (a conversation's documents, its images, an import)
have their own, larger limits, and their bodies are not read here: they stream through to the route,
which spools them to a temporary file as they come (python-multipart), and are refused with 413 as soon
as they pass the limit.
"""

import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FORM_BYTES = 4 * 1024  # POST /login: one token field; and every route that reads no body at all
# PATCH of a conversation: a 20,000-character system prompt whose every character JSON escapes as
# \uXXXX is 120,000 bytes, plus a title and a model.
JSON_BYTES = 128 * 1024
MULTIPART_BYTES = 64 * 1024  # an upload's multipart framing and headers, beyond the file itself
UPLOAD_PATH = re.compile(r"/api/conversations/[^/]+/(documents|images)|/api/(imports)")


def body_limit(method: str, path: str) -> int:
    """The largest body a request to this route may carry, in bytes (uploads aside)."""
    if method == "PATCH" and path.startswith("/api/conversations/"):
        return JSON_BYTES
    return FORM_BYTES


def upload_of(method: str, path: str) -> str | None:
    """What a request uploads ("documents", "images", "imports"), if it is an upload."""
    found = UPLOAD_PATH.fullmatch(path) if method == "POST" else None
    return (found[1] or found[2]) if found else None


class BodyLimit:
    """ASGI middleware: reads a request's body, up to its route's limit, before anything else does;
    refuses it with 413 once it passes the limit."""

    def __init__(
        self,
        app: ASGIApp,
        upload_bytes: int = 20_000_000,
        image_bytes: int = 10_000_000,
        import_bytes: int = 100_000_000,
    ) -> None:
        self.app = app
        # The largest file of each kind, and its framing.
        self.upload_limits = {
            "documents": upload_bytes + MULTIPART_BYTES,
            "images": image_bytes + MULTIPART_BYTES,
            "imports": import_bytes + MULTIPART_BYTES,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else Headers()
        declared = headers.get("content-length")
        if declared is None and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body: a GET, a WebSocket, the lifespan
            return
        upload = upload_of(scope["method"], scope["path"])
        limit = self.upload_limits[upload] if upload else body_limit(scope["method"], scope["path"])
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await too_large(limit)(scope, receive, send)
            return
        if upload:
            await self.app(scope, counted(receive, limit, _over_limit(limit)), send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away: nobody to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await too_large(limit)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then whatever comes next (a disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def counted(receive: Receive, limit: int, over: Callable[[int], Exception]) -> Receive:
    """A `receive` that passes the body through, and raises `over(bytes so far)` once more than `limit`
    bytes came."""
    size = 0

    async def counted() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise over(size)
        return message

    return counted


def _over_limit(limit: int) -> Callable[[int], Exception]:
    # Raised to the route, which answers it, having stored nothing.
    return lambda size: HTTPException(413, f"The request body is over this route's limit of {limit} bytes.")


def too_large(limit: int) -> ASGIApp:
    # Closing the connection: the rest of the body is not worth reading to keep it open.
    detail = f"The request body is over this route's limit of {limit} bytes."
    return JSONResponse({"detail": detail}, status_code=413, headers={"Connection": "close"})
