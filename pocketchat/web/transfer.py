"""The HTTP API of conversations as files: a conversation's JSON export (its whole tree), an import
(multipart, field `file`: our JSON or ChatGPT's `conversations.json`) and its progress. Owner-only: an
import is its importer's, and another user's import or conversation is a 404."""

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from pocketchat.errors import StorageError, Unavailable
from pocketchat.records import possible_id
from pocketchat.state import chat_state
from pocketchat.transfer.imports import ImportRunning
from pocketchat.transfer.native import to_file
from pocketchat.transfer.tree import BadFile, ConversationTree
from pocketchat.web.routes import borrowed
from pocketchat.web.sign_in import user_of
from pocketchat.web.uploads import one_upload, the_file

router = APIRouter()


@router.get("/api/conversations/{conversation_id}/export.json")
async def export_json(request: Request, conversation_id: str) -> Response:
    """The conversation in PocketChat's own format, every version of every message: what an import reads."""
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        record = conversation.record
        stored = await state.store.conversation_tree(conversation.id, user_of(request)) if conversation.stored else None
    # Not stored yet: a new conversation, which has no message.
    tree = stored or ConversationTree(
        title=record.title,
        model=record.model,
        system_prompt=record.system_prompt,
        created_at=record.created_at,
        updated_at=record.updated_at,
        leaf_id=None,
        messages=[],
        tools_off=record.tools_off,
        sampling=record.sampling,
        flow=record.flow,
        id=record.id,
    )
    body = json.dumps(to_file(tree), ensure_ascii=False, indent=1)
    filename = f"pocketchat-{conversation.id[:8]}.json"
    return Response(
        body,
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.post("/api/imports", status_code=202)
async def start_import(request: Request) -> JSONResponse:
    """Import a file: checked whole first (a bad one gets 422 saying where and why, and nothing is
    stored), then 202 `{id, status: "importing", total, imported, dropped}`; its conversations are written
    in the background (`GET /api/imports/{id}`). 409 while the user has an import under way; 413 over
    --limit-import-bytes (as the body comes in: it is spooled to a temporary file); 429 while two of the
    user's uploads come in (web/uploads.py)."""
    state = chat_state(request.app)
    async with one_upload(request):
        file = await the_file(request)
        try:
            if (file.size or 0) > state.settings.limit_import_bytes:
                raise HTTPException(
                    413, f"The file is over the import limit of {state.settings.limit_import_bytes:,} bytes."
                )
            job = await state.imports.start(user_of(request), file.file)
        except BadFile as bad:
            raise HTTPException(bad.status, bad.message) from None
        except ImportRunning as running:
            raise HTTPException(409, str(running)) from None
        except Unavailable as unavailable:
            raise HTTPException(503, unavailable.message) from None
        finally:
            await file.close()
    return JSONResponse(job.to_wire(), status_code=202)


@router.get("/api/imports/{import_id}")
async def import_progress(request: Request, import_id: str) -> dict[str, Any]:
    """How far the user's import got: `status` importing, done or failed (with `error`: then nothing
    of it was kept)."""
    imports = chat_state(request.app).imports
    try:
        state = await imports.state(import_id, user_of(request)) if possible_id(import_id) else None
    except (StorageError, Unavailable) as error:  # the database, which every replica asks, does not answer
        raise HTTPException(503, error.message) from None
    if state is None:
        raise HTTPException(404, "No import of yours has that id.")
    return state
