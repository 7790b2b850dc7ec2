"""The HTTP API of a user's memory (the memory flow, docs/memory.md): the facts remembered about the signed-in
user, each edited (embedded again) or forgotten, all forgotten, exported as JSON, and memory turned on or off.
Every statement names the user: another user's fact is answered as one that does not exist (404)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, StringConstraints

from pocketchat.errors import ProviderError, StorageError, Unavailable
from pocketchat.protocol import Unicode
from pocketchat.records import possible_id
from pocketchat.state import chat_state
from pocketchat.store.memory import MOST_FACTS
from pocketchat.web.routes import count_change
from pocketchat.web.sign_in import user_of
from utils.embeddings import to_bytes
from utils.memory import FACT_CHARACTERS

router = APIRouter()
NO_SUCH_FACT = "You have no remembered fact by that id."

FactText = Annotated[
    str, StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=FACT_CHARACTERS), Unicode
]


class FactChange(BaseModel):
    text: FactText


class MemorySwitch(BaseModel):
    on: bool


@contextmanager
def database_answers() -> Iterator[None]:
    """A database that refuses or does not answer is a 503 saying so; nothing changed."""
    try:
        yield
    except (StorageError, Unavailable) as error:
        raise HTTPException(503, error.message) from None


@router.get("/api/memory")
async def memory(request: Request) -> dict[str, Any]:
    """`{on, most, facts: [{id, text, created_at, updated_at}]}`: the user's facts, oldest first (listed when
    memory is off too), and how many they may have."""
    with database_answers():
        found = await chat_state(request.app).store.read_memory(user_of(request), even_off=True)
    return {"on": found.on, "most": MOST_FACTS, "facts": [fact.to_wire() for fact in found.facts]}


@router.get("/api/memory/export")
async def export_memory(request: Request) -> JSONResponse:
    """The user's memory as a file: `{format: "pocketchat.memory", version: 1, exported_at, on, facts}`."""
    with database_answers():
        found = await chat_state(request.app).store.read_memory(user_of(request), even_off=True)
    facts = [{key: value for key, value in fact.to_wire().items() if key != "id"} for fact in found.facts]
    body = {"format": "pocketchat.memory", "version": 1, "exported_at": time.time(), "on": found.on, "facts": facts}
    disposition = {"Content-Disposition": 'attachment; filename="pocketchat-memory.json"'}
    return JSONResponse(body, headers=disposition)


@router.patch("/api/memory")
async def switch_memory(request: Request, switch: MemorySwitch) -> dict[str, bool]:
    """`{on}`: off, the memory flow neither reads nor keeps the user's facts (which stay, to turn it on again)."""
    await count_change(request)
    with database_answers():
        await chat_state(request.app).store.turn_memory(user_of(request), switch.on)
    return {"on": switch.on}


@router.patch("/api/memory/{fact_id}")
async def change_fact(request: Request, fact_id: str, change: FactChange) -> dict[str, Any]:
    """A fact in the user's words (on one line), embedded again so that it is recalled by its new meaning."""
    await count_change(request)
    state, text = chat_state(request.app), " ".join(change.text.split())
    if not possible_id(fact_id):
        raise HTTPException(404, NO_SUCH_FACT)
    embedder = state.documents.embedder
    try:
        vector = to_bytes((await embedder.embed([text], question=True))[0])
    except ProviderError as error:
        raise HTTPException(503, f"The fact could not be embedded, so it is unchanged: {error.message}") from None
    with database_answers():
        fact = await state.store.change_fact(user_of(request), fact_id, text, vector, embedder.name)
    if fact is None:
        raise HTTPException(404, NO_SUCH_FACT)
    return fact.to_wire()


@router.delete("/api/memory/{fact_id}", status_code=204)
async def forget_fact(request: Request, fact_id: str) -> None:
    await count_change(request)
    with database_answers():
        forgotten = possible_id(fact_id) and await chat_state(request.app).store.delete_fact(user_of(request), fact_id)
    if not forgotten:
        raise HTTPException(404, NO_SUCH_FACT)


@router.delete("/api/memory")
async def forget_all(request: Request) -> dict[str, int]:
    """`{forgotten}`: how many facts of the user's were deleted (all of them)."""
    await count_change(request)
    with database_answers():
        return {"forgotten": await chat_state(request.app).store.forget_facts(user_of(request))}
