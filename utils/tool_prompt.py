"""The prompt of a reply that calls tools, in OpenAI's shape: what the model said and the calls it asked
for join the prompt as an assistant message, and each call's result as a tool message after it."""

from typing import Any

from utils.llm_stream import ToolCall
from utils.prompt import PromptMessage


def call_message(call: ToolCall) -> dict[str, Any]:
    """A tool call as the assistant message that asked for it holds it."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def asking_for_tools(prompt: list[PromptMessage], said: str, calls: list[ToolCall]) -> list[PromptMessage]:
    """`prompt`, then the model's step: what it said (if anything) and the calls it asked for."""
    asked = [call_message(call) for call in calls]
    return [*prompt, {"role": "assistant", "content": said or None, "tool_calls": asked}]


def with_results(
    prompt: list[PromptMessage], calls: list[ToolCall], results: list[PromptMessage]
) -> list[PromptMessage]:
    """`prompt`, whose last message asked for tool calls, with `calls` answered by `results` (their tool
    messages, in order). The asking message is read back with these calls only, under the ids they ran
    with: those it asked for and that were left out are dropped from it."""
    *before, asked = prompt
    return [*before, {**asked, "tool_calls": [call_message(call) for call in calls]}, *results]
