"""An upload's body (a document, an image, an import) is read only once the user may send it: a user has
at most UPLOADS_AT_ONCE uploads coming in to this process at a time (another gets 429 before a byte of it
is read), and a file to a conversation is read no further than the room left under the user's quota
(409 as soon as it passes, from the declared length before anything is read). So a user cannot fill the
server's disk or memory with uploads that their quota then refuses.
"""

import contextlib
from collections.abc import AsyncIterator
from typing import Any, BinaryIO, Protocol

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from pocketchat.documents import UploadRefused
from pocketchat.state import chat_state
from pocketchat.web.body_limit import MULTIPART_BYTES, counted
from pocketchat.web.routes import borrowed
from pocketchat.web.sign_in import user_of

NO_FILE = "Send the file as the multipart field “file”."
# A refused upload's connection is closed: the server would otherwise read the rest of its body to keep it
# open (25 refused uploads of 19 MB cost everyone else's requests a quarter of a second).
CLOSE = {"Connection": "close"}


class Uploaded(Protocol):
    def to_wire(self) -> dict[str, Any]: ...


class Uploads(Protocol):
    """What takes uploads to a conversation: `pocketchat.documents.Library`, `pocketchat.images.Images`."""

    async def room(self, conversation_id: str, owner: str, size: int) -> int | None:
        """Bytes the user may still upload here (None: no quota); UploadRefused if `size` more do not fit."""

    async def add(self, conversation_id: str, owner: str, raw_name: str | None, file: BinaryIO, size: int) -> Uploaded:
        """Check the file and store it; UploadRefused, having stored nothing."""


class OverRoom(Exception):
    """The body came past the room left under the quota: `size` bytes of it."""

    def __init__(self, size: int) -> None:
        self.size = size


@contextlib.asynccontextmanager
async def one_upload(request: Request) -> AsyncIterator[None]:
    """One of the user's uploads coming in to this process; 429 if they have UPLOADS_AT_ONCE already."""
    state, user = chat_state(request.app), user_of(request)
    if not await state.uploading.take(user):
        said = "You are sending other files already; send this one once they are in."
        raise HTTPException(429, said, headers={"Retry-After": "5", **CLOSE})
    try:
        yield
    finally:
        await state.uploading.remove(user)


async def the_file(request: Request, room: int | None = None) -> UploadFile:
    """The request's one file (multipart field `file`), spooled to a temporary file as it comes in; OverRoom
    once it passes `room` bytes."""
    receive = request.receive if room is None else counted(request.receive, room + MULTIPART_BYTES, OverRoom)
    try:
        form = await Request(request.scope, receive).form(max_files=1, max_fields=1)
    except StarletteHTTPException as bad:  # its 400 "Invalid multipart data.", whatever the cause
        if bad.status_code != 400:
            raise  # 413 from BodyLimit: over the route's limit
        raise HTTPException(400, _unreadable(bad)) from None
    file = form.get("file")
    if not isinstance(file, UploadFile):
        await form.close()
        raise HTTPException(422, NO_FILE)
    return file


def _unreadable(bad: BaseException) -> str:
    """Why a multipart body could not be read, for the user: the parser's reason is in the exception chain."""
    reasons = []
    cause: BaseException | None = bad
    while cause is not None and len(reasons) < 10:
        reasons.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    if any("header size" in reason for reason in reasons):
        return "The file's name is too long (a part's headers may take 4 KB at most): rename it and send it again."
    return "The upload is not multipart form data PocketChat can read; send the file as the field “file”."


async def take_upload(request: Request, conversation_id: str, uploads: Uploads) -> JSONResponse:
    """An upload to the user's conversation (a document, an image): checked against the user's room before
    and while it comes in, then `uploads.add`: 201 with what it became; refused, its HTTP status with why
    (nothing stored)."""
    owner = user_of(request)
    declared = int(request.headers.get("content-length") or 0)  # checked by BodyLimit: digits
    async with one_upload(request), borrowed(request, conversation_id, changing=True) as conversation:
        try:
            room = await uploads.room(conversation.id, owner, max(0, declared - MULTIPART_BYTES))
            try:
                file = await the_file(request, room)
            except OverRoom as over:
                await uploads.room(conversation.id, owner, over.size - MULTIPART_BYTES)  # raises, saying why
                raise UploadRefused(409, "The file would take more than your quota.") from None
            try:
                # Stored now if it is new: what is uploaded to it belongs to it in the database.
                await chat_state(request.app).hub.ensure_stored(conversation)
                added = await uploads.add(conversation.id, owner, file.filename, file.file, file.size or 0)
            finally:
                await file.close()
        except UploadRefused as refused:
            raise HTTPException(refused.status, refused.message, headers=CLOSE) from None
    return JSONResponse(added.to_wire(), status_code=201)
