"""The nodes of a chat turn, and of a document's indexing. Each reads the shared store in `prep`,
works in `exec`, writes in `post`.

Nodes never touch a socket: what the browser should see goes to `shared["log"]`, the turn's log,
which every attached socket follows. A node shows itself in the page with `log.append_step(...)`.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pocketflow import AsyncNode, AsyncParallelBatchNode

from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn
from pocketchat.errors import ProviderError, StorageError
from pocketchat.jobs import Jobs
from pocketchat.providers import sees_images
from pocketchat.records import DocumentRecord, Message, Passage, Status
from pocketchat.store import NotIndexing, Store, save_reply
from pocketchat.tools import CallOutcome, ToolBox, safe_call, shown_arguments
from pocketchat.turn_log import TurnLog
from utils.chunking import Chunk, chunk_pages
from utils.clean import MESSAGE_CHARACTERS, clean_text
from utils.embeddings import Embedder, to_bytes
from utils.llm_stream import ChatProvider, Sampling, StopSignal, StreamResult, ToolCall, stream_llm
from utils.prompt import PromptMessage, Snippet, build_prompt, data_url, images_to_send
from utils.read_document import Page
from utils.retrieval import VectorCache, retrieve
from utils.titles import first_line_title, title_for
from utils.usage import TurnUsage

logger = logging.getLogger("pocketchat")


class TitleConversation(AsyncNode):
    """Name a conversation after its first user message, once (NameConversation names it better after the
    first reply)."""

    async def prep_async(self, shared: dict[str, Any]) -> str | None:
        conversation: Conversation = shared["conversation"]
        return None if conversation.record.title else shared["turn"].user_message.content

    async def exec_async(self, first_message: str | None) -> str | None:
        return None if first_message is None else first_line_title(first_message)

    async def post_async(self, shared: dict[str, Any], first_message: str | None, title: str | None) -> None:
        if title is None:
            return
        conversation: Conversation = shared["conversation"]
        conversation.record.title = title
        # Queued, not awaited: the turn's later writes land after it, and waiting for the writer
        # thread would hold up the first chunk when many turns start at once. Written only if the
        # conversation has no title yet: a rename on another replica meanwhile wins.
        shared["store"].name_conversation(conversation.record)
        shared["log"].append(protocol.conversation(conversation.record))


@dataclass
class TitleRequest:
    provider: ChatProvider
    model: str
    first_message: str
    reply: str
    stop: StopSignal
    placeholder: str  # the title it has now: its first message's start


TITLE_SECONDS = 15.0  # the turn ends when its last node does: a title is not worth a longer wait


class NameConversation(AsyncNode):
    """After a conversation's first complete reply, ask its model for a title of a few words, in place of
    its first message's start (unless someone renamed it meanwhile, on any replica)."""

    async def prep_async(self, shared: dict[str, Any]) -> TitleRequest | None:
        conversation: Conversation = shared["conversation"]
        turn: Turn = shared["turn"]
        placeholder = first_line_title(turn.user_message.content)
        if (
            turn.kind != "message"
            or turn.user_message.parent_id is not None
            or conversation.record.title != placeholder
        ):
            return None  # not its first reply, or no longer the title its first message gave it
        model = turn.reply.meta.get("model") or conversation.record.model
        return TitleRequest(
            shared["provider"], model, turn.user_message.content, turn.reply.content, turn.stop, placeholder
        )

    async def exec_async(self, request: TitleRequest | None) -> str | None:
        if request is None:
            return None
        async with asyncio.timeout(TITLE_SECONDS):
            return await title_for(request.provider, request.model, request.first_message, request.reply, request.stop)

    async def exec_fallback_async(self, request: TitleRequest | None, exc: Exception) -> str | None:
        logger.info("no title from the model (%s): the first message's start stays", type(exc).__name__)
        return None  # the placeholder is a title too

    async def post_async(self, shared: dict[str, Any], request: TitleRequest | None, title: str | None) -> None:
        record = shared["conversation"].record
        if request is None or title is None or title == request.placeholder or record.title != request.placeholder:
            return
        record.title = title
        shared["store"].name_conversation(record, replacing=request.placeholder)
        shared["log"].append(protocol.conversation(record))


@dataclass
class RetrievalRequest:
    store: Store
    vectors: VectorCache
    embedder: Embedder
    conversation_id: str
    owner: str
    question: str
    budget: int  # tokens of the context budget the passages may take
    known_empty: bool  # the conversation is known to have no document ready: nothing to read
    told_before: int  # the conversation's document frames seen before the read (see `post_async`)


@dataclass
class Found:
    passages: list[Passage]
    failure: str | None = None  # why the documents could not be searched
    seconds: float | None = None  # how long the search took, when there were documents to search
    none_ready: bool = False  # the documents were read and none was ready


PASSAGES = 5  # passages a reply gets, when its documents are too big to be given whole
WHOLE_SHARE = 2  # documents are given whole when they take at most 1/2 of the context budget


class RetrieveDocuments(AsyncNode):
    """When the conversation has documents, find the passages that best answer the user's message (or
    take a small document whole), put them in `shared["context"]` for BuildPrompt, and show them as a
    `sources` step. A conversation without documents costs one small read, no model loaded; and none
    once it is known to have none (`Conversation.knows_no_documents`)."""

    async def prep_async(self, shared: dict[str, Any]) -> RetrievalRequest:
        conversation: Conversation = shared["conversation"]
        library = shared["documents"]
        return RetrievalRequest(
            shared["store"],
            library.vectors,
            library.embedder,
            conversation.id,
            conversation.record.owner,
            shared["turn"].user_message.content,
            shared["settings"].context_budget // WHOLE_SHARE,
            conversation.knows_no_documents(),
            conversation.documents_told,
        )

    async def exec_async(self, request: RetrievalRequest) -> Found:
        if request.known_empty:
            return Found([])
        started = time.perf_counter()
        documents = await request.store.list_documents(request.conversation_id, request.owner)
        ready = [document for document in documents if document.status == "ready"]
        if not ready:
            return Found([], none_ready=True)
        if sum(document.chunks for document in ready) * PASSAGE_TOKENS <= request.budget:
            # Small enough to be read whole, in order: nothing to embed or search.
            whole = await request.vectors.all_ids([document.id for document in ready])
            found = {passage.id: passage for passage in await request.store.passages(request.owner, whole)}
            passages = [found[passage_id] for passage_id in whole if passage_id in found]
            return Found(passages, seconds=time.perf_counter() - started)
        passages = await retrieve(
            request.store, request.vectors, request.embedder, ready, request.owner, request.question, PASSAGES
        )
        return Found(passages, seconds=time.perf_counter() - started)

    async def exec_fallback_async(self, request: RetrievalRequest, exc: Exception) -> Found:
        # The reply goes on without its documents rather than failing; a status step says so.
        return Found([], f"The documents could not be searched ({exc}).")

    async def post_async(self, shared: dict[str, Any], request: RetrievalRequest, found: Found) -> None:
        if found.none_ready:
            # Unless a document frame came during the read: it may have missed that document.
            shared["conversation"].found_no_documents(request.told_before)
        if found.seconds is not None:
            shared["documents"].metrics.retrieval.observe(found.seconds)
        if found.failure:
            shared["log"].append_step("RetrieveDocuments", "status", found.failure)
        if not found.passages:
            return
        shared["context"].extend(Snippet(passage.text, passage.source) for passage in found.passages)
        sources = [
            {"source": p.source, "text": p.text, "document_id": p.document_id, "page": p.page} for p in found.passages
        ]
        shared["log"].append_step("RetrieveDocuments", "sources", sources)


PASSAGE_TOKENS = 175  # a passage is at most about 700 characters (utils/chunking.py)


@dataclass
class ImagesRequest:
    store: Store
    owner: str
    sees: bool  # whether the conversation's model takes images
    history: list[Message]
    budget: int


class ReadImages(AsyncNode):
    """For a model that can see images, read the images of recent user messages (all of the user's new
    message; older ones while they fit their share of the context budget) into `shared["images"]` as
    data URLs, for BuildPrompt to send as image parts. A text-only model gets none: nothing is read."""

    async def prep_async(self, shared: dict[str, Any]) -> ImagesRequest:
        conversation: Conversation = shared["conversation"]
        settings = shared["settings"]
        sees = sees_images(shared["provider"], conversation.record.model, settings.vision_models)
        return ImagesRequest(
            shared["store"], conversation.record.owner, sees, conversation.history, settings.context_budget
        )

    async def exec_async(self, request: ImagesRequest) -> dict[str, str]:
        ids = images_to_send(request.history, request.budget) if request.sees else []
        if not ids:
            return {}
        found = await request.store.image_data(request.owner, ids)
        return {image_id: data_url(*found[image_id]) for image_id in ids if image_id in found}

    async def post_async(self, shared: dict[str, Any], request: ImagesRequest, images: dict[str, str]) -> None:
        shared["images"] = images


@dataclass
class PromptInputs:
    system_prompt: str
    history: list[Message]
    context: list[Snippet]
    budget: int
    images: dict[str, str]


class BuildPrompt(AsyncNode):
    """Shape what the model reads: the system prompt, what earlier nodes put in `shared["context"]`
    (numbered, with their sources, for the reply to cite), and as much recent history as fits, with the
    images ReadImages read."""

    async def prep_async(self, shared: dict[str, Any]) -> PromptInputs:
        conversation: Conversation = shared["conversation"]
        return PromptInputs(
            conversation.record.system_prompt,
            conversation.history,
            shared["context"],
            shared["settings"].context_budget,
            shared["images"],
        )

    async def exec_async(self, inputs: PromptInputs) -> list[PromptMessage]:
        return build_prompt(inputs.system_prompt, inputs.history, inputs.budget, inputs.context, inputs.images)

    async def post_async(self, shared: dict[str, Any], inputs: PromptInputs, prompt: list[PromptMessage]) -> None:
        shared["prompt"] = prompt


@dataclass
class ChatRequest:
    provider: ChatProvider
    messages: list[PromptMessage]
    model: str
    max_tokens: int | None
    log: TurnLog
    turn: Turn
    sampling: Sampling  # the conversation's own temperature and top_p, if it set them
    tools: ToolBox | None = None  # offered when the model supports them
    final: bool = False  # --max-tool-steps reached: the model answers without tools
    start_seq: int = 0  # chunks in the log before this step: a retry is safe while there are no more
    failures: int = 0  # attempts that failed before the first chunk


@dataclass
class ChatOutcome:
    status: Status  # complete, stopped or error
    result: StreamResult | None = None
    error: ProviderError | None = None
    bug: Exception | None = None


class StreamChat(AsyncNode):
    """Stream the model's reply to `shared["prompt"]` into the log, offering it the turn's tools; the
    action says how it ended: "complete", "stopped" or "error", or "tools" when the model asked for tool
    calls (RunTools runs them, and the flow comes back here: one run of this node is one step)."""

    async def prep_async(self, shared: dict[str, Any]) -> ChatRequest:
        conversation: Conversation = shared["conversation"]
        # The conversation's own settings win over the app's; what neither sets is the provider's default.
        sampling = dict(conversation.record.sampling)
        max_tokens = sampling.pop("max_tokens", None) or shared["settings"].max_tokens
        return ChatRequest(
            provider=shared["provider"],
            messages=shared["prompt"],
            model=conversation.record.model,
            max_tokens=int(max_tokens) if max_tokens else None,
            log=shared["log"],
            sampling=sampling,
            turn=shared["turn"],
            tools=shared["tools"],
            final=shared["tool_steps"] >= shared["settings"].max_tool_steps,
            start_seq=shared["log"].seq,
        )

    async def exec_async(self, request: ChatRequest) -> ChatOutcome:
        try:
            # A conversation made while the provider was unreachable has no model yet.
            request.model = request.model or await request.provider.default_model()
            # The embedded model has no tool calls: it is offered none.
            supported = request.tools is not None and request.provider.supports_tools(request.model)
            result = await stream_llm(
                request.provider,
                request.messages,
                request.model,
                request.max_tokens,
                request.log.append_chunk,
                request.turn.stop,
                lambda position: request.log.append(protocol.queued(request.turn.id, position)),
                request.tools.offer(request.final) if supported and request.tools else None,
                request.sampling,
            )
        except ProviderError as error:
            # Raising lets PocketFlow retry after `wait`, which is safe only while this step sent nothing
            # (tool calls are collected, not sent, until the stream ends).
            if error.retryable and request.log.seq == request.start_seq:
                # PocketFlow sleeps `self.wait` before the next attempt: doubling it after the first
                # failure backs off. The flow runs a copy of this node, so each turn starts afresh.
                if request.failures:
                    self.wait *= 2
                request.failures += 1
                raise
            return ChatOutcome("error", error=error)
        except Exception as bug:
            # PocketFlow would retry any exception, and a retry after chunks went out would send
            # them twice: a bug is carried to post, which raises it.
            return ChatOutcome("error", bug=bug)
        return ChatOutcome("stopped" if result.stopped else "complete", result=result)

    async def exec_fallback_async(self, request: ChatRequest, exc: Exception) -> ChatOutcome:
        if isinstance(exc, ProviderError):
            return ChatOutcome("error", error=exc)
        raise exc

    async def post_async(self, shared: dict[str, Any], request: ChatRequest, outcome: ChatOutcome) -> str:
        if outcome.bug is not None:
            raise outcome.bug  # turns.run_turn records the turn as failed and logs the traceback
        turn: Turn = shared["turn"]
        reply = turn.reply_so_far()
        usage: TurnUsage = shared["usage"]
        source = request.provider.usage_source(request.model) if request.model else "estimated"
        said = usage.add(outcome.result, source, request.messages, reply.content, reply.reasoning)
        reply.meta.update(usage.stats(request.model, turn.started_at))  # summed over the steps so far
        calls = [safe_call(call) for call in outcome.result.tool_calls] if outcome.result is not None else []
        if outcome.status == "complete" and calls and not request.final:
            # What the model said and asked for joins the prompt; RunTools adds the results.
            asked = [_call_message(call) for call in calls]
            shared["prompt"] = [*request.messages, {"role": "assistant", "content": said or None, "tool_calls": asked}]
            shared["tool_calls"] = calls
            return "tools"
        reply.status = outcome.status
        if outcome.error is not None:
            # The provider's own message, which its body (or a stream's error event) may make anything.
            outcome.error.message = clean_text(outcome.error.message, MESSAGE_CHARACTERS)
            reply.error = outcome.error.message
            turn.error_kind = outcome.error.kind
            outcome.error.turn_id = turn.id
            request.log.append(protocol.error(outcome.error))
        return outcome.status


def _call_message(call: ToolCall) -> dict[str, Any]:
    """A tool call as the assistant message that asked for it holds it (OpenAI's shape)."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class ToolRun:
    call: ToolCall
    tools: ToolBox
    log: TurnLog
    stop: StopSignal  # the turn's
    left_out: dict[str, Any] | None = None  # the `tool_calls_left_out` step: this call answers for them


class RunTools(AsyncParallelBatchNode):
    """Run the tool calls the model asked for (StreamChat's "tools"), all at once: the calls of one step
    are independent. Each shows as a `tool_call` step when it starts and a `tool_result` step when it
    ends; their results join the prompt as tool messages, and the flow goes back to StreamChat. A stop
    cancels the calls running (MCP servers are told) and ends the turn: the action is "stopped"."""

    async def prep_async(self, shared: dict[str, Any]) -> list[ToolRun]:
        turn: Turn = shared["turn"]
        tools: ToolBox = shared["tools"]
        admitted = tools.admit(shared["tool_calls"])  # a step's calls are capped; ids made unique
        runs = [ToolRun(call, tools, shared["log"], turn.stop) for call in admitted.calls]
        if admitted.left_out is not None:
            runs.append(ToolRun(admitted.left_out, tools, shared["log"], turn.stop, admitted.step()))
        return runs

    async def exec_async(self, run: ToolRun) -> CallOutcome:
        # The steps are shown as the calls happen, like StreamChat's chunks: this node is never retried
        # (max_retries 1), and ToolBox.run turns every failure into an error result, so none shows twice.
        name = run.tools.name_of(run.call)
        if run.stop.is_set():
            return CallOutcome(run.call, name, error="Stopped.", stopped=True)  # never started: not shown
        if run.left_out is not None:  # not run: its error result speaks for every call left out
            run.log.append_step("RunTools", "tool_calls_left_out", run.left_out)
            return CallOutcome(run.call, name, error=run.left_out["error"])
        run.log.append_step(
            "RunTools", "tool_call", {"id": run.call.id, "name": name, "arguments": shown_arguments(run.call)}
        )
        outcome = await run.tools.run(run.call, run.stop)
        run.log.append_step("RunTools", "tool_result", outcome.step())
        return outcome

    async def post_async(self, shared: dict[str, Any], runs: list[ToolRun], outcomes: list[CallOutcome]) -> str | None:
        # StreamChat's message asked for every call: the model reads it back with the calls answered
        # only (those left out after the first are dropped), under the ids they ran with.
        *before, asked = shared["prompt"]
        asked = {**asked, "tool_calls": [_call_message(outcome.call) for outcome in outcomes]}
        shared["prompt"] = [*before, asked, *(outcome.message() for outcome in outcomes)]
        shared["tool_calls"] = []
        shared["tool_steps"] += 1
        if shared["tools"].spent:  # the model answers next without tools
            shared["tool_steps"] = max(shared["tool_steps"], shared["settings"].max_tool_steps)
        turn: Turn = shared["turn"]
        if turn.stop.is_set():
            turn.reply_so_far().status = "stopped"  # its stats are those of the steps before
            return "stopped"
        return None  # back to the model, with the results


NOT_SAVED_YET = (
    "The database has not saved this reply yet (it does not answer). The reply is kept and will be saved "
    "when the database answers."
)


class SaveReply(AsyncNode):
    """Record the reply in the history and the database, however it ended (the user message was
    stored with the turn's start: a turn is recorded whole or as failed, never half). A turn that
    another replica took over is recorded as that replica stored it, and not written again."""

    async def prep_async(self, shared: dict[str, Any]) -> Turn:
        return shared["turn"]

    async def post_async(self, shared: dict[str, Any], turn: Turn, _: None) -> None:
        conversation: Conversation = shared["conversation"]
        if turn.failure is not None:
            return  # it lost Redis, or was taken over: run_turn records it as failed (or as taken over)
        # With replicas, another replica may have ended this turn while this one was paused, and stored
        # it as its sockets saw it: then this replica keeps that, and writes nothing over it.
        if not await shared["log"].confirm():
            conversation.add_reply(turn.reply_taken_over())
            return
        reply = turn.reply_so_far()
        conversation.add_reply(reply)
        try:
            await save_reply(shared["store"], conversation.id, reply)
        except StorageError as error:
            # The reply stays in the history, and the store writes it when the database recovers.
            error.message += " The reply is kept and will be saved when the database works again."
            error.turn_id = turn.id
            reply.status, reply.error = "error", reply.error or error.message
            shared["log"].append(protocol.error(error))
        except TimeoutError:
            shared["log"].append(protocol.error(StorageError(NOT_SAVED_YET, turn.id)))


# ---- indexing a document: the flow's nodes (flow.create_indexing_flow) --------------------------------


@dataclass
class ChunkRequest:
    jobs: Jobs
    owner: str
    pages: list[Page]


class ChunkDocument(AsyncNode):
    """Cut the document's pages into passages of a few sentences, each on one page: in a job worker, as
    the time it takes is the user's file's to set."""

    async def prep_async(self, shared: dict[str, Any]) -> ChunkRequest:
        return ChunkRequest(shared["jobs"], shared["document"].owner, shared["pages"])

    async def exec_async(self, request: ChunkRequest) -> list[Chunk]:
        return await request.jobs.run(request.owner, chunk_pages, request.pages)

    async def post_async(self, shared: dict[str, Any], request: ChunkRequest, chunks: list[Chunk]) -> None:
        shared["chunks"] = chunks
        shared["report"](0.01)


@dataclass
class EmbedRequest:
    embedder: Embedder
    texts: list[str]
    report: Callable[[float], None]


EMBED_BATCH = 16  # passages a call: the progress moves every few tenths of a second


class EmbedChunks(AsyncNode):
    """A vector for each passage, in batches, telling how far it went after each batch (a level: a
    retry that repeats a batch tells the same level again, and shows nothing twice)."""

    async def prep_async(self, shared: dict[str, Any]) -> EmbedRequest:
        return EmbedRequest(shared["embedder"], [chunk.text for chunk in shared["chunks"]], shared["report"])

    async def exec_async(self, request: EmbedRequest) -> np.ndarray:
        batches = []
        for start in range(0, len(request.texts), EMBED_BATCH):
            batches.append(await request.embedder.embed(request.texts[start : start + EMBED_BATCH]))
            request.report(0.01 + 0.95 * min(start + EMBED_BATCH, len(request.texts)) / len(request.texts))
        return np.concatenate(batches)

    async def post_async(self, shared: dict[str, Any], request: EmbedRequest, vectors: np.ndarray) -> None:
        shared["vectors"] = vectors


STORE_BATCH = 500  # passages a write: a big document does not hold the database's writer long


class StoreChunks(AsyncNode):
    """Store the passages with their vectors, then mark the document ready: until then retrieval does
    not see them, so a document cut short is never half-searched."""

    async def prep_async(self, shared: dict[str, Any]) -> tuple[list[Chunk], np.ndarray]:
        return shared["chunks"], shared["vectors"]

    async def exec_async(self, inputs: tuple[list[Chunk], np.ndarray]) -> list[tuple[int, int | None, str, bytes]]:
        chunks, vectors = inputs
        return [
            (seq, chunk.page, chunk.text, to_bytes(vector))
            for seq, (chunk, vector) in enumerate(zip(chunks, vectors, strict=True))
        ]

    async def post_async(
        self,
        shared: dict[str, Any],
        inputs: tuple[list[Chunk], np.ndarray],
        rows: list[tuple[int, int | None, str, bytes]],
    ) -> None:
        store: Store = shared["store"]
        document: DocumentRecord = shared["document"]
        # Each write lands only while the document is still indexing: one refused (removed meanwhile, or
        # marked failed by another replica, which deleted the passages written so far) stops here.
        for start in range(0, len(rows), STORE_BATCH):
            if not await store.add_chunks(document, rows[start : start + STORE_BATCH]):
                raise NotIndexing(document.id)
        document.status, document.progress, document.chunks = "ready", 1.0, len(rows)
        if not await store.finish_document(document):
            raise NotIndexing(document.id)
