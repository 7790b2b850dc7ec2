"""The research flow's helpers: a plan of a few questions, asked of the model in one short request, and
what one question finds in the conversation's documents and in the user's earlier conversations."""

import re

from utils.llm_stream import ChatProvider, StopSignal, StreamRequest, stream_llm

ASK = (
    "Before answering, plan the research. List up to {most} short questions to look into, one per line, "
    "each on its own, most useful first. Write nothing else."
)
MOST_QUESTIONS = 4  # the step cap: a plan has this many questions at most, each one run of the loop
PLAN_TOKENS = 160
BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|#+)\s*")


def questions_of(text: str, most: int = MOST_QUESTIONS) -> list[str]:
    """The questions of a model's plan: its lines, without bullets, numbers or bold; those that ask, if some
    do (a model may say "Sure!" first), else every line with a word."""
    lines = [" ".join(BULLET.sub("", line).replace("**", "").split())[:300] for line in text.splitlines()]
    lines = [line for line in lines if any(char.isalpha() for char in line)]
    return ([line for line in lines if line.endswith("?")] or lines)[:most]


async def plan(provider: ChatProvider, model: str, question: str, stop: StopSignal) -> list[str]:
    """Up to MOST_QUESTIONS questions to look into before answering `question`; [question] if the model gave
    none (a small model may not)."""
    messages = [
        {"role": "system", "content": ASK.format(most=MOST_QUESTIONS)},
        {"role": "user", "content": question},
    ]
    pieces: list[str] = []

    def keep(text: str, _: str | None) -> None:
        pieces.append(text)

    result = await stream_llm(StreamRequest(provider, messages, model, PLAN_TOKENS, keep, stop))
    found = [] if result.stopped else questions_of("".join(pieces))
    return found or [" ".join(question.split())[:300]]
