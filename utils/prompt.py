"""The prompt of a turn: system prompt, the context earlier nodes found, and as much recent history
as fits the context budget."""

from dataclasses import dataclass

from pocketchat.records import Message

# Chat templates add a few tokens of framing to every message.
PER_MESSAGE_TOKENS = 4


@dataclass(frozen=True)
class Snippet:
    """A piece of context for the reply (a passage of a document, a search result), with where it came from."""

    text: str
    source: str  # what the reply cites it as: a file name, a page, a URL


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four bytes of UTF-8 per token for English and code."""
    return (len(text.encode()) + 3) // 4


def with_context(system_prompt: str, context: list[Snippet]) -> str:
    """The system prompt, followed by the numbered snippets the reply may cite as [1], [2]..."""
    if not context:
        return system_prompt
    sources = "\n\n".join(f"[{number}] ({snippet.source})\n{snippet.text}" for number, snippet in enumerate(context, 1))
    guide = "Use these sources where they help, and cite them by number, like [1]:"
    return f"{system_prompt}\n\n{guide}\n\n{sources}".lstrip()


def build_prompt(
    system_prompt: str, history: list[Message], budget: int, context: list[Snippet] | None = None
) -> list[dict[str, str]]:
    """System prompt (with the context) + the newest messages that fit `budget` tokens, dropping the
    oldest first.

    The newest message (the user's question) is always kept, and replies that carry no text
    (a failed turn) are left out, since they tell the model nothing.
    """
    system = with_context(system_prompt, context or [])
    used = estimate_tokens(system) + PER_MESSAGE_TOKENS
    kept: list[dict[str, str]] = []
    for message in reversed([m for m in history if m.content]):
        cost = estimate_tokens(message.content) + PER_MESSAGE_TOKENS
        if kept and used + cost > budget:
            break
        used += cost
        kept.append({"role": message.role, "content": message.content})
    kept.reverse()
    # A prompt that starts with an assistant message confuses some chat templates.
    while len(kept) > 1 and kept[0]["role"] == "assistant":
        kept.pop(0)
    return [{"role": "system", "content": system}, *kept]
