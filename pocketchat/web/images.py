"""The HTTP API of a conversation's images: attach one for the next message (multipart, field `file`), list
the ones waiting, remove a waiting one, and read any one back (the page shows them). Owner-only, like
every conversation route: another user's conversation or image is a 404."""

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from pocketchat.errors import Unavailable
from pocketchat.records import possible_id
from pocketchat.state import chat_state
from pocketchat.web.routes import borrowed
from pocketchat.web.sign_in import user_of
from pocketchat.web.uploads import take_upload

router = APIRouter()
NO_IMAGE = "This conversation has no such image."
# Its bytes never change under its id (a new upload is a new id): the browser may keep it, for this user only.
CACHE = "private, max-age=86400"


@router.post("/api/conversations/{conversation_id}/images", status_code=201)
async def attach_image(request: Request, conversation_id: str) -> JSONResponse:
    """Attach an image for the next message: 201 `{id, name, type, size, width, height}`. Not a PNG, JPEG or
    WebP (by its bytes) gets 415, a damaged or empty one 422, one over a limit 413 or 409, each with why,
    and nothing is stored. The body was spooled to a temporary file as it came in, refused as a document's
    is (web/uploads.py)."""
    return await take_upload(request, conversation_id, chat_state(request.app).images)


@router.get("/api/conversations/{conversation_id}/images")
async def waiting_images(request: Request, conversation_id: str) -> dict[str, Any]:
    """The images waiting to go with the conversation's next message, oldest first (a page that reloads
    shows them again in its message box)."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        if not conversation.stored:
            return {"images": []}
        images = await state.store.waiting_images(conversation.id, user_of(request))
    return {"images": [image.to_wire() for image in images]}


@router.get("/api/conversations/{conversation_id}/images/{image_id}")
async def image_bytes(request: Request, conversation_id: str, image_id: str) -> Response:
    """The image itself, with the type its bytes were found to be. Read straight from the database for
    its owner (a history of many images does not load the conversation once per image)."""
    if not possible_id(conversation_id) or not possible_id(image_id):
        raise HTTPException(404, NO_IMAGE)
    try:
        found = await chat_state(request.app).store.image(conversation_id, image_id, user_of(request))
    except Unavailable as error:
        raise HTTPException(503, error.message) from None
    if found is None:
        raise HTTPException(404, NO_IMAGE)
    image, data = found
    # nosniff: the browser takes the type given (one checked from the bytes at upload), never a guess.
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": CACHE}
    return Response(data, media_type=image.type, headers=headers)


@router.delete("/api/conversations/{conversation_id}/images/{image_id}", status_code=204)
async def remove_image(request: Request, conversation_id: str, image_id: str) -> None:
    """Remove an image waiting for the next message; 404 if there is none by that id (an image sent with a
    message stays with it, and goes with the conversation)."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        if not possible_id(image_id) or not await state.images.remove(conversation.id, image_id):
            raise HTTPException(404, NO_IMAGE)
