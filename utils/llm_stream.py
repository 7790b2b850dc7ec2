"""Stream one reply from a chat provider, handing each piece of text to a callback as it arrives."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from pocketchat.errors import ProviderError
from utils.clean import clean_usage, valid_text

# One chunk of an OpenAI chat completion stream, as JSON: {"choices": [{"delta": {...},
# "finish_reason": ...}], "usage": {...} | None, ...}.
Chunk = dict[str, Any]


@dataclass(frozen=True)
class ToolOffer:
    """The tools a request offers the model, as OpenAI declares them (`{"type": "function", "function":
    {name, description, parameters}}`); `choice` "none" makes it answer without calling any."""

    tools: list[dict[str, Any]]
    choice: str = "auto"


# What a request asks of the sampling beyond the provider's defaults: `temperature` and `top_p`, by
# their OpenAI names (llama-cpp-python takes the same ones); a name left out is the provider's default.
Sampling = dict[str, float]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: `arguments` is the JSON text it wrote, not parsed (it may be invalid)."""

    id: str
    name: str
    arguments: str


class ChatProvider(Protocol):
    """What the chat node needs of a model: a stream of OpenAI-shaped chunks, whoever produces it."""

    kind: str

    def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
        tools: ToolOffer | None = None,
        sampling: Sampling | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]: ...

    def supports_tools(self, model: str) -> bool:
        """Whether `model` can be offered tools (OpenAI tool calls); the embedded model cannot."""

    def usage_source(self, model: str) -> str:
        """Where the usage at the end of `model`'s streams comes from: "provider" (sent by it) or
        "counted" (counted with the model's tokenizer)."""

    async def warm_up(self) -> None:
        """Get ready for the first turn (load weights); called once at start-up, in the background."""

    async def default_model(self) -> str: ...

    async def list_models(self) -> list[str]: ...

    def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
Choice = tuple[str, str | None, str | None, list[dict[str, Any]] | None]  # content, reasoning, finish, tool calls


def _read(chunk: Chunk) -> tuple[list[Choice], dict[str, int] | None]:
    """The (content, reasoning, finish_reason, tool call pieces) of each choice of a chunk, and its usage
    if it has one."""
    choices = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        # DeepSeek, vLLM and llama.cpp send reasoning_content; OpenRouter sends reasoning.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        content = delta.get("content") or ""
        if not isinstance(content, str) or not isinstance(reasoning, str | None):
            raise TypeError("content and reasoning must be text")
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise TypeError("tool_calls must be a list")
        choices.append((content, reasoning, choice.get("finish_reason"), tool_calls))
    # A usage that is no count of tokens (text, negative, absurd) is left out: the reply's is estimated.
    return choices, clean_usage(chunk.get("usage"), USAGE_KEYS)


class ToolCallParts:
    """The tool calls of a stream, put together from their pieces. OpenAI sends a call's id and name in
    its first piece and its arguments in many, each piece naming its call by `index`; some servers send
    a whole call in one piece, without an index, or without an id."""

    # Calls put together at most: a reply runs 128 in all (ToolBox), and one more says that more were asked.
    # Past it the stream is read no further: a model asking for thousands would hold the event loop.
    MOST = 129

    def __init__(self) -> None:
        self._calls: dict[int, tuple[list[str], list[str]]] = {}  # by index: ([id, name], the arguments' pieces)

    @property
    def full(self) -> bool:
        return len(self._calls) > self.MOST

    def feed(self, pieces: list[dict[str, Any]]) -> None:
        for piece in pieces:
            function = piece.get("function") or {}
            index = piece.get("index")
            if not isinstance(index, int):  # a new call if it names itself, else more of the last one
                starts = piece.get("id") or function.get("name") or not self._calls
                index = max(self._calls, default=-1) + 1 if starts else max(self._calls)
            names, arguments = self._calls.setdefault(index, (["", ""], []))
            for slot, value in ((0, piece.get("id")), (1, function.get("name")), (2, function.get("arguments"))):
                if value is not None and not isinstance(value, str):
                    raise TypeError("a tool call's id, name and arguments must be text")
                if value and slot == 2:
                    arguments.append(value)  # joined once at the end: a long argument in many pieces
                elif value:
                    names[slot] = value  # an id or a name is sent whole, once (some servers repeat it)

    def calls(self) -> list[ToolCall]:
        # Text valid Unicode (see UnicodeRepair: JSON may escape a lone surrogate), for the socket and the
        # database. Ids as the provider sent them, which may repeat: RunTools makes them unique in the turn
        # (ToolBox.admit) before anything pairs a result with its call.
        return [
            ToolCall(
                valid_text(call_id) or f"call_{secrets.token_hex(6)}",
                valid_text(name),
                valid_text("".join(arguments)) or "{}",
            )
            for _, ((call_id, name), arguments) in sorted(self._calls.items())[: self.MOST]
            if name
        ]


class UnicodeRepair:
    """Provider text as valid Unicode. Some providers send a character outside the BMP as two JSON
    escapes split across chunks (`"\\ud83d"`, then `"\\ude00"`): the halves are joined again, and a
    surrogate with no partner becomes U+FFFD. Nothing with a lone surrogate can be sent or stored, nor
    a NUL in PostgreSQL: one is dropped."""

    def __init__(self) -> None:
        self._held = ""  # a high surrogate that may be the first half of a pair

    def feed(self, text: str) -> str:
        text, self._held = self._held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._held = text[:-1], text[-1]
        return valid_text(text)

    def flush(self) -> str:
        """What is held back when the stream ends (a high surrogate alone: U+FFFD)."""
        text, self._held = valid_text(self._held), ""
        return text


class StopSignal(asyncio.Event):
    """A turn's stop: an asyncio.Event that also calls, at once, what waits on it with `on_set`. A read
    in progress is cancelled from there, with no task of its own waiting on the Event (such a task per
    turn was about 4% of the event loop's samples in a burst of turns)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], object]) -> None:
        """Call `callback` when the stop is set (it is not yet), unless `off` takes it back first. It
        runs inside `set()`, in the task that sets it, and must not raise."""
        self._callbacks.append(callback)

    def off(self, callback: Callable[[], object]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)


@dataclass
class StreamResult:
    stopped: bool
    finish_reason: str | None
    usage: dict[str, int] | None
    first_chunk_at: float | None
    tool_calls: list[ToolCall] = field(default_factory=list)  # what the model asked to call, if anything


@dataclass
class StreamRequest:
    """One request to the model, and where its reply goes."""

    provider: ChatProvider
    messages: list[dict[str, Any]]
    model: str
    max_tokens: int | None
    on_chunk: Callable[[str, str | None], object]  # each piece of the reply: (content, reasoning)
    stop: StopSignal  # the turn's: a stop ends the read at once
    on_queued: Callable[[int], object] | None = None  # the provider must wait for earlier requests first
    tools: ToolOffer | None = None  # the tools offered; the calls the model makes are returned, not sent on
    sampling: Sampling | None = None  # overrides the provider's defaults (the conversation's temperature, top_p)


async def stream_llm(request: StreamRequest) -> StreamResult:
    """Stream a reply into `request.on_chunk(content, reasoning)` until it ends or `request.stop` is set.

    `on_queued(position)` is called if the provider must wait for earlier requests first. The tool
    calls the model makes (when `tools` offers some) are put together and returned, not sent on.
    A stop cancels the read in progress, which closes the upstream response at once. A stream
    that ends without a finish reason was cut short and raises ProviderError.
    """
    provider, stop, on_chunk = request.provider, request.stop, request.on_chunk
    result = StreamResult(stopped=False, finish_reason=None, usage=None, first_chunk_at=None)
    content_text, reasoning_text = UnicodeRepair(), UnicodeRepair()
    tool_calls = ToolCallParts()

    def emit(content: str, reasoning: str | None) -> None:
        if content or reasoning:
            if result.first_chunk_at is None:
                result.first_chunk_at = time.monotonic()
            on_chunk(content, reasoning or None)

    async def consume() -> None:
        # `tools` and `sampling` only when there are some: a provider written before them still works.
        offer: dict[str, Any] = {"tools": request.tools} if request.tools is not None else {}
        if request.sampling:
            offer["sampling"] = request.sampling
        opened = provider.open_stream(request.messages, request.model, request.max_tokens, request.on_queued, **offer)
        async with opened as chunks:
            async for chunk in chunks:
                try:
                    choices, usage = _read(chunk)
                    for *_, calls in choices:
                        if calls:
                            tool_calls.feed(calls)
                    if tool_calls.full:
                        result.finish_reason = "tool_calls"  # read no further: what more it asks is dropped
                        break
                except (AttributeError, TypeError, ValueError) as error:
                    unreadable = f"The provider sent a chunk PocketChat cannot read: {chunk!r:.200}"
                    raise ProviderError(unreadable, kind="unreadable") from error
                for content, reasoning, finish_reason, _ in choices:
                    emit(content_text.feed(content), reasoning_text.feed(reasoning) if reasoning else None)
                    if finish_reason:
                        result.finish_reason = finish_reason
                if usage is not None:
                    result.usage = usage
        emit(content_text.flush(), reasoning_text.flush())
        result.tool_calls = tool_calls.calls()

    if stop.is_set():
        result.stopped = True
        return result
    # The read runs in this task, at once (a task of its own would start a turn of the event loop
    # later: under a burst of turns, each such hop delays the first chunk). A stop cancels this task,
    # as asyncio.timeout does: a cancellation from elsewhere still propagates.
    task = asyncio.current_task()
    assert task is not None
    reading, stopped_it = True, False
    cancelling = task.cancelling()  # cancellations asked of the task before: never taken for a stop

    def cancel_read() -> None:
        nonlocal stopped_it
        if not reading:
            return
        if asyncio.current_task() is task:
            # Set from within the read (by `on_chunk`): a cancellation asked of the running task would
            # land at its next await, perhaps after the read. From the loop, once the read yields.
            asyncio.get_running_loop().call_soon(cancel_read)
            return
        stopped_it = True
        task.cancel()

    stop.on_set(cancel_read)
    try:
        await consume()  # leaving open_stream's block, as a stop does, closes the HTTP response
    except asyncio.CancelledError:
        if not stopped_it or task.uncancel() > cancelling:
            raise
        result.stopped = True
        return result
    except BaseException:
        if stopped_it:  # the read failed as the stop came: its failure stands, the stop's cancellation goes
            task.uncancel()
        raise
    finally:
        reading = False  # set from here on, the stop no longer cancels this task
        stop.off(cancel_read)
    if stopped_it:  # the provider's stream took the stop's cancellation and ended without raising it
        task.uncancel()
        result.stopped = True
        return result
    if result.finish_reason is None:
        raise ProviderError("The provider's stream ended before the reply was finished.", kind="stream_cut")
    return result
