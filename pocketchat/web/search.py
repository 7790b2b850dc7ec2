"""The HTTP API of search: the signed-in user's conversations that hold the words of a query, best first,
each at its best-matching message with a snippet (pocketchat/search.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from pocketchat.errors import RateLimited, Unavailable
from pocketchat.search import MAX_LIMIT, MAX_QUERY_CHARACTERS, parse_query
from pocketchat.state import chat_state
from pocketchat.web.sign_in import user_of

router = APIRouter()


@router.get("/api/search")
async def search(
    request: Request,
    q: Annotated[str, Query(max_length=MAX_QUERY_CHARACTERS)],
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 20,
) -> dict[str, Any]:
    """`{results: [{conversation_id, message_id, role, title, title_highlights, snippet, highlights, rank}]}`.
    A query with no word to look for (empty, spaces, punctuation, common words only) finds nothing."""
    state, user = chat_state(request.app), user_of(request)
    try:
        await state.limits.take_search(user)
        hits = await state.store.search(user, parse_query(q), limit)
    except RateLimited as limited:
        raise HTTPException(429, limited.message, {"Retry-After": str(limited.retry_after)}) from None
    except Unavailable as error:
        raise HTTPException(503, error.message) from None
    return {"results": [hit.to_wire() for hit in hits]}
