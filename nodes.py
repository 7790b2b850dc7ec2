"""The nodes of a chat turn. Each reads the shared store in `prep`, works in `exec`, writes in `post`.

Nodes never touch a socket: what the browser should see goes to `shared["log"]`, the turn's log,
which every attached socket follows. A node shows itself in the page with `log.append_step(...)`.
"""

import time
from dataclasses import dataclass
from typing import Any

from pocketflow import AsyncNode

from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn
from pocketchat.errors import ProviderError, StorageError
from pocketchat.records import Message, Status
from pocketchat.store import save_reply
from pocketchat.turn_log import TurnLog
from utils.llm_stream import ChatProvider, StreamResult, stream_llm
from utils.prompt import Snippet, build_prompt, estimate_tokens


class TitleConversation(AsyncNode):
    """Name a conversation after its first user message, once."""

    async def prep_async(self, shared: dict[str, Any]) -> str | None:
        conversation: Conversation = shared["conversation"]
        return None if conversation.record.title else shared["turn"].user_message.content

    async def exec_async(self, first_message: str | None) -> str | None:
        if first_message is None:
            return None
        line = " ".join(first_message.split())
        return line if len(line) <= 60 else line[:59].rstrip() + "…"

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
class PromptInputs:
    system_prompt: str
    history: list[Message]
    context: list[Snippet]
    budget: int


class BuildPrompt(AsyncNode):
    """Shape what the model reads: the system prompt, what earlier nodes put in `shared["context"]`
    (numbered, with their sources, for the reply to cite), and as much recent history as fits."""

    async def prep_async(self, shared: dict[str, Any]) -> PromptInputs:
        conversation: Conversation = shared["conversation"]
        return PromptInputs(
            conversation.record.system_prompt,
            conversation.history,
            shared["context"],
            shared["settings"].context_budget,
        )

    async def exec_async(self, inputs: PromptInputs) -> list[dict[str, str]]:
        return build_prompt(inputs.system_prompt, inputs.history, inputs.budget, inputs.context)

    async def post_async(self, shared: dict[str, Any], inputs: PromptInputs, prompt: list[dict[str, str]]) -> None:
        shared["prompt"] = prompt


@dataclass
class ChatRequest:
    provider: ChatProvider
    messages: list[dict[str, str]]
    model: str
    max_tokens: int | None
    log: TurnLog
    turn: Turn
    failures: int = 0  # attempts that failed before the first chunk


@dataclass
class ChatOutcome:
    status: Status  # complete, stopped or error
    result: StreamResult | None = None
    error: ProviderError | None = None
    bug: Exception | None = None


class StreamChat(AsyncNode):
    """Stream the model's reply to `shared["prompt"]` into the log; the action says how it ended:
    "complete", "stopped" or "error"."""

    async def prep_async(self, shared: dict[str, Any]) -> ChatRequest:
        conversation: Conversation = shared["conversation"]
        return ChatRequest(
            provider=shared["provider"],
            messages=shared["prompt"],
            model=conversation.record.model,
            max_tokens=shared["settings"].max_tokens,
            log=shared["log"],
            turn=shared["turn"],
        )

    async def exec_async(self, request: ChatRequest) -> ChatOutcome:
        try:
            # A conversation made while the provider was unreachable has no model yet.
            request.model = request.model or await request.provider.default_model()
            result = await stream_llm(
                request.provider,
                request.messages,
                request.model,
                request.max_tokens,
                request.log.append_chunk,
                request.turn.stop,
                lambda position: request.log.append(protocol.queued(request.turn.id, position)),
            )
        except ProviderError as error:
            # Raising lets PocketFlow retry after `wait`, which is safe only while nothing was sent.
            if error.retryable and request.log.seq == 0:
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
        reply.status = outcome.status
        reply.meta.update(_reply_stats(request, outcome, reply.content + reply.reasoning, turn.started_at))
        if outcome.error is not None:
            reply.error = outcome.error.message
            turn.error_kind = outcome.error.kind
            outcome.error.turn_id = turn.id
            request.log.append(protocol.error(outcome.error))
        return outcome.status


def _reply_stats(request: ChatRequest, outcome: ChatOutcome, text: str, started_at: float) -> dict[str, Any]:
    """Model, usage (the provider's, else counted or estimated, and which), ttft and tokens/s of a reply."""
    result = outcome.result
    if result is not None and result.usage is not None:
        usage: dict[str, Any] = {**result.usage, "source": request.provider.usage_source(request.model)}
    else:
        prompt = sum(estimate_tokens(m["content"]) for m in request.messages)
        completion = estimate_tokens(text)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "source": "estimated",
        }
    stats: dict[str, Any] = {"model": request.model, "usage": usage, "ttft_ms": None, "tokens_per_second": None}
    if result is not None and result.first_chunk_at is not None:
        now = time.monotonic()
        stats["ttft_ms"] = round((result.first_chunk_at - started_at) * 1000)
        if now > result.first_chunk_at:
            stats["tokens_per_second"] = round(usage["completion_tokens"] / (now - result.first_chunk_at), 1)
    return stats


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
        # With replicas, another replica may have ended this turn while this one was paused, and stored
        # it as its sockets saw it: then this replica keeps that, and writes nothing over it.
        if not await shared["log"].confirm() or turn.fenced:
            conversation.history.append(turn.reply_taken_over())
            return
        reply = turn.reply_so_far()
        conversation.history.append(reply)
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
