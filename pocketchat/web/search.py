"""The HTTP API of search: the signed-in user's conversations that hold the words of a query, best first,
each at its best-matching message with a snippet (pocketchat/search.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from pocketchat.errors import Unavailable
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
    try:
        hits = await chat_state(request.app).store.search(user_of(request), parse_query(q), limit)
    except Unavailable as error:
        raise HTTPException(503, error.message) from None
    return {"results": [hit.to_wire() for hit in hits]}
