"""What a reply's model steps add up to: with tools, one reply is several requests to the model (each
step asks for tool calls, or answers), and its usage and timings are their sums."""

import time
from dataclasses import dataclass, field
from typing import Any

from pocketchat.records import Message
from utils.llm_stream import ChatProvider, StreamResult
from utils.prompt import PromptMessage, content_tokens, estimate_tokens

SOURCES = ("estimated", "counted", "provider")  # from the least exact: a sum is as exact as its worst part


def message_tokens(message: PromptMessage) -> int:
    """The estimated tokens of a prompt message: its content (text, or text and image parts), and the
    arguments of the tool calls an assistant message holds."""
    calls = "".join(call["function"]["arguments"] for call in message.get("tool_calls") or ())
    return content_tokens(message.get("content") or "") + estimate_tokens(calls)


@dataclass
class TurnUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sources: set[str] = field(default_factory=set)
    first_chunk_at: float | None = None  # the turn's first chunk, of whichever step sent it
    streamed_tokens: int = 0  # of the steps that streamed text, and for how long they streamed it
    streamed_seconds: float = 0.0
    content_seen: int = 0  # characters of the reply's content and reasoning that earlier steps wrote
    reasoning_seen: int = 0

    def add(
        self,
        result: StreamResult | None,
        source: str,
        messages: list[PromptMessage],
        content: str,
        reasoning: str,
    ) -> str:
        """Count one step: its result (None if it failed), where the provider's usage comes from, the
        prompt it sent, and the reply's whole content and reasoning so far. Returns the step's content."""
        step_content, step_reasoning = content[self.content_seen :], reasoning[self.reasoning_seen :]
        self.content_seen, self.reasoning_seen = len(content), len(reasoning)
        if result is not None and result.usage is not None:
            prompt, completion = result.usage["prompt_tokens"], result.usage["completion_tokens"]
            self.sources.add(source)
        else:
            calls = " ".join(call.arguments for call in result.tool_calls) if result else ""
            prompt = sum(message_tokens(message) for message in messages)
            completion = estimate_tokens(step_content + step_reasoning + calls)
            self.sources.add("estimated")
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        if result is not None and result.first_chunk_at is not None:
            self.first_chunk_at = self.first_chunk_at or result.first_chunk_at
            self.streamed_tokens += completion
            self.streamed_seconds += time.monotonic() - result.first_chunk_at
        return step_content

    def count_step(
        self,
        result: StreamResult | None,
        provider: ChatProvider,
        model: str,
        messages: list[PromptMessage],
        reply: Message,
        started_at: float,
    ) -> str:
        """Count one model step of `reply` (`result`: None if it failed), and write the reply's stats,
        summed over its steps so far, into its meta. Returns what the step said."""
        source = provider.usage_source(model) if model else "estimated"
        said = self.add(result, source, messages, reply.content, reply.reasoning)
        reply.meta.update(self.stats(model, started_at))
        return said

    def stats(self, model: str, started_at: float) -> dict[str, Any]:
        """The reply's model, usage (summed, with the least exact source), ttft and tokens/s."""
        source = next((name for name in SOURCES if name in self.sources), "estimated")
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "source": source,
        }
        stats: dict[str, Any] = {"model": model, "usage": usage, "ttft_ms": None, "tokens_per_second": None}
        if self.first_chunk_at is not None:
            stats["ttft_ms"] = round((self.first_chunk_at - started_at) * 1000)
        if self.streamed_seconds > 0:
            stats["tokens_per_second"] = round(self.streamed_tokens / self.streamed_seconds, 1)
        return stats
