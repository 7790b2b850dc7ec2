"""The HTTP API of a conversation's documents: attach (multipart, field `file`), list, remove.
Owner-only, like every conversation route: another user's conversation is a 404."""

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from pocketchat.records import possible_id
from pocketchat.state import chat_state
from pocketchat.web.routes import borrowed
from pocketchat.web.sign_in import user_of
from pocketchat.web.uploads import take_upload

router = APIRouter()


@router.post("/api/conversations/{conversation_id}/documents", status_code=201)
async def attach_document(request: Request, conversation_id: str) -> JSONResponse:
    """Attach a file: 201 `{id, name, size, status: "indexing", ...}`, indexed in the background (its
    progress comes in `document` frames and in the list). A bad file or one over a limit gets 413, 415,
    422 or 409 with why, and nothing is stored. The body was spooled to a temporary file as it came in,
    refused with 413 once over the limit (web/body_limit.py), with 409 once over the user's quota, and with
    429 while two of the user's uploads come in (web/uploads.py)."""
    return await take_upload(request, conversation_id, chat_state(request.app).documents)


@router.get("/api/conversations/{conversation_id}/documents")
async def list_documents(request: Request, conversation_id: str) -> dict[str, Any]:
    """The conversation's documents, oldest first, each with its state and progress."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        if not conversation.stored:
            return {"documents": []}
        documents = await state.store.list_documents(conversation.id, user_of(request))
    return {"documents": [document.to_wire() for document in documents]}


@router.delete("/api/conversations/{conversation_id}/documents/{document_id}", status_code=204)
async def remove_document(request: Request, conversation_id: str, document_id: str) -> None:
    """Remove a document: its indexing stops, its passages are deleted; 404 if the conversation has none
    by that id."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        if not possible_id(document_id) or not await state.documents.remove(conversation.id, document_id):
            raise HTTPException(404, "This conversation has no such document.")
