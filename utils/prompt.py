"""The prompt of a turn: system prompt, the context earlier nodes found, and as much recent history
as fits the context budget, with the images of recent user messages for a model that can see them."""

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pocketchat.records import Message

# Chat templates add a few tokens of framing to every message.
PER_MESSAGE_TOKENS = 4
# What an image costs, whatever its size: about what OpenAI charges for a 1024x1024 image in detail
# (765 tokens), where other providers charge more or less. Without a tokenizer, an estimate like the
# four bytes a token of text.
IMAGE_TOKENS = 800
IMAGE_SHARE = 2  # older images take at most 1/2 of the context budget: the rest is for text

# A message of the prompt: {"role", "content"}, the content text, or for a user message with images
# OpenAI's content parts ([{"type": "text", ...}, {"type": "image_url", ...}]).
PromptMessage = dict[str, Any]


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


def images_to_send(history: list[Message], budget: int) -> list[str]:
    """The ids of the images worth reading for a model that sees them, newest first: all those of the
    newest user message (the user sent them for this reply), then older ones while they take at most
    1/IMAGE_SHARE of the budget; the oldest are dropped first."""
    users = [message for message in reversed(history) if message.role == "user"]
    if not users:
        return []
    chosen = [image.id for image in users[0].images]
    room = budget // IMAGE_SHARE
    for message in users[1:]:
        if (len(chosen) + len(message.images)) * IMAGE_TOKENS > room:
            break  # and no older one either: never an older image where a newer one was left out
        chosen += [image.id for image in message.images]
    return chosen


def data_url(type: str, data: bytes) -> str:
    """An image as OpenAI's image parts carry it inline: data:image/png;base64,...."""
    return f"data:{type};base64,{base64.b64encode(data).decode()}"


def content_tokens(content: str | list[dict[str, Any]]) -> int:
    """The estimated tokens of a prompt message's content: text, or content parts."""
    if isinstance(content, str):
        return estimate_tokens(content)
    return sum(estimate_tokens(part["text"]) if part["type"] == "text" else IMAGE_TOKENS for part in content)


def build_prompt(
    system_prompt: str,
    history: list[Message],
    budget: int,
    context: list[Snippet] | None = None,
    images: Mapping[str, str] | None = None,
) -> list[PromptMessage]:
    """System prompt (with the context) + the newest messages that fit `budget` tokens, dropping the
    oldest first. `images` (id: data URL) are the images to send: a user message that has some of them
    carries them as image parts, each counted as IMAGE_TOKENS; a model that cannot see images gets none.

    The newest message (the user's question) is always kept, and replies that carry no text
    (a failed turn) are left out, since they tell the model nothing.
    """
    images = images or {}
    system = with_context(system_prompt, context or [])
    used = estimate_tokens(system) + PER_MESSAGE_TOKENS
    kept: list[PromptMessage] = []
    for message in reversed(history):
        prompt_message = _prompt_message(message, images)
        if not prompt_message["content"]:
            continue
        cost = content_tokens(prompt_message["content"]) + PER_MESSAGE_TOKENS
        if kept and used + cost > budget and message.content and message.images:
            # Its text may fit where its images do not: then it goes without them.
            prompt_message = {"role": message.role, "content": message.content}
            cost = content_tokens(message.content) + PER_MESSAGE_TOKENS
        if kept and used + cost > budget:
            break
        used += cost
        kept.append(prompt_message)
    kept.reverse()
    # A prompt that starts with an assistant message confuses some chat templates.
    while len(kept) > 1 and kept[0]["role"] == "assistant":
        kept.pop(0)
    return [{"role": "system", "content": system}, *kept]


def _prompt_message(message: Message, images: Mapping[str, str]) -> PromptMessage:
    """A message as the prompt carries it: its text, or its text and those of its images to send as parts."""
    urls = [images[image.id] for image in message.images if image.id in images]
    if not urls:
        return {"role": message.role, "content": message.content}
    text = [{"type": "text", "text": message.content}] if message.content else []
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"role": message.role, "content": [*text, *parts]}
