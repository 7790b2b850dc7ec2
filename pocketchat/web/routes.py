"""The HTTP side: the page, the health check and a small JSON API for conversations."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, StringConstraints

from pocketchat import errors, protocol
from pocketchat.conversations import Conversation
from pocketchat.errors import StorageError, Unavailable
from pocketchat.export import conversation_markdown
from pocketchat.protocol import Unicode
from pocketchat.providers import available_models
from pocketchat.records import SAMPLING_RANGES
from pocketchat.state import chat_state
from pocketchat.web.pages import render_page
from pocketchat.web.sign_in import user_of, visitor_of

router = APIRouter()
DELETE_WAIT_SECONDS = 30.0  # for a stopped reply to end, on whichever replica writes it


async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 naming what is wrong, without echoing the value sent: it may be huge, or not even encodable."""
    problems = [{"loc": problem["loc"], "msg": problem["msg"], "type": problem["type"]} for problem in error.errors()]
    return JSONResponse({"detail": problems}, status_code=422)


@router.get("/")
async def page(request: Request) -> Response:
    mode = chat_state(request.app).settings.auth_mode
    # Behind a proxy the page names the user; with a token it offers to sign out.
    return render_page(request, "index.html", {"auth": mode, "user": visitor_of(request).user})


@router.get("/livez")
async def livez() -> dict[str, str]:
    """200 while the process serves at all (a restart is the cure when it does not)."""
    return {"status": "alive"}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text format: turns, sockets, chunks, first-chunk times, provider errors, store writes."""
    return Response(chat_state(request.app).metrics.text(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """Ready: 200 while the app can serve; 503 while the database refuses writes (they are kept
    meanwhile), with replicas while Redis cannot be reached, or if a background task ended. Anyone may
    ask (load balancers do), so it says which part fails and nothing of why: the reasons are in the log."""
    state = chat_state(request.app)
    parts = {"store": state.store.failure}
    if state.settings.clustered:
        parts["redis"] = state.coordinator.failure
    if (stopped := state.stopped()) is not None:
        parts["tasks"] = stopped  # named only when one ended: a task that died leaves work undone
    ready = all(failure is None for failure in parts.values())
    body = {"status": "ok" if ready else "failing"}
    body |= {name: "ok" if failure is None else "failing" for name, failure in parts.items()}
    if state.settings.mcp_config is not None:
        # Told, but no reason to take the app out of service: a chat goes on without that server's tools.
        body["tools"] = "ok" if state.tools.failure() is None else "failing"
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/api/tools")
async def tools(request: Request) -> dict[str, Any]:
    """The tool sources (built in, each MCP server) with their state, tools and, for a server that
    fails, why (with no secret of its config): the page lets a conversation turn each one off."""
    return chat_state(request.app).tools.describe()


@router.get("/api/models")
async def models(request: Request) -> dict[str, Any]:
    """Every model a conversation can pick; the embedded one is listed even when the remote list fails.
    `vision`: those of them that see images (a message with images to any other is refused)."""
    state = chat_state(request.app)
    provider = state.provider
    names, error = await available_models(provider)
    if error is not None and not names:
        raise HTTPException(502, error)
    vision = [name for name in names if state.images.sees(name)]
    return {"models": names, "vision": vision, "provider": provider.describe(), **({"error": error} if error else {})}


@router.get("/api/flows")
async def flows(request: Request) -> dict[str, Any]:
    """The flows a conversation can run (--flows), the default first: each a name, a title and a line."""
    state = chat_state(request.app)
    offered = [
        {"name": name, "title": flow.title, "description": flow.description} for name, flow in state.flows.items()
    ]
    return {"default": state.settings.flow, "flows": offered}


@router.get("/api/conversations")
async def list_conversations(request: Request) -> dict[str, Any]:
    records = await chat_state(request.app).store.list_conversations(user_of(request))
    return {"conversations": [record.to_wire() for record in records]}


@asynccontextmanager
async def borrowed(request: Request, conversation_id: str, changing: bool = False) -> AsyncIterator[Conversation]:
    """The user's conversation for one HTTP request (404 if they have none by that id), shared with its
    sockets; `changing` it: 409 while an import is still writing it."""
    try:
        hub = chat_state(request.app).hub
        async with hub.borrow(conversation_id, user_of(request)) as conversation:
            if changing:
                await hub.check_changeable(conversation)
            yield conversation
    except errors.UnknownConversation as error:
        raise HTTPException(404, error.message) from None
    except errors.ImportUnderWay as error:
        raise HTTPException(409, error.message) from None
    except (StorageError, Unavailable) as error:
        raise HTTPException(503, error.message) from None
    except TimeoutError:
        raise HTTPException(503, "Its reply did not stop in time; try again.") from None


@router.get("/api/conversations/{conversation_id}")
async def get_conversation(request: Request, conversation_id: str) -> dict[str, Any]:
    async with borrowed(request, conversation_id) as conversation:
        return {**conversation.record.to_wire(), "messages": conversation.wire_history()}


# Surrounding spaces are dropped before the length is checked: a title of spaces is no title.
Name = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=200), Unicode]


SourceName = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9_-]{1,64}$")]


def sampling_value(name: str, kind: type) -> Any:
    """One of a conversation's sampling values: a `kind` within its range (records.SAMPLING_RANGES)."""
    low, high = SAMPLING_RANGES[name]
    finite = {"allow_inf_nan": False} if kind is float else {}
    return Annotated[kind, Field(strict=True, ge=low, le=high, **finite)]


Temperature = sampling_value("temperature", float)
TopP = sampling_value("top_p", float)
MaxTokens = sampling_value("max_tokens", int)


class SamplingChanges(BaseModel):
    """A conversation's own sampling: a value sets it, `null` clears it (back to the provider's default,
    which is then not sent), a field left out stays as it is."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: MaxTokens | None = None

    def applied_to(self, sampling: dict[str, float]) -> dict[str, float]:
        given = self.model_dump(include=self.model_fields_set)
        return {name: value for name, value in (sampling | given).items() if value is not None}


class ConversationChanges(BaseModel):
    title: Name | None = None
    model: Name | None = None
    system_prompt: Annotated[str, StringConstraints(strict=True, max_length=20_000), Unicode] | None = None
    # The tool sources turned off: "builtin", MCP servers' names (a server not configured now is kept).
    tools_off: Annotated[list[SourceName], Field(max_length=64)] | None = None
    sampling: SamplingChanges | None = None
    flow: Annotated[str, StringConstraints(strict=True, max_length=64)] | None = None  # "": the default


async def count_change(request: Request) -> None:
    """Count a change of a conversation against the user's limit (unknown ids too), or answer 429."""
    try:
        await chat_state(request.app).limits.take_change(user_of(request))
    except errors.RateLimited as limited:
        raise HTTPException(429, limited.message, {"Retry-After": str(limited.retry_after)}) from None


@router.patch("/api/conversations/{conversation_id}")
async def change_conversation(request: Request, conversation_id: str, changes: ConversationChanges) -> dict[str, Any]:
    """Rename, or change the model, system prompt, tools or sampling of later turns; attached sockets are told."""
    await count_change(request)
    state = chat_state(request.app)
    async with borrowed(request, conversation_id, changing=True) as conversation:
        record = conversation.record
        fields = changes.model_dump(exclude_none=True, exclude={"sampling"})
        if fields.get("flow") and fields["flow"] not in state.flows:
            offered = ", ".join(state.flows)
            raise HTTPException(422, f"No flow is called {fields['flow']!r} here; the flows offered are {offered}.")
        if changes.sampling is not None:
            fields["sampling"] = changes.sampling.applied_to(record.sampling)
        if "tools_off" in fields:
            fields["tools_off"] = sorted(set(fields["tools_off"]))
        for name, value in fields.items():
            setattr(record, name, value)
        conversation.broadcast(protocol.conversation(record))
        state.coordinator.changed(conversation, fields)  # and the sockets on other replicas
        # If the database refuses the write, the change stays in memory and is written when it recovers.
        # Only the fields changed are written: another replica may have changed the others meanwhile.
        await state.hub.ensure_stored(conversation)
        await state.store.update_conversation(record, fields)
        return record.to_wire()


@router.delete("/api/conversations/{conversation_id}", status_code=204)
async def delete_conversation(request: Request, conversation_id: str) -> None:
    """Delete a conversation: its running turn is stopped, then its sockets are told."""
    await count_change(request)
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        conversation.deleting = True  # from now on no turn starts here and no socket opens it
        try:
            if (turn := conversation.turn) is not None:
                state.coordinator.stop(turn)  # here, or on the replica that runs it
                await asyncio.wait_for(asyncio.shield(turn.done.wait()), DELETE_WAIT_SECONDS)
            await state.coordinator.deleting(conversation.id)  # and no turn starts on another replica
            # With replicas, another replica may have stored it since this copy was loaded (a first
            # turn that started there as this delete began): deleted in the database all the same.
            if conversation.stored or state.settings.clustered:
                # Its documents, their passages and vectors go with it (the tables cascade).
                await state.store.delete_conversation(conversation.id)
            state.documents.forget_conversation(conversation.id)
        except BaseException:
            conversation.deleting = False  # still there: it can be used, or deleted again
            raise
        state.conversations_gone([conversation.id])  # its sockets are told, here and on the other replicas


@router.get("/api/conversations/{conversation_id}/export.md", response_class=PlainTextResponse)
async def export_conversation(request: Request, conversation_id: str) -> PlainTextResponse:
    state = chat_state(request.app)
    async with borrowed(request, conversation_id) as conversation:
        documents = await state.store.list_documents(conversation.id, user_of(request)) if conversation.stored else []
        markdown = conversation_markdown(conversation.record, conversation.history, documents)
    filename = f"pocketchat-{conversation.id[:8]}.md"
    return PlainTextResponse(
        markdown,
        media_type="text/markdown; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
