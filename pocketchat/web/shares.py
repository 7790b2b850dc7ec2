"""Share links over HTTP: the owner makes, lists and revokes a conversation's links (owner-only, like
every conversation route); anyone with a link reads its snapshot, at `/s/{token}` (a small page) and
`/api/shared/{token}` (its JSON), and nothing else: no cookie, no other route, no socket.

A link is looked up in the database on every request, so a revoke (or the conversation's delete) is
seen at once by every replica."""

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response

from pocketchat.hashes import token_hash
from pocketchat.records import ShareRecord, possible_id
from pocketchat.shares import (
    MAX_SHARES_PER_CONVERSATION,
    new_token,
    read_snapshot,
    share_hash,
    snapshot,
)
from pocketchat.state import chat_state
from pocketchat.web.routes import borrowed, count_change
from pocketchat.web.sign_in import user_of

router = APIRouter()
SHARED_PAGE = Path(__file__).resolve().parent.parent.parent / "static" / "shared.html"
# The shared page runs its own script and styles only, draws no image (a reply's Markdown could name
# one elsewhere, to learn who reads), is never framed, indexed or cached (a revoked link must not live
# on in a cache), and sends no Referer: the token is in its URL.
SHARED_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Robots-Tag": "noindex, nofollow",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
GONE = "No such link: it was revoked, or never existed."


@router.post("/api/conversations/{conversation_id}/shares", status_code=201)
async def make_share(request: Request, conversation_id: str) -> JSONResponse:
    """A new link to a snapshot of the conversation as it is now: 201 `{id, url, created_at}`. The token
    in `url` is shown this once: the database keeps its hash only."""
    await count_change(request)  # a link made is a change: counted against the user's changes a minute
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        running = conversation.turn.id if conversation.turn is not None else None
        shot = snapshot(conversation.record, conversation.history, running)
        if not shot["messages"]:
            raise HTTPException(409, "This conversation has no messages to share yet.")
        share = ShareRecord(conversation.id, conversation.record.owner)
        token = new_token()
        text = json.dumps(shot, ensure_ascii=False)
        if not await state.store.add_share(share, token_hash(token), text, MAX_SHARES_PER_CONVERSATION):
            raise HTTPException(
                409, f"This conversation has {MAX_SHARES_PER_CONVERSATION} links already: revoke one to make another."
            )
    return JSONResponse({**share.to_wire(), "url": f"/s/{token}"}, status_code=201)


@router.get("/api/conversations/{conversation_id}/shares")
async def list_shares(request: Request, conversation_id: str) -> dict[str, Any]:
    """The conversation's live links, oldest first: `{shares: [{id, created_at}]}` (never their tokens)."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        shares = await state.store.list_shares(conversation.id, user_of(request)) if conversation.stored else []
    return {"shares": [share.to_wire() for share in shares]}


@router.delete("/api/conversations/{conversation_id}/shares/{share_id}", status_code=204)
async def revoke_share(request: Request, conversation_id: str, share_id: str) -> None:
    """Revoke a link: from now on it answers 404, on every replica. 404 if the conversation has none by
    that id."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        if not possible_id(share_id) or not await state.store.delete_share(conversation.id, share_id):
            raise HTTPException(404, "This conversation has no such link.")


async def _shared(request: Request, token: str) -> tuple[str, float] | None:
    """The link's snapshot (JSON text) and when it was made; None for a revoked, wrong or malformed token
    alike (a malformed one is not looked up)."""
    digest = share_hash(token)
    return None if digest is None else await chat_state(request.app).store.shared(digest)


@router.get("/s/{token}", response_model=None)
async def shared_page(request: Request, token: str) -> Response:
    """The read-only page of a link; its script reads `/api/shared/{token}`."""
    if await _shared(request, token) is None:
        return PlainTextResponse(GONE, 404, SHARED_HEADERS)
    return FileResponse(SHARED_PAGE, media_type="text/html; charset=utf-8", headers=SHARED_HEADERS)


@router.get("/api/shared/{token}")
async def shared_snapshot(request: Request, token: str) -> JSONResponse:
    """A link's snapshot: `{title, messages: [{role, content, status}], created_at}`."""
    if (found := await _shared(request, token)) is None:
        return JSONResponse({"detail": GONE}, 404, SHARED_HEADERS)
    text, created_at = found
    return JSONResponse({**read_snapshot(text), "created_at": created_at}, headers=SHARED_HEADERS)
