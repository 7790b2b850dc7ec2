"""The nodes of a chat turn (a document's indexing has its own: indexing_nodes.py). Each reads the shared
store in `prep`, works in `exec`, writes in `post`.

Nodes never touch a socket: what the browser should see goes to `shared["log"]`, the turn's log,
which every attached socket follows. A node shows itself in the page with `log.append_step(...)`.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pocketflow import AsyncNode, AsyncParallelBatchNode

from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn
from pocketchat.errors import ProviderError, StorageError
from pocketchat.providers import sees_images
from pocketchat.records import Message, Passage, Status
from pocketchat.store import Store, save_reply
from pocketchat.tools import CallOutcome, ToolBox, safe_call, shown_arguments
from pocketchat.turn_log import TurnLog
from utils.clean import MESSAGE_CHARACTERS, clean_text
from utils.embeddings import Embedder
from utils.llm_stream import ChatProvider, StopSignal, StreamRequest, StreamResult, ToolCall, stream_llm
from utils.prompt import PromptMessage, Snippet, build_prompt, data_url, images_to_send
from utils.retrieval import VectorCache, passages_for
from utils.retry import Backoff
from utils.titles import first_line_title, title_for
from utils.tool_prompt import asking_for_tools, with_results
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
    none_ready: bool = False  # the documents were read, and none was ready or on its way
    waiting: list[str] = field(default_factory=list)  # the names of those still being indexed


PASSAGES = 5  # passages a reply gets, when its documents are too big to be given whole
WHOLE_SHARE = 2  # documents are given whole when they take at most 1/2 of the context budget


class RetrieveDocuments(AsyncNode):
    """When the conversation has documents, find the passages that best answer the user's message (or
    take a small document whole), put them in `shared["context"]` for BuildPrompt, and show them as a
    `sources` step. A conversation without documents costs one small read, no model loaded; and none
    once it is known to have none (`Conversation.knows_no_documents`)."""

    async def prep_async(self, shared: dict[str, Any]) -> RetrievalRequest:
        conversation: Conversation = shared["conversation"]
        library = shared["library"]
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
        waiting = [document.name for document in documents if document.status == "indexing"]
        if not ready:
            return Found([], none_ready=not waiting, waiting=waiting)
        passages = await passages_for(
            request.store, request.vectors, request.embedder, ready, request.owner, request.question, request.budget,
            PASSAGES,
        )  # fmt: skip
        return Found(passages, seconds=time.perf_counter() - started, waiting=waiting)

    async def exec_fallback_async(self, request: RetrievalRequest, exc: Exception) -> Found:
        # The reply goes on without its documents rather than failing; a status step says so.
        return Found([], f"The documents could not be searched ({exc}).")

    async def post_async(self, shared: dict[str, Any], request: RetrievalRequest, found: Found) -> None:
        if found.none_ready:
            # Unless a document frame came during the read: it may have missed that document.
            shared["conversation"].found_no_documents(request.told_before)
        if found.seconds is not None:
            shared["library"].metrics.retrieval.observe(found.seconds)
        if found.failure:
            shared["log"].append_step("RetrieveDocuments", "status", found.failure, shape="text")
        if found.waiting:
            # Said, not silent: the person would think the reply read them.
            names = ", ".join(f"“{name}”" for name in found.waiting)
            one = len(found.waiting) == 1
            said = (
                f"Not read yet: {names} {'is' if one else 'are'} still being indexed, so this reply does not use "
                f"{'it' if one else 'them'}. Ask again once {'it is' if one else 'they are'} ready."
            )
            shared["log"].append_step("RetrieveDocuments", "not_ready", said, shape="text")
        if not found.passages:
            return
        shared["context"].extend(Snippet(passage.text, passage.source) for passage in found.passages)
        sources = [
            {"source": p.source, "text": p.text, "document_id": p.document_id, "page": p.page} for p in found.passages
        ]
        shared["log"].append_step("RetrieveDocuments", "sources", sources)


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
    stream: StreamRequest  # what stream_llm sends; its model and tools are settled in exec
    tools: ToolBox | None  # the turn's tools: offered when the model supports them
    final: bool  # --max-tool-steps reached: the model answers without tools
    log: TurnLog
    start_seq: int  # chunks in the log before this step: a retry is safe while there are no more
    backoff: Backoff  # whether a failure is tried again, and after how long


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
        log: TurnLog = shared["log"]
        turn: Turn = shared["turn"]
        # The conversation's own settings win over the app's; what neither sets is the provider's default.
        sampling = dict(conversation.record.sampling)
        max_tokens = sampling.pop("max_tokens", None) or shared["settings"].max_tokens
        stream = StreamRequest(
            provider=shared["provider"],
            messages=shared["prompt"],
            model=conversation.record.model,
            max_tokens=int(max_tokens) if max_tokens else None,
            on_chunk=log.append_chunk,
            stop=turn.stop,
            on_queued=lambda position: log.append(protocol.queued(turn.id, position)),
            sampling=sampling,
        )
        final = shared["tool_steps"] >= shared["settings"].max_tool_steps
        return ChatRequest(stream, shared["tools"], final, log, log.seq, Backoff(self.wait))

    async def exec_async(self, request: ChatRequest) -> ChatOutcome:
        stream = request.stream
        try:
            # A conversation made while the provider was unreachable has no model yet.
            stream.model = stream.model or await stream.provider.default_model()
            # The embedded model has no tool calls: it is offered none.
            if request.tools is not None and stream.provider.supports_tools(stream.model):
                stream.tools = request.tools.offer(request.final)
            result = await stream_llm(stream)
        except ProviderError as error:
            # Raising lets PocketFlow try again after `self.wait`; tool calls are collected, not sent,
            # until the stream ends, so a step sent nothing while the log has no new chunk.
            if request.backoff.retry(error, sent_nothing=request.log.seq == request.start_seq):
                self.wait = request.backoff.wait  # this turn's copy of the node: the next turn starts afresh
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
        reply = turn.sync_reply()
        stream = request.stream
        usage: TurnUsage = shared["usage"]
        said = usage.count_step(outcome.result, stream.provider, stream.model, stream.messages, reply, turn.started_at)
        calls = [safe_call(call) for call in outcome.result.tool_calls] if outcome.result is not None else []
        if outcome.status == "complete" and calls and not request.final:
            shared["prompt"] = asking_for_tools(stream.messages, said, calls)  # RunTools adds the results
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
        calls = [outcome.call for outcome in outcomes]
        shared["prompt"] = with_results(shared["prompt"], calls, [outcome.message() for outcome in outcomes])
        shared["tool_calls"] = []
        shared["tool_steps"] += 1
        if shared["tools"].spent:  # the model answers next without tools
            shared["tool_steps"] = max(shared["tool_steps"], shared["settings"].max_tool_steps)
        turn: Turn = shared["turn"]
        if turn.stop.is_set():
            turn.sync_reply().status = "stopped"  # its stats are those of the steps before
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
        reply = turn.sync_reply()
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
