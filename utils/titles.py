"""A conversation's title in a few words, asked of its own model after the first reply (as the chat apps
people know name a conversation), in one short request."""

import re

from utils.llm_stream import ChatProvider, StopSignal, StreamRequest, stream_llm

ASK = (
    "Give this conversation a title of two to six words that says what it is about. "
    "Answer with the title alone: no quotes, no full stop."
)
SHOWN_CHARACTERS = 600  # of the first message and of the reply: what a title needs, and a short prompt
TITLE_TOKENS = 16
MOST_CHARACTERS = 60
# What small models put around a title: a label, quotes, markdown, a full stop.
LABEL = re.compile(r"^\s*(?:title\s*:|\*\*title:?\*\*)\s*", re.IGNORECASE)
WRAPPING = "\"'`*_#“”‘’«» .:"


def first_line_title(message: str) -> str | None:
    """A conversation's first title, while its model has not named it: its first message's start on one
    line (None for a message of images alone: the next with text names it)."""
    line = " ".join(message.split())
    return (line if len(line) <= MOST_CHARACTERS else line[: MOST_CHARACTERS - 1].rstrip() + "…") or None


def tidy_title(text: str) -> str | None:
    """The title in a model's answer: its first line without a label, quotes or markdown; None if that
    leaves nothing like a title (no letter, or more than a line's worth of words)."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    title = " ".join(LABEL.sub("", line).split()).strip(WRAPPING)
    if not any(char.isalpha() for char in title) or len(title.split()) > 10:
        return None
    return title if len(title) <= MOST_CHARACTERS else title[: MOST_CHARACTERS - 1].rstrip() + "…"


async def title_for(provider: ChatProvider, model: str, first_message: str, reply: str, stop: StopSignal) -> str | None:
    """A few words naming a conversation of `first_message` and its `reply`, or None if the model gave none."""
    conversation = f"User: {first_message[:SHOWN_CHARACTERS]}\n\nAssistant: {reply[:SHOWN_CHARACTERS]}"
    messages = [{"role": "system", "content": ASK}, {"role": "user", "content": conversation}]
    pieces: list[str] = []

    def keep(text: str, _: str | None) -> None:
        pieces.append(text)

    result = await stream_llm(StreamRequest(provider, messages, model, TITLE_TOKENS, keep, stop))
    return None if result.stopped else tidy_title("".join(pieces))
