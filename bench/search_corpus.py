"""The synthetic history bench/search.py searches: conversations and messages of several users, words drawn
from a Zipf distribution over a vocabulary of common English words and 40,000 made-up ones, the same for
both databases (one seed); and the queries a user would type to find their own messages."""

import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from pocketchat.records import new_id
from pocketchat.search import PREFIX_MIN
from utils.retrieval import STOPWORDS

# The head of the vocabulary: everyday English, and words a chat about work holds.
COMMON_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or had by
word but what some we can out other were all there when up use your how said an each she which do their time
if will way about many then them write would like so these her long make thing see him two has look more day
could go come did number sound no most people my over know water than call first who may down side been now
find any new work part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small end put home
read hand port large spell add even land here must big high such follow act why ask men change went light kind
off need house picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease paper group
always music those both mark often letter until mile river car feet care second book carry took science eat
room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main python
docker kubernetes database query index server error function class deploy memory thread async request response
json token model test cache queue deadline budget recipe garden travel invoice contract"""
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["ar", "en", "or", "is", "an", "el", "on"]


class Corpus:
    """The synthetic conversations and messages, the same for both databases (one seed)."""

    def __init__(self, conversations: int, messages: int, users: int, seed: int = 7) -> None:
        self.random = random.Random(seed)
        rng = np.random.default_rng(seed)
        rare: set[str] = set()
        while len(rare) < 40_000:
            rare.add("".join(self.random.choice(SYLLABLES) for _ in range(self.random.randint(2, 4))))
        self.vocabulary = np.array(COMMON_WORDS.split() + sorted(rare))
        weights = 1 / np.arange(1, len(self.vocabulary) + 1) ** 1.07
        self.users = [f"user{n}" for n in range(users)]
        self.conversation_ids = [new_id() for _ in range(conversations)]
        self.per_conversation = messages // conversations
        lengths = np.where(np.arange(messages) % 2 == 0, rng.integers(5, 36, messages), rng.integers(30, 131, messages))
        words = rng.choice(len(self.vocabulary), size=int(lengths.sum()), p=weights / weights.sum())
        ends = np.cumsum(lengths)
        vocabulary = self.vocabulary.tolist()
        self.texts = [
            " ".join([vocabulary[word] for word in words[end - n : end].tolist()])
            for n, end in zip(lengths.tolist(), ends.tolist(), strict=True)
        ]

    def owner(self, conversation: int) -> str:
        return self.users[conversation % len(self.users)]

    def conversations(self) -> Iterator[tuple[Any, ...]]:
        """(id, owner, title, model, system_prompt, created_at, updated_at)."""
        for n, conversation_id in enumerate(self.conversation_ids):
            title = " ".join(self.texts[n * self.per_conversation].split()[:6])
            yield conversation_id, self.owner(n), title, "bench", "", float(n), float(n)

    def messages(self) -> Iterator[tuple[Any, ...]]:
        """(id, conversation_id, role, content, status, created_at)."""
        for n, text in enumerate(self.texts):
            conversation = min(n // self.per_conversation, len(self.conversation_ids) - 1)
            role = "user" if n % 2 == 0 else "assistant"
            yield new_id(), self.conversation_ids[conversation], role, text, "complete", float(n)

    def queries(self, user: str, count: int) -> list[str]:
        """Words of the user's own messages, as someone looking for them would type them."""
        own = [n for n in range(len(self.conversation_ids)) if self.owner(n) == user]
        queries = []
        while len(queries) < count:
            conversation = self.random.choice(own)
            text = self.texts[conversation * self.per_conversation + self.random.randrange(self.per_conversation)]
            words = [word for word in set(text.split()) if word not in STOPWORDS]
            if not words:
                continue
            picked = self.random.sample(sorted(words), min(len(words), self.random.randint(1, 3)))
            if self.random.random() < 1 / 3 and len(picked[-1]) > PREFIX_MIN:
                picked[-1] = picked[-1][: self.random.randint(PREFIX_MIN, min(PREFIX_MIN + 2, len(picked[-1])))]
                queries.append(" ".join(picked))
            else:
                queries.append(" ".join(picked) + " ")  # a finished word: matched whole
        return queries
