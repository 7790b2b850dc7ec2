"""The prompt of a turn: system prompt plus as much recent history as fits the context budget."""

from utils.messages import Message

# Chat templates add a few tokens of framing to every message.
PER_MESSAGE_TOKENS = 4


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four bytes of UTF-8 per token for English and code."""
    return (len(text.encode()) + 3) // 4


def build_prompt(system_prompt: str, history: list[Message], budget: int) -> list[dict[str, str]]:
    """System prompt + the newest messages that fit `budget` tokens, dropping the oldest first.

    The newest message (the user's question) is always kept, and replies that carry no text
    (a failed turn) are left out, since they tell the model nothing.
    """
    used = estimate_tokens(system_prompt) + PER_MESSAGE_TOKENS
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
    return [{"role": "system", "content": system_prompt}, *kept]
