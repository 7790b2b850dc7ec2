"""The memory flow's helpers: the durable facts about the user that their message holds, asked of the model
in one short request; which remembered facts a question recalls, and which proposed ones are new, by meaning
(the vectors of utils/embeddings, as documents'); and the prompt that carries the recalled ones."""

import re

import numpy as np

from utils.llm_stream import ChatProvider, StopSignal, StreamRequest, stream_llm

ASK = (
    "You keep a short memory of durable facts about the user for later conversations: their preferences, "
    'their work and projects, their circumstances (for example "Prefers metric units", "Works on project '
    "Zephyr\"). List the facts of this kind that the user's message below states about them, at most {most}, "
    'each a short sentence on its own line starting with "- ". Leave out what they ask about, what holds only '
    "for now, and anything about the assistant. If the message states none, answer NONE."
)
# One example of each answer: a small model (the embedded one) keeps to the form only when shown it.
EXAMPLES = [
    {"role": "user", "content": "I live in Oslo and I'm learning the cello. What is a good first piece?"},
    {"role": "assistant", "content": "- Lives in Oslo\n- Is learning the cello"},
    {"role": "user", "content": "What is the capital of Peru?"},
    {"role": "assistant", "content": "NONE"},
]
MOST_PROPOSED = 3  # facts a message adds at most
PROPOSAL_TOKENS = 120
SHOWN_CHARACTERS = 2000  # of the user's message: durable facts are said early, and the request stays short
FACT_CHARACTERS = 300  # a fact is a short sentence: a longer line is not one
MOST_RECALLED = 5
# How alike (cosine) a fact and a question must be for the fact to be recalled. all-MiniLM-L6-v2 gives a fact
# that bears on a question 0.2 to 0.7 ("Which units should you use?" and "Prefers metric units": 0.65), and
# unrelated pairs mostly under 0.15; a fact only loosely related may be missed.
LEAST_ALIKE = 0.2
SAME_MEANING = 0.9  # a proposed fact this alike to a known one says it again ("named" or "called": 0.98)
BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
QUOTES = "\"'`“”‘’"


def facts_of(text: str, most: int = MOST_PROPOSED) -> list[str]:
    """The facts of a model's answer: its bulleted lines, without the bullet, markdown or quotes, once each.
    A line that is no bullet (a preamble, NONE, a model that ignored the format), that asks something, is one
    word, has no letter, or is longer than a fact, is not one: a model that answers poorly adds little."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        if (bullet := BULLET.match(line)) is None:
            continue
        fact = " ".join(line[bullet.end() :].replace("**", "").split())
        if len(fact) > 1 and fact[0] in QUOTES and fact[-1] in QUOTES:
            fact = fact[1:-1].strip()  # the whole fact quoted
        if fact.upper().startswith("NONE") or fact.endswith("?") or len(fact) > FACT_CHARACTERS:
            continue
        if len(fact.split()) > 1 and any(char.isalpha() for char in fact):  # a word alone says nothing of them
            facts.setdefault(fact.casefold(), fact)
    return list(facts.values())[:most]


async def propose_facts(provider: ChatProvider, model: str, message: str, stop: StopSignal) -> list[str]:
    """Up to MOST_PROPOSED durable facts about the user that `message` (theirs) states; none if it states none,
    or the model gave none in the form asked (a small model may not)."""
    messages = [
        {"role": "system", "content": ASK.format(most=MOST_PROPOSED)},
        *EXAMPLES,
        {"role": "user", "content": message[:SHOWN_CHARACTERS]},
    ]
    pieces: list[str] = []

    def keep(text: str, _: str | None) -> None:
        pieces.append(text)

    result = await stream_llm(StreamRequest(provider, messages, model, PROPOSAL_TOKENS, keep, stop))
    return [] if result.stopped else facts_of("".join(pieces))


def recalled(
    question: np.ndarray, facts: np.ndarray, most: int = MOST_RECALLED, least: float = LEAST_ALIKE
) -> list[int]:
    """The rows of `facts` (L2-normalised vectors, as `question`) that bear on the question, most alike first."""
    if len(facts) == 0:
        return []
    alike = facts @ question.reshape(-1)
    return [int(row) for row in np.argsort(-alike)[:most] if alike[row] >= least]


def new_facts(texts: list[str], vectors: np.ndarray, known_texts: list[str], known: np.ndarray) -> list[int]:
    """Which proposed facts (`texts`, their `vectors`) are new: neither the words nor nearly the meaning of a
    known fact, nor of a proposed one before them."""
    seen_texts = {text.casefold() for text in known_texts}
    seen = list(known)
    fresh: list[int] = []
    for index, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
        if text.casefold() in seen_texts or any(float(vector @ other) >= SAME_MEANING for other in seen):
            continue
        fresh.append(index)
        seen_texts.add(text.casefold())
        seen.append(vector)
    return fresh


def with_facts(system_prompt: str, facts: list[str]) -> str:
    """The system prompt, followed by the facts remembered about the user that the question recalled."""
    remembered = "\n".join(f"- {fact}" for fact in facts)
    guide = "What you remember about the user from earlier conversations (use it where it helps):"
    return f"{system_prompt}\n\n{guide}\n{remembered}".lstrip()
